"""W&B without Lightning: the mode and settings every run of ours uses, the axes of a training run,
and the one run that a grid's report or a sweep's study logs beside its cells.

Kept free of torch and Lightning so the report (which never imports torch) can log its grid run.

Axes of a training run (`AXES`, `wandb_row`): every PPO metric is stepped on `ppo/update`
(0 = the base policy, before the first update; value pretraining does not move it), so a row with
value pretraining and one without line up on every chart. A value-pretraining iteration's
metrics go under `value_pretrain/` (`value_pretrain/value/loss`, ...) stepped on their own axis,
`value_pretrain/iteration`. `tokens/generated` and `time/wall_seconds` are logged in every row
for charts against compute. The CSV log keeps its own names; only what W&B sees is renamed. The
episodes the model wrote (vapo_lit/samples.py) are the table `samples`, in rows of their own
stepped on `ppo/update`.

A summary run (`summary_run`): one run per grid (job_type `report`) or per study (job_type
`study`) with an id derived from project, group and kind, so a rerun updates that run instead of
adding one. Offline, the rerun's folder replaces the earlier one (`wandb sync` then uploads a
single run); online, W&B resumes the run with that id.
"""

from __future__ import annotations

import hashlib
import netrc
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

SUMMARY_ENV = "VAPO_LIT_WANDB_SUMMARY"
"""Set to 1 to get W&B's console header and end-of-run summary (sparklines) back."""

PPO_AXIS = "ppo/update"
PRETRAIN_AXIS = "value_pretrain/iteration"
AXES = {
    PPO_AXIS: "train/ppo_update",
    "tokens/generated": "perf/cumulative_tokens",
    "time/wall_seconds": "perf/cumulative_seconds",
}
"""W&B axis -> the logged column it copies."""
PRETRAIN_PREFIX = "value_pretrain/"
SAMPLES_KEY = "samples"
"""The W&B table of the episodes a run wrote (samples.jsonl's rows)."""


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


def wandb_settings():
    """Quiet unless asked: W&B's header, its per-run lines (run name, folder, `wandb sync` hint)
    and end-of-run history/summary block only with VAPO_LIT_WANDB_SUMMARY=1 (or W&B's own
    WANDB_QUIET/WANDB_SILENT, which are left to W&B). Metrics, config and files are recorded either
    way; our commands print where the offline runs are and how to upload them."""
    import wandb

    if any(k in os.environ for k in ("WANDB_QUIET", "WANDB_SILENT")):
        return wandb.Settings()
    loud = os.environ.get(SUMMARY_ENV, "").strip().lower() in ("1", "true", "yes")
    return wandb.Settings(quiet=not loud, silent=not loud)


def no_network_offline(mode: str) -> None:
    """An offline run sends nothing. W&B's SDK decides on its own telemetry (OpenTelemetry metrics
    posted to WANDB_BASE_URL every minute and at exit, error reports) from the process's global
    settings, which only WANDB_MODE makes offline: a run started with mode="offline" still posts
    them. So offline, both are switched off for this process."""
    if mode not in ("offline", "dryrun"):
        return
    os.environ["WANDB_ERROR_REPORTING"] = "false"
    try:  # the process-wide switch of its OpenTelemetry proxy (older releases have none)
        from wandb.analytics.opentelemetry.opentelemetry_proxy import disable
    except ImportError:
        return
    disable()


# ----------------------------------------------------------------------------- a training run's axes
def wandb_row(metrics: dict) -> dict:
    """What W&B records of one logged row: a value-pretraining row under `value_pretrain/` with
    its own axis; any other row with `ppo/update`; both with the compute axes."""
    row = dict(metrics)
    compute = {axis: row[col] for axis, col in AXES.items() if axis != PPO_AXIS and col in row}
    if float(row.get("train/value_pretraining", 0.0) or 0.0) > 0.0:
        row = {f"{PRETRAIN_PREFIX}{k}": v for k, v in row.items()}
        row[PRETRAIN_AXIS] = metrics.get("train/iteration")
    elif "train/ppo_update" in row:
        row[PPO_AXIS] = row["train/ppo_update"]
    return {**row, **compute}


def step_metric_of(key: str) -> str | None:
    """The axis a logged key is plotted against (None for the axes themselves)."""
    if key == PRETRAIN_AXIS or key in AXES:
        return None
    return (
        PRETRAIN_AXIS if key.startswith(PRETRAIN_PREFIX) and "/" in key[len(PRETRAIN_PREFIX) :] else PPO_AXIS
    )


class AxisDefiner:
    """Declares each key's axis (`define_metric`) the first time it is logged: exact names, so no
    glob decides between two axes."""

    def __init__(self, run):
        self.run, self.seen = run, set()
        for axis in (*AXES, PRETRAIN_AXIS):
            run.define_metric(axis, summary="max")
            self.seen.add(axis)

    def log(self, row: dict) -> None:
        for key in row:
            if key not in self.seen:
                self.seen.add(key)
                self.run.define_metric(key, step_metric=step_metric_of(key))
        self.run.log(row)


# ----------------------------------------------------------------------------- a grid's or a study's run
def stable_id(kind: str, project: str, group: str) -> str:
    """The run id of a grid's or a study's own run: the same for the same project and group."""
    return f"{kind}-" + hashlib.sha256(f"{project}\0{group}".encode()).hexdigest()[:16]


def summary_run(
    folder: Path, *, kind: str, project: str, group: str, name: str, config: dict, mode: str = "auto"
):
    """Start (or, rerun, replace) the run of kind `kind` (report | study) for `group`, its files in
    FOLDER/wandb; None when mode resolves to disabled. The caller logs and calls `finish()`."""
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    import wandb

    from vapo_lit.masking import scrub_argv

    scrub_argv()  # W&B records sys.argv: no database password may be in it
    no_network_offline(mode)
    run_id = stable_id(kind, project, group)
    root = Path(folder) / "wandb"
    if mode == "offline":  # the rerun's record is complete: the earlier offline copy goes
        for old in root.glob(f"offline-run-*-{run_id}"):
            shutil.rmtree(old, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        dir=str(folder),
        project=project,
        group=group,
        job_type=kind,
        name=name,
        id=run_id,
        resume="allow",
        mode=mode,
        config=config,
        tags=[kind],
        settings=wandb_settings(),
    )


def offline_folder(run) -> str | None:
    """The offline run's folder (what `wandb sync` takes), or None online."""
    if getattr(run.settings, "mode", None) not in ("offline", "dryrun") and not getattr(
        run.settings, "_offline", False
    ):
        return None
    return str(Path(run.dir).parent)
