"""Per-run numbers from a run's logs (one line of seeds.csv per run). Scores are in points (x100).

Conventions:
- Eval rows are those with `eval/avg@k` set; the one at step 0 is the base policy's (PPO update
  0), the later ones come after `train/ppo_update` updates. final = the grid's primary endpoint
  (vapo_lit/protocol.py: the last trained eval, or the mean of the last K), peak = the best trained
  eval, strict = `eval/strict_avg@k` at the last trained eval; last_eval = the last trained eval
  where the endpoint is another.
- PPO rows (`train/value_pretraining == 0`) give the training diagnostics; critic-only
  value-pretraining rows are left out of them (but count as cost).
- Sample efficiency: `updates_to_threshold` = the PPO update of the first eval (base included)
  at or above the threshold, NaN when never; `auc` = area under the eval curve from update 0 to
  the last eval divided by that range (the mean score over training, points).
- Cost: `perf/cumulative_seconds` / `perf/cumulative_tokens` when logged; older logs fall back to
  cumulative sums of `perf/total_seconds` (the base eval's `perf/eval_seconds` on step 0) and of
  `rollout/response_length` x `rollout/prompts` x `rollout/samples_per_prompt`; `cost_source`
  says which. The compute-matched score is the last eval logged at or before a budget.
- Explained variance over the last N PPO rows is a median (one batch with no correct response can
  give -23); entropy and response length are means. NaN (EV undefined) is skipped everywhere.
"""

from __future__ import annotations

import os

import pandas as pd

from vapo_lit import seed_stats as stats
from vapo_lit.protocol import Endpoint
from vapo_lit.report.logs import RunLog, attempt_counts, label_of  # noqa: F401 (label_of: public here too)

TRACKED = {
    "entropy": "policy/entropy",
    "response_length": "rollout/response_length",
    "ev_mc": "value/explained_variance",
    "ev_target": "value/explained_variance_target",
}
"""Training diagnostics: name in the tables -> metrics.csv column."""
MEDIAN_LAST = ("ev_mc", "ev_target")
BIAS_BUCKETS = ("first", "1-7", "8-31", "32-127", "ge128")
"""`value/bias_pos_<bucket>`: mean V - return by response position (first token, then 1-7, ...)."""
LONG_BIAS_BUCKETS = ("first", "1-7", "8-31", "32-127", "128-511", "ge512")
"""The same with 128+ split at 512 (vapo_lit.experience.POSITION_EDGES, what runs log now; older
logs have one 128+ bucket): used where a log has a bucket past 128 under these edges; runs whose
responses stay under 128 tokens look alike under both."""
CALIBRATION_UPDATES = 5
"""Value calibration: mean bias over the first and the last this many PPO iterations of a run."""

NAN = float("nan")


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df else pd.Series([NAN] * len(df), index=df.index, dtype=float)


def _x(df: pd.DataFrame) -> pd.Series:
    return df["train/ppo_update"].fillna(0) if "train/ppo_update" in df else df["step"]


def eval_curve(log: RunLog, strict: bool = False) -> tuple[list, list]:
    """(PPO update, score in points) at every eval row, base policy first."""
    df = log.metrics
    key = f"eval/strict_avg@{log.k}" if strict else log.score_key
    if key not in df:
        return [], []
    rows = df[df[key].notna()]
    return [float(u) for u in _x(df)[rows.index]], [100.0 * float(v) for v in rows[key]]


def ppo_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["train/value_pretraining"] == 0] if "train/value_pretraining" in df else df[df["step"] > 0]


def cost_curves(log: RunLog) -> dict:
    """Cumulative wall seconds and generated response tokens at every row, and their source."""
    df = log.metrics
    sources = []
    if "perf/cumulative_seconds" in df and df["perf/cumulative_seconds"].notna().any():
        seconds = df["perf/cumulative_seconds"].ffill().fillna(0.0)
        sources.append("logged")
    else:
        per_row = _col(df, "perf/total_seconds").fillna(_col(df, "perf/eval_seconds")).fillna(0.0)
        seconds = per_row.cumsum()
        sources.append("reconstructed")
    if "perf/cumulative_tokens" in df and df["perf/cumulative_tokens"].notna().any():
        tokens = df["perf/cumulative_tokens"].ffill().fillna(0.0)
        sources.append("logged")
    else:
        per_row = (
            _col(df, "rollout/response_length")
            * _col(df, "rollout/prompts")
            * _col(df, "rollout/samples_per_prompt")
        ).fillna(0.0)
        tokens = per_row.cumsum()
        sources.append("reconstructed")
    source = sources[0] if sources[0] == sources[1] else f"seconds {sources[0]}, tokens {sources[1]}"
    return {"seconds": seconds, "tokens": tokens, "source": source}


def _last(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.iloc[-1]) if len(s) else NAN


def per_run(log: RunLog, last_n: int, folder, endpoint: Endpoint = Endpoint(1)) -> dict:
    """The numbers of one run that do not depend on the other runs (see the module docstring).
    `folder`: the report folder; the run folder is written relative to it."""
    df = log.metrics
    ups, scores = eval_curve(log)
    strict_ups, strict = eval_curve(log, strict=True)
    trained = [s for u, s in zip(ups, scores) if u > 0]
    strict_trained = [s for u, s in zip(strict_ups, strict) if u > 0]
    ppo = ppo_rows(df)
    cost = cost_curves(log)
    rec = {
        "row": log.row,
        "seed": log.seed,
        "run": os.path.relpath(log.run_dir, folder).replace(os.sep, "/"),
        "ppo_updates": log.ppo_updates,
        "steps": log.steps,
        "truncated": log.truncated,
        "base": next((s for u, s in zip(ups, scores) if u == 0), NAN),
        "final": endpoint.score(trained),
        **({"last_eval": trained[-1] if trained else NAN} if endpoint.last > 1 else {}),
        "peak": max(trained) if trained else NAN,
        "strict_final": strict_trained[-1] if strict_trained else NAN,
        "strict_peak": max(strict_trained) if strict_trained else NAN,
        "auc": stats.curve_auc(ups, scores),
        "cumulative_seconds": float(cost["seconds"].iloc[-1]),
        "cumulative_tokens": float(cost["tokens"].iloc[-1]),
        "cost_source": cost["source"],
        "tokens_per_second": float(_col(ppo, "perf/tokens_per_second").mean()) if len(ppo) else NAN,
        "peak_memory_mb": float(_col(df, "perf/peak_memory_mb").max()),
    }
    for name, col in TRACKED.items():
        series = _col(ppo, col).dropna()
        tail = series.iloc[-last_n:]
        rec[f"{name}_final"] = _last(series)
        rec[f"{name}_last"] = (
            float(tail.median() if name in MEDIAN_LAST else tail.mean()) if len(tail) else NAN
        )
    rec.update(attempt_counts(log.attempts))
    return rec


def efficiency(log: RunLog, threshold: float, token_budget: float, time_budget: float) -> dict:
    """The numbers that depend on the whole table: updates to the threshold, score at the budgets."""
    ups, scores = eval_curve(log)
    cost = cost_curves(log)
    rows = (
        log.metrics[log.metrics[log.score_key].notna()]
        if log.score_key in log.metrics
        else log.metrics.iloc[0:0]
    )
    tokens = [float(cost["tokens"][i]) for i in rows.index]
    seconds = [float(cost["seconds"][i]) for i in rows.index]
    return {
        "updates_to_threshold": stats.reach_update(ups, scores, threshold),
        "score_at_tokens": stats.at_budget(tokens, scores, token_budget),
        "score_at_seconds": stats.at_budget(seconds, scores, time_budget),
    }


def bias_buckets(logs) -> tuple[str, ...]:
    """The position buckets of a report: LONG_BIAS_BUCKETS when any run logged one of its buckets
    past 128 tokens, else BIAS_BUCKETS."""
    long = [f"value/bias_pos_{b}" for b in LONG_BIAS_BUCKETS[4:]]
    return LONG_BIAS_BUCKETS if any(c in log.metrics for log in logs for c in long) else BIAS_BUCKETS


def calibration(log: RunLog, n: int = CALIBRATION_UPDATES, buckets=BIAS_BUCKETS) -> dict:
    """{('early'|'late', bucket): mean V - return} over the first / last n PPO rows of a run."""
    ppo = ppo_rows(log.metrics)
    out = {}
    for bucket in buckets:
        col = _col(ppo, f"value/bias_pos_{bucket}")
        if bucket == "first" and col.isna().all():
            col = _col(ppo, "value/bias_first_token")
        for phase, part in (("early", col.iloc[:n]), ("late", col.iloc[-n:])):
            v = part.dropna()
            out[(phase, bucket)] = float(v.mean()) if len(v) else NAN
    return out
