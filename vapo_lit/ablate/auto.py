"""`vapo-ablate --seeds auto`: add seeds to a grid until the rows of interest are resolved.

    vapo-ablate --grid table1 --seeds auto --max-seeds 10 --rows vapo-no-value_pretraining,vanilla_ppo

Round r runs the grid with n_r seeds per row through `runner.run` (so finished cells are reused and
a killed round resumes like any grid), reads each finished cell's eval curve from its metrics.csv,
and hands the per-seed differences to the full recipe to `vapo_lit.seed_stats.decide_seeds`
(the one rule, shared with the report): a row is resolved when its paired 95% interval excludes
zero, unreachable when the plug-in seeds-needed estimate exceeds --max-seeds; the next round has
enough seeds for the most demanding unresolved row. It stops when every row of interest is
resolved or unreachable, at --max-seeds, or when a cell fails. The report is written once, at the end.

This module imports only the pure statistics of the report (no pandas, no report code).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from vapo_lit.config import COMPONENTS
from vapo_lit.labels import run_label
from vapo_lit.protocol import Endpoint, parse_endpoint
from vapo_lit.seed_stats import curve_auc, decide_seeds

METRICS = ("final", "peak", "auc")
REFERENCE = run_label(COMPONENTS)


def rows_of_interest(plan, rows: list[str] | None, reference: str = REFERENCE) -> list[str]:
    """Validate --rows against the grid (ValueError naming what is valid); default: every row but
    the reference."""
    labels = list(dict.fromkeys(c.row for c in plan.cells))
    if reference not in labels:
        raise ValueError(
            f"--seeds auto compares rows with the full recipe ({reference!r}), which this grid lacks; "
            f"rows: {', '.join(labels)}"
        )
    others = [r for r in labels if r != reference]
    if not rows:
        return others
    bad = [r for r in rows if r not in others]
    if bad:
        raise ValueError(
            f"--rows {','.join(bad)}: not a row of this grid other than {reference!r}; valid: "
            f"{', '.join(others)}"
        )
    return rows


def logged_score(run_dir: Path, k: int, metric: str, endpoint: Endpoint = Endpoint(1)) -> float:
    """final (the grid's endpoint) / peak / auc (fractions) of one finished run from its metrics.csv;
    NaN when absent."""
    path = Path(run_dir) / "metrics.csv"
    if not (Path(run_dir) / "summary.json").is_file() or not path.is_file():
        return math.nan
    ups, scores = [], []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            try:
                score = float(rec.get(f"eval/avg@{k}") or "nan")
                update = float(rec.get("train/ppo_update") or rec.get("step") or "nan")
            except (TypeError, ValueError):  # a cut last line: left out, like the report does
                continue
            if score == score and update == update:
                ups.append(update)
                scores.append(score)
    trained = [s for u, s in zip(ups, scores) if u > 0]
    if not trained:
        return math.nan
    return {"final": endpoint.score(trained), "peak": max(trained), "auc": curve_auc(ups, scores)}[metric]


def paired_diffs(plan, rows: list[str], metric: str, reference: str = REFERENCE) -> dict:
    """{row: [row - reference per seed both finished]} from what the cells logged."""
    values = {}
    for c in plan.cells:
        values.setdefault(c.row, {})[c.seed] = logged_score(
            c.run_dir, c.cfg.eval_k, metric, parse_endpoint(plan.endpoint)
        )
    ref = values.get(reference, {})
    return {
        r: [
            values[r][s] - ref[s]
            for s in sorted(values.get(r, {}))
            if s in ref and values[r][s] == values[r][s] and ref[s] == ref[s]
        ]
        for r in rows
    }


def run_auto(
    plan_for,
    *,
    rows,
    min_seeds: int,
    max_seeds: int,
    metric: str = "final",
    workers: int = 1,
    report=None,
    log=print,
) -> int:
    """`plan_for(n)` -> the grid's Plan with n seeds per row. Returns run()'s exit code of the last round."""
    from vapo_lit.ablate.runner import run

    n = min_seeds
    while True:
        p = plan_for(n)
        code = run(p, workers=workers, log=log)
        if code != 0:
            log(f"[{p.grid.grid_id}] --seeds auto: stopping at {n} seeds, some cells failed")
            break
        decision = decide_seeds(paired_diffs(p, rows, metric), n, max_seeds)
        log(f"[{p.grid.grid_id}] --seeds auto ({metric}) at {n} seeds: {decision.reason}")
        if decision.seeds is None:
            break
        n = decision.seeds
    if report is not None:
        log(report(p))
    return code
