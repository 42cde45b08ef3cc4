"""Run checkpoints: last.ckpt every `checkpoint_every` iterations and at the end, best.ckpt on a
new best eval; written to a temporary file and renamed, so a kill never leaves half a checkpoint.
Temporary files a killed run left behind are removed when the run (re)starts."""
from __future__ import annotations

import errno
import os
import shutil
import zipfile
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from vapo_lit import faults

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
        best = path.with_name("best.ckpt")
        other = (f"continue from best.ckpt instead (cp {best} {path}, then --resume again; the log is cut back "
                 "to that iteration), or " if best.is_file() and best != path else "")
        raise ValueError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); {other}start the run over "
                         "under another --name") from None


class RunCheckpoints(Callback):
    """last.ckpt every `checkpoint_every` iterations and at the end; best.ckpt on a new best eval.
    Written to a temporary file and renamed, so a kill never leaves a half-written checkpoint."""

    def __init__(self, run_dir: Path, every: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.every = every

    def setup(self, trainer, pl_module, stage: str) -> None:
        for stale in self.dir.glob(".*.tmp") if self.dir.is_dir() else ():
            stale.unlink(missing_ok=True)  # a previous attempt died while writing it

    def _save(self, trainer, name: str) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / name
        tmp = self.dir / f".{name}.tmp"
        try:
            trainer.save_checkpoint(str(tmp), weights_only=False)  # full state: optimizers, schedulers, callbacks
            action = faults.due("checkpoint")
            if action:  # crash tests: a half-written temporary file, then the fault
                with open(tmp, "r+b") as f:
                    f.truncate(max(1, tmp.stat().st_size // 2))
                faults.fire(action, "checkpoint")
        except Exception as e:
            full = faults.is_disk_full(e) or shutil.disk_usage(self.dir).free < LOW_SPACE
            tmp.unlink(missing_ok=True)
            if full and not (isinstance(e, OSError) and e.errno == errno.ENOSPC):
                raise OSError(errno.ENOSPC, f"No space left on device while writing {final} ({e})") from e
            raise
        os.replace(tmp, final)
        return str(final)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.last_metrics.get("eval/is_best"):
            self._save(trainer, "best.ckpt")
        if pl_module.iteration % self.every == 0 or trainer.should_stop:
            pl_module.last_good_checkpoint = self._save(trainer, "last.ckpt")

