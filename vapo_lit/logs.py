"""Loggers of a run: a CSV log that survives kills and resumes, and W&B (offline unless logged in)."""
from __future__ import annotations

import csv
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from lightning.pytorch.loggers import CSVLogger

from vapo_lit.config import COMPONENTS, RunConfig, run_label


class ResumableCSVLogger(CSVLogger):
    """CSVLogger that, on resume, keeps the rows up to the checkpoint instead of deleting the file
    (Lightning's writer removes an existing metrics.csv) and appends from there."""

    def __init__(self, save_dir, keep_until_step: int | None = None):
        super().__init__(save_dir=str(save_dir), name="", version="")
        self._keep_until = keep_until_step

    @property
    def experiment(self):
        from lightning.pytorch.utilities import rank_zero_only

        if rank_zero_only.rank != 0:  # only rank 0 writes the log
            return super().experiment
        if self._experiment is None:
            path = Path(self.log_dir) / "metrics.csv"
            kept, header = [], []
            if self._keep_until is not None and path.is_file():
                with open(path, newline="") as f:
                    reader = csv.DictReader(f)
                    header = list(reader.fieldnames or [])
                    kept = [row for row in reader if int(float(row["step"])) <= self._keep_until]
            exp = super().experiment
            if header:
                with open(path, "w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=header)
                    w.writeheader()
                    w.writerows(kept)
                exp.metrics_keys = list(header)
        return self._experiment


def wandb_mode(choice: str) -> str:
    """auto: online when the user is logged in (WANDB_API_KEY or a netrc entry), else offline."""
    if choice != "auto":
        return choice
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if host and netrc.netrc().authenticators(host):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


def make_wandb_logger(cfg: RunConfig, run_dir: Path, card: dict, run_id: str | None):
    mode = wandb_mode(cfg.wandb)
    if mode == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger

    dropped = [c for c in COMPONENTS if c not in cfg.components]
    return WandbLogger(
        name=run_dir.name, project=cfg.wandb_project, group=cfg.wandb_group or run_dir.name,
        job_type=cfg.wandb_job_type or run_label(cfg.components, cfg.advantage_estimator),
        tags=[f"no-{c}" for c in dropped] + [f"seed-{cfg.seed}"], save_dir=str(run_dir), mode=mode,
        id=run_id, resume="allow" if run_id else None, config=card, log_model=False,
    )
