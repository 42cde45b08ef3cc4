"""The study run of a sweep: one W&B run per study (job_type `study`, in the study's group beside
its trial runs) with the trials table, the best trial and the parameter importances.

- `study/trials`: number, state, objective value, every searched parameter, duration, run folder
  and the trial's W&B run id (from its run card);
- one history row per finished trial (`trial/number` is its axis: `trial/value`, `trial/<param>`),
  for W&B's scatter and parallel-coordinates panels;
- `study/importances`: Optuna's PED-ANOVA importances (normalised to sum 1), when at least two trials completed
  and a parameter varied; else the reason, in the summary;
- the summary: `best/number`, `best/value`, `best/params/<name>`, `best/run_dir`, `best/wandb_id`.

Its id comes from project and study name, so continuing the sweep updates the same run. Mode: the
trials' (`--wandb`; auto = online when logged in, else offline); files in OUT/wandb.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from vapo_lit.config import to_dict


def _number(value):
    return (
        value
        if isinstance(value, (int, str)) or (isinstance(value, float) and math.isfinite(value))
        else None
    )


def trial_rows(study, space: dict) -> tuple[list[str], list[list]]:
    """The trials table: one line per trial, in trial order."""
    columns = ["number", "state", "value", *space, "duration_s", "run_dir", "wandb_id"]
    data = []
    for t in study.get_trials(deepcopy=False):
        run_dir = t.user_attrs.get("run_dir")
        card = Path(run_dir) / "run_card.json" if run_dir else None
        wb = (json.loads(card.read_text()).get("wandb") or {}) if card is not None and card.is_file() else {}
        duration = t.duration.total_seconds() if t.duration is not None else None
        data.append(
            [
                t.number,
                t.state.name,
                _number(t.value),
                *(_number(t.params.get(p)) for p in space),
                duration,
                run_dir,
                wb.get("id"),
            ]
        )
    return columns, data


def importances(study) -> tuple[dict, str | None]:
    """({param: importance}, None) or ({}, why not)."""
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2:
        return {}, f"needs 2 completed trials, has {len(done)}"
    try:
        # PED-ANOVA: no scikit-learn needed (Optuna's default, fANOVA, imports it) and no random forest
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        with warnings.catch_warnings():  # its notes (e.g. "importances will be equal") are not our output
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(study, evaluator=evaluator)), None
    except (RuntimeError, ValueError, ImportError) as e:  # e.g. no parameter varied across the trials
        return {}, str(e).splitlines()[0]


def log_study(study, spec, base, out) -> str | None:
    """Log (or update) the study run; returns one line saying where it went (None when disabled)."""
    import wandb

    from vapo_lit.wandb_runs import offline_folder, summary_run

    config = {
        "study": spec.study,
        "objective": spec.objective,
        "direction": "maximize",
        "n_trials": spec.n_trials,
        "space": spec.space,
        "sampler": spec.sampler,
        "pruner": spec.pruner,
        "base_config": to_dict(base),
    }
    run = summary_run(
        Path(out),
        kind="study",
        project=base.wandb_project,
        group=spec.study,
        name=f"{spec.study}-study",
        config=config,
        mode=base.wandb,
    )
    if run is None:
        return None
    try:
        columns, data = trial_rows(study, spec.space)
        _log_trials(run, columns, data, spec.space)
        imp, why = importances(study)
        row = {
            "study/trials": wandb.Table(columns=columns, data=data, allow_mixed_types=True),
            "study/importances": wandb.Table(
                columns=["param", "importance"], data=[[k, v] for k, v in imp.items()]
            ),
        }
        run.log(row)
        run.summary.update({"trials": len(data), "importances_note": why or "", **_best_summary(study, data)})
        where = offline_folder(run)
    finally:
        run.finish()
    if where:
        return (
            f"[{spec.study}] W&B study run {run.id} (offline) in {where}; upload it with: wandb sync {where}"
        )
    return f"[{spec.study}] W&B study run {run.id}: {run.url}"


def _log_trials(run, columns: list, data: list, space) -> None:
    """One W&B row per finished trial (complete or pruned) on the trial/number axis."""
    run.define_metric("trial/number")
    run.define_metric("trial/*", step_metric="trial/number")
    for line in data:
        rec = dict(zip(columns, line))
        if rec["state"] in ("COMPLETE", "PRUNED"):
            run.log(
                {
                    "trial/number": rec["number"],
                    "trial/value": rec["value"],
                    **{f"trial/{p}": rec[p] for p in space if isinstance(rec[p], (int, float))},
                }
            )


def _best_summary(study, data: list) -> dict:
    """The best complete trial's number, value, parameters, run folder and W&B id ({} when none)."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return {}
    best = max(complete, key=lambda t: t.value)
    best_line = next(line for line in data if line[0] == best.number)
    return {
        "best/number": best.number,
        "best/value": best.value,
        **{f"best/params/{k}": v for k, v in best.params.items()},
        "best/run_dir": best.user_attrs.get("run_dir"),
        "best/wandb_id": best_line[-1],
    }
