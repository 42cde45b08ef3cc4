"""Loggers of a run: a CSV log that survives kills, full disks and resumes, and W&B (offline unless
logged in, quiet, with no secret in what it records)."""

from __future__ import annotations

import csv
import io
import os
import warnings
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from vapo_lit import faults
from vapo_lit.config import COMPONENTS, RunConfig
from vapo_lit.labels import label_of
from vapo_lit.masking import scrub_argv
from vapo_lit.wandb_runs import (
    PPO_AXIS,
    SAMPLES_KEY,
    AxisDefiner,
    no_network_offline,
    wandb_mode,
    wandb_row,
    wandb_settings,
)


# ----------------------------------------------------------------------------- metrics.csv
def read_rows(path: Path) -> tuple[list[str], list[dict], str | None]:
    """(header, complete rows, what was dropped) of a metrics.csv that a crash may have cut.

    Only the last row can be partial (rows are appended whole and flushed in order): one that does
    not end in a newline or has fewer fields than the header is dropped, and described in the third
    value. A malformed row anywhere else is not a crash's trace: ValueError with file and line."""
    with open(path, newline="") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    if not lines:
        return [], [], None
    header = next(csv.reader([lines[0]]))
    if not lines[0].endswith(("\n", "\r")):  # cut inside the header: nothing was logged yet
        return [], [], f"a partial header ({len(lines[0])} bytes)"
    rows, dropped = [], None
    for i, line in enumerate(lines[1:], start=2):
        fields = next(csv.reader([line]), [])
        last = i == len(lines)
        if not line.endswith(("\n", "\r")) or len(fields) != len(header):
            if last:
                dropped = f"a partial last row (line {i}, {len(line)} bytes)"
                break
            raise ValueError(
                f"{path}, line {i}: {len(fields)} fields where the header has {len(header)}; "
                "the file was changed by hand or damaged (move it aside to start the log over)"
            )
        rows.append(dict(zip(header, fields)))
    return header, rows, dropped


def write_atomic(path: Path, header: list[str], rows: list[dict]) -> None:
    """The whole file into a temporary sibling, fsynced, then renamed over `path`: a crash leaves
    either the old file or the new one, never half of either."""
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CrashSafeWriter(ExperimentWriter):
    """Lightning's CSV writer with crash-consistent writes: a new row is appended as one write and
    fsynced; a new column rewrites the file into a temporary sibling and renames it (Lightning
    rewrites it in place, so a kill there lost the whole history); an existing file is never
    deleted (Lightning's writer deletes it on start)."""

    def __init__(self, log_dir: str, keep_until_step: int | None):
        self._keep_until = keep_until_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if self._keep_until is None or not path.is_file():
            if path.is_file():  # a fresh run over an old log (train() refuses this unless told): start over
                path.unlink()
            return
        header, rows, dropped = read_rows(path)
        if dropped:
            warnings.warn(
                f"{path}: dropped {dropped}, cut by a crash or a full disk; the run resumes from its "
                "last checkpoint and logs that iteration again",
                RuntimeWarning,
                stacklevel=2,
            )
        kept = [
            r for r in rows if r.get("step") not in (None, "") and int(float(r["step"])) <= self._keep_until
        ]
        if header:
            write_atomic(path, header, kept)
            self.metrics_keys = list(header)
        else:
            path.unlink()
        tmp = path.with_name(f".{path.name}.tmp")
        if tmp.exists():  # a rewrite that a crash interrupted: the renamed file above is the truth
            tmp.unlink()

    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        new_keys = self._record_new_keys()
        if new_keys or not path.is_file():
            _, old, _ = read_rows(path) if path.is_file() else ([], [], None)
            write_atomic(path, self.metrics_keys, old + self.metrics)
        else:
            buf = io.StringIO()
            csv.DictWriter(buf, fieldnames=self.metrics_keys).writerows(self.metrics)
            data = buf.getvalue()
            with open(path, "a", newline="") as f:
                action = faults.due("csv_append")
                if action:  # crash tests: half a row on disk, then the fault
                    f.write(data[: len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                    faults.fire(action, "csv_append")
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        self.metrics = []


class ResumableCSVLogger(CSVLogger):
    """CSVLogger that, on resume, keeps the rows up to the checkpoint (dropping a partial last row
    with a warning) and appends from there; every write is crash-consistent (`CrashSafeWriter`)."""

    def __init__(self, save_dir, keep_until_step: int | None = None):
        super().__init__(save_dir=str(save_dir), name="", version="")
        self._keep_until = keep_until_step

    @property
    def experiment(self):
        from lightning.pytorch.utilities import rank_zero_only

        if rank_zero_only.rank != 0:  # only rank 0 writes the log
            return super().experiment
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = CrashSafeWriter(self.log_dir, self._keep_until)
        return self._experiment


# ----------------------------------------------------------------------------- W&B
class AxesWandbLogger(WandbLogger):
    """Lightning's W&B logger with our axes (vapo_lit/wandb_runs.py): every PPO metric stepped on
    `ppo/update`, value pretraining under `value_pretrain/` on its own axis, instead of Lightning's
    one `trainer/global_step` for every row."""

    @property
    def experiment(self):
        from lightning.pytorch.utilities import rank_zero_only

        if self._experiment is None and rank_zero_only.rank == 0:
            import wandb

            if wandb.run is None:  # else Lightning reuses the open run (and says so)
                self._experiment = wandb.init(**self._wandb_init)
                self._axes = AxisDefiner(self._experiment)
        return super().experiment

    def log_metrics(self, metrics, step=None) -> None:
        from lightning.pytorch.utilities import rank_zero_only

        if rank_zero_only.rank != 0:
            return
        run = self.experiment
        axes = getattr(self, "_axes", None)
        if axes is None or axes.run is not run:
            axes = self._axes = AxisDefiner(run)
        axes.log(wandb_row(metrics))

    def log_samples(self, columns: list[str], rows: list[list], ppo_update: int) -> None:
        """Episodes the model wrote (vapo_lit/samples.py) as the table `samples`, in a row of their
        own stepped on ppo/update."""
        from lightning.pytorch.utilities import rank_zero_only

        if rank_zero_only.rank != 0:
            return
        import wandb

        run = self.experiment
        axes = getattr(self, "_axes", None)
        if axes is None or axes.run is not run:
            axes = self._axes = AxisDefiner(run)
        axes.log({SAMPLES_KEY: wandb.Table(columns=columns, data=rows), PPO_AXIS: ppo_update})


def make_wandb_logger(cfg: RunConfig, run_dir: Path, card: dict, run_id: str | None):
    mode = wandb_mode(cfg.wandb)
    if mode == "disabled":
        return None
    scrub_argv()  # W&B records sys.argv (its "args"): no database password may be in it
    no_network_offline(mode)
    dropped = [c for c in COMPONENTS if c not in cfg.components]
    logger = AxesWandbLogger(
        name=run_dir.name,
        project=cfg.wandb_project,
        group=cfg.wandb_group or run_dir.name,
        job_type=cfg.wandb_job_type or label_of(cfg),
        tags=[f"no-{c}" for c in dropped] + [f"seed-{cfg.seed}"],
        save_dir=str(run_dir),
        mode=mode,
        id=run_id,
        resume="allow" if run_id else None,
        config=card,
        log_model=False,
        settings=wandb_settings(),
    )
    if getattr(logger, "_wandb_init", {}).get("anonymous", 0) is None:
        del logger._wandb_init[
            "anonymous"
        ]  # Lightning passes anonymous=None; W&B warns that it has no effect
    return logger
