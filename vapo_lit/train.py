"""`train(cfg)`: build task, models, module, component callbacks and loggers; fit; return a summary.

This is the one entry that `vapo-train`, the ablation runner and the tests call. A run folder
holds `metrics.csv` (every logged metric, one row per iteration), `samples.jsonl` (a few episodes
per iteration and per evaluation), `run_card.json` (docs/algorithm.md's "a run must record" list),
`config.yaml`, `summary.json` at the end, `checkpoints/last.ckpt` (with `best.ckpt` once an eval
after an update beats every earlier one, and `checkpoint_keep` earlier ones), the models as Hugging
Face folders (`policy-best/`, `policy-final/`, `critic-final/`) and the W&B run under `wandb/`
(none with wandb=disabled). The pieces live next door: `build.py` (task and models), `loggers.py`
(CSV and W&B loggers), `samples.py`, `checkpoints.py`, `run_card.py`. With status lines on
(vapo_lit.status), each slow step before the first iteration ends says what it does first.
"""

from __future__ import annotations

import json
import random
import time
import warnings
from pathlib import Path

import lightning as L
import torch
import yaml

from vapo_lit import status
from vapo_lit.build import build_module
from vapo_lit.checkpoints import RunCheckpoints, RunExports, checkpoint_progress, has_optimizer_state
from vapo_lit.components import build_callbacks
from vapo_lit.config import RunConfig, to_dict
from vapo_lit.devices import describe, trainer_kwargs
from vapo_lit.distributed import is_global_zero_env
from vapo_lit.labels import label_of
from vapo_lit.loggers import ResumableCSVLogger, make_wandb_logger
from vapo_lit.preflight import preflight
from vapo_lit.progress_line import ProgressLine, StartLines
from vapo_lit.run_card import RunCardWriter, write_json
from vapo_lit.samples import SampleLog


def run_dir_of(cfg: RunConfig) -> Path:
    return Path(cfg.out_dir) / (cfg.name or f"{label_of(cfg)}-s{cfg.seed}")


def train(cfg: RunConfig, *, resume: bool = False, extra_callbacks=(), module_factory=build_module) -> dict:
    """Run (or, with resume=True, continue) one training run; returns its summary.

    `module_factory(cfg) -> VapoModule` builds task and models (tests pass tiny ones)."""
    preflight(cfg)  # inputs checked before any folder is created or weight loaded (preflight.py)
    run_dir = run_dir_of(cfg)
    ckpt = _checked_run_dir(run_dir, resume)
    hardware = trainer_kwargs(cfg)  # raises on a device that is not there, before anything is written
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if is_global_zero_env():  # with several processes only rank 0 writes the run folder
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    keep_until = wandb_id = None
    if resume:
        progress = checkpoint_progress(ckpt)  # memory-mapped: no tensor is read
        keep_until = progress["iteration"]
        if progress["ppo_updates"] >= cfg.steps and (run_dir / "summary.json").is_file():
            return json.loads((run_dir / "summary.json").read_text())  # finished: nothing to resume
        wandb_id = _resuming(run_dir, ckpt, progress)
    else:
        status.say(f"run folder {run_dir}")
    module = module_factory(cfg)
    loggers = [ResumableCSVLogger(run_dir, keep_until_step=keep_until)]
    wb = make_wandb_logger(cfg, run_dir, {"config": to_dict(cfg)}, wandb_id)
    if wb is not None:
        loggers.append(wb)
    trainer = L.Trainer(
        **hardware,
        max_epochs=-1,
        max_steps=-1,
        logger=loggers,
        callbacks=run_callbacks(cfg, run_dir, keep_until, hardware, extra_callbacks),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        default_root_dir=str(run_dir),
    )
    t0 = time.perf_counter()
    _fit(trainer, module, str(ckpt) if resume else None, wb)
    summary = {
        "run_dir": str(run_dir),
        "iterations": module.iteration,
        "ppo_updates": module.ppo_updates,
        "best_eval": module.best_eval,
        "wall_seconds": time.perf_counter() - t0,
        "last_metrics": module.last_metrics,
    }
    if trainer.is_global_zero:
        write_json(run_dir / "summary.json", summary)
    if wb is not None:
        wb.experiment.finish()  # flush and close this run's file now (not at interpreter exit)
    return summary


def run_callbacks(cfg: RunConfig, run_dir: Path, keep_until: int | None, hardware: dict, extra=()) -> list:
    """The run's callbacks in order: the components, then what writes the run folder (samples, exports,
    checkpoints, the run card), the status lines and `extra`."""
    # policy-best/ is exported before last.ckpt is written: a run killed between the two resumes from the
    # older checkpoint, redoes the iteration and exports it again (the other way round, a resumed run
    # would keep a policy-best/ older than its best eval)
    return [
        *build_callbacks(cfg.components, cfg.vapo),
        SampleLog(run_dir, cfg.samples_per_iteration, cfg.print_sample_every, keep_until=keep_until),
        RunExports(run_dir),
        RunCheckpoints(
            run_dir, cfg.checkpoint_every, optimizer=cfg.checkpoint_optimizer, keep=cfg.checkpoint_keep
        ),
        RunCardWriter(run_dir, {"run_dir": str(run_dir)}, hardware=describe(hardware)),
        StartLines(),
        ProgressLine(),
        *extra,
    ]


def _resuming(run_dir: Path, ckpt: Path, progress: dict) -> str | None:
    """Say where the run resumes (a warning when its checkpoint has no optimizer state); the W&B run
    id to continue (None: none recorded)."""
    status.say(
        f"resuming {run_dir} from {ckpt.name} (iteration {progress['iteration']}, PPO update "
        f"{progress['ppo_updates']})"
    )
    if is_global_zero_env() and not has_optimizer_state(ckpt):
        warnings.warn(
            f"{ckpt} was written with checkpoint_optimizer=false: the actor's and the critic's AdamW "
            "moments start afresh from here, so the resumed run differs from an uninterrupted one",
            RuntimeWarning,
            stacklevel=3,
        )
    card_path = run_dir / "run_card.json"
    return json.loads(card_path.read_text()).get("wandb", {}).get("id") if card_path.is_file() else None


def _checked_run_dir(run_dir: Path, resume: bool) -> Path:
    """The run's last checkpoint path, after checking that the folder is what `resume` expects."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if resume and not ckpt.is_file():
        raise FileNotFoundError(f"cannot resume: no checkpoint at {ckpt}")
    if not resume and (run_dir / "metrics.csv").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it or choose another --name/--out_dir"
        )
    return ckpt


def _fit(trainer: L.Trainer, module, ckpt_path: str | None, wb) -> None:
    """trainer.fit without Lightning's warnings that do not apply here; a failed run's W&B run is
    closed as failed, keeping what it logged."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*IterableDataset.*__len__.*")
            # ResumableCSVLogger keeps the rows up to the checkpoint itself; Lightning's generic
            # "previous log files will be deleted" warning does not apply to it.
            warnings.filterwarnings("ignore", ".*Experiment logs directory .* exists and is not empty.*")
            # Models stay in eval mode on purpose: no dropout, so the PPO ratio compares the policy
            # with itself and the recorded behaviour log-probs are reproducible.
            warnings.filterwarnings("ignore", ".*module\\(s\\) in eval mode.*")
            trainer.fit(module, ckpt_path=ckpt_path)
    except BaseException:
        if wb is not None and wb._experiment is not None:
            wb.experiment.finish(exit_code=1)  # keep what was logged; mark the run failed
        raise
