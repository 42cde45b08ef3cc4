"""Run checkpoints: last.ckpt every `checkpoint_every` iterations and at the end, best.ckpt on a
new best eval; written to a temporary file and renamed, so a kill never leaves half a checkpoint.
Temporary files a killed run left behind are removed when the run (re)starts.

What a checkpoint holds: both models' weights (Lightning's state_dict), both AdamW optimizers' state
(two moments per parameter, in the parameter's dtype, and a step count), the schedulers, the RNG
states and the run's counters. With P_a and P_c the actor's and the critic's parameters and b bytes
per parameter (4 in float32), that is about 3 b (P_a + P_c) bytes, or b (P_a + P_c) with
`checkpoint_optimizer=False`, which keeps every parameter's entry in the optimizer state but empties
it: a run resumed from such a checkpoint starts both optimizers' moments afresh (and warns).
`checkpoint_keep` N keeps the N checkpoints before the current last.ckpt as `iter-NNNNNN.ckpt`."""

from __future__ import annotations

import errno
import os
import shutil
import zipfile
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from vapo_lit import faults
from vapo_lit.distributed import agree_any

LOW_SPACE = 1 << 20
"""Below this many free bytes a failed write is reported as a full disk (torch's writer says only
'unexpected pos' or 'file write failed' when the disk fills)."""


def check_checkpoint(path: Path) -> None:
    """ValueError, with what to do, when `path` is not a complete checkpoint (cheap: the zip
    directory is read, no tensor is loaded)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            if not any(n.endswith("data.pkl") for n in z.namelist()):
                raise zipfile.BadZipFile("no data.pkl inside")
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        kept = sorted(path.parent.glob("iter-*.ckpt"))  # checkpoint_keep's, the newest last
        best = kept[-1] if kept else path.with_name("best.ckpt")
        other = (
            f"continue from {best.name} instead (cp {best} {path}, then --resume again; the log is cut back "
            "to that iteration), or "
            if best.is_file() and best != path
            else ""
        )
        raise ValueError(
            f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); {other}start the run over "
            "under another --name"
        ) from None


def checkpoint_progress(path: Path) -> dict:
    """The checkpoint's `vapo` entry (iteration, ppo_updates, ...) without reading its tensors: the
    file is memory-mapped, so only the pickled structure is read (every rank of a resumed run calls
    this before Lightning loads the checkpoint itself)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)["vapo"]


def has_optimizer_state(path: Path) -> bool:
    """Whether the checkpoint holds its optimizers' moments (False: written with
    checkpoint_optimizer=False); memory-mapped like checkpoint_progress."""
    import torch

    states = torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("optimizer_states") or []
    return not states or any(
        entry for s in states if isinstance(s, dict) for entry in (s.get("state") or {}).values()
    )


def without_moments(state: dict) -> dict:
    """An optimizer's state dict with every parameter's entry emptied (param groups kept): loaded,
    each parameter's AdamW state starts afresh (moments 0, step 0), as a new optimizer's would."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
        return state  # a rank without the gathered state (sharded training) has nothing to drop
    return {**state, "state": {key: {} for key in state["state"]}}


def checkpoint_bytes(models, optimizer: bool = True) -> int:
    """About what a checkpoint of `models` takes on disk: each model's state_dict (tied tensors once),
    and with `optimizer` two AdamW moments per parameter in its dtype. The pickled structure, RNG
    states and per-tensor headers add some tens of kB."""
    weights = moments = 0
    for model in models:
        seen = set()
        for value in model.state_dict().values():
            key = (value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                weights += value.untyped_storage().nbytes()
        moments += 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    return weights + (moments if optimizer else 0)


class RunCheckpoints(Callback):
    """last.ckpt every `checkpoint_every` iterations and at the end; best.ckpt on a new best eval.
    Written to a temporary file and renamed, so a kill never leaves a half-written checkpoint.
    `optimizer`: keep the optimizers' moments (False: emptied, see the module doc); `keep`: how many
    earlier last.ckpt files stay as iter-NNNNNN.ckpt."""

    def __init__(self, run_dir: Path, every: int, *, optimizer: bool = True, keep: int = 0):
        self.dir = Path(run_dir) / "checkpoints"
        self.every = every
        self.optimizer, self.keep = optimizer, keep

    def setup(self, trainer, pl_module, stage: str) -> None:
        for stale in self.dir.glob(".*.tmp") if self.dir.is_dir() and trainer.is_global_zero else ():
            stale.unlink(missing_ok=True)  # a previous attempt died while writing it

    def _save(self, trainer, name: str) -> str:
        """Trainer.save_checkpoint's two steps (state from every rank, the strategy writes on rank 0),
        then every rank agrees on whether the write succeeded instead of Lightning's barrier: a
        rank-0 failure raises on every rank at once (a barrier would hold the others until the
        process group's timeout, 30 minutes under NCCL)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / name
        tmp = self.dir / f".{name}.tmp"
        error = None
        try:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(
                False
            )  # optimizers, schedulers, callbacks
            if not self.optimizer:
                checkpoint["optimizer_states"] = [
                    without_moments(s) for s in checkpoint.get("optimizer_states", [])
                ]
            trainer.strategy.save_checkpoint(checkpoint, str(tmp))
            action = faults.due("checkpoint") if trainer.is_global_zero else None
            if action:  # crash tests: a half-written temporary file, then the fault
                with open(tmp, "r+b") as f:
                    f.truncate(max(1, tmp.stat().st_size // 2))
                faults.fire(action, "checkpoint")
            if trainer.is_global_zero:  # the strategy wrote it on rank 0
                if name == "last.ckpt" and self.keep:
                    self._keep_previous(final)
                os.replace(tmp, final)
                if name == "last.ckpt" and self.keep:
                    self._prune()
        except Exception as e:
            error = e
        if agree_any(error is not None):
            raise self._failure(error, final, tmp)
        return str(final)

    def _keep_previous(self, final: Path) -> None:
        """The last.ckpt about to be replaced, kept as iter-NNNNNN.ckpt (a hard link: nothing is copied,
        and a kill between this and the replacement leaves both names on one complete file)."""
        if not final.is_file():
            return
        kept = self.dir / f"iter-{checkpoint_progress(final)['iteration']:06d}.ckpt"
        link = self.dir / f".{kept.name}.tmp"
        link.unlink(missing_ok=True)
        try:
            os.link(final, link)
        except OSError:  # a file system without hard links
            shutil.copyfile(final, link)
        os.replace(link, kept)

    def _prune(self) -> None:
        """Remove the kept checkpoints beyond the newest `keep`."""
        kept = sorted(self.dir.glob("iter-*.ckpt"), key=lambda p: p.name)
        for old in kept[: -self.keep]:
            old.unlink(missing_ok=True)

    def _failure(self, e: Exception | None, final: Path, tmp: Path) -> Exception:
        """What to raise after a failed save: this rank's error (a full disk said so), or, on a rank
        that did not fail, that another one did."""
        tmp.unlink(missing_ok=True)
        if e is None:
            return RuntimeError(
                f"another rank failed while writing {final} (its error is in its log); stopping"
            )
        full = faults.is_disk_full(e) or shutil.disk_usage(self.dir).free < LOW_SPACE
        if full and not (isinstance(e, OSError) and e.errno == errno.ENOSPC):
            full_disk = OSError(errno.ENOSPC, f"No space left on device while writing {final} ({e})")
            full_disk.__cause__ = e
            return full_disk
        return e

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ev = pl_module.last_eval
        if (
            ev is not None and ev.is_best and ev.iteration == pl_module.iteration
        ):  # evaluated in this iteration
            self._save(trainer, "best.ckpt")
        if pl_module.iteration % self.every == 0 or trainer.should_stop:
            pl_module.last_good_checkpoint = self._save(trainer, "last.ckpt")
            if trainer.is_global_zero:
                faults.reach("last_saved")


class RunExports(Callback):
    """The trained models as Hugging Face directories a user can load with `from_pretrained`:
    `policy-best/` (with the tokenizer) whenever an eval beats every earlier one, and at the end
    of training `policy-final/` and `critic-final/` (a ValueModel: backbone + value_head)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self._exported = None  # (iteration, ppo_update) of the eval behind policy-best

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        ev = pl_module.last_eval  # the initial policy's eval (before any update) may stay the best
        if ev is not None and ev.is_best and ev.ppo_update == 0 and pl_module.ppo_updates == 0:
            self._export_best(pl_module, ev)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ev = pl_module.last_eval
        if (
            ev is not None and ev.is_best and ev.iteration == pl_module.iteration
        ):  # evaluated in this iteration
            self._export_best(pl_module, ev)

    def _export_best(self, pl_module, ev) -> None:
        if (ev.iteration, ev.ppo_update) != self._exported:
            self.export_policy(pl_module, "policy-best")
            self._exported = (ev.iteration, ev.ppo_update)

    def on_train_end(self, trainer, pl_module) -> None:
        self.export_policy(pl_module, "policy-final")
        if pl_module.critic is not None:
            self._export(pl_module, pl_module.critic, "critic-final")

    def export_policy(self, pl_module, name: str) -> None:
        self._export(
            pl_module, pl_module.actor, name, pl_module.tokenizer, root=pl_module.policy, prefix="actor."
        )

    def _export(self, pl_module, model, name: str, tokenizer=None, root=None, prefix: str = "") -> None:
        """Rank 0 writes (data-parallel replicas are identical); every rank learns whether it succeeded. The weights
        are read from the sharding root (`root`, keys under `prefix`) when the model is sharded."""
        from vapo_lit.distributed import full_state_dict
        from vapo_lit.models import export

        trainer = pl_module.trainer
        state = full_state_dict(root if root is not None else model)  # every rank takes part under FSDP
        if state is not None and prefix:
            state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        error = None
        if trainer.is_global_zero:
            try:
                export(model, self.dir / name, tokenizer, state_dict=state)
            except Exception as e:
                error = e
        if agree_any(error is not None):  # instead of a barrier: a rank-0 failure stops every rank now
            raise error or RuntimeError(
                f"rank 0 failed while exporting {self.dir / name} (its error is in its log)"
            )
