"""Multi-turn credit diagnostics: how credit crosses the tool observations, per row, from the logs.

Rows of runs on a multi-turn task log (vapo_lit.experience): `value/bias_before_obs` and
`value/bias_after_obs` (V - Monte-Carlo return at the last action token before an observation
span and at the first one after it), `gae/advantage_turn1..turn4plus` (the mean actor advantage of
each policy turn's tokens) and `rollout/observation_spans` (answered tool calls per episode).
Each is averaged over a run's last N PPO iterations, then over the row's seeds. Single-turn runs
log none of these: their report has no such section (and no credit.csv).
"""

from __future__ import annotations

import pandas as pd

from vapo_lit.report.collect import _col, ppo_rows

CREDIT = {
    "tool_calls": "rollout/observation_spans",
    "obs_tokens": "rollout/observation_tokens",
    "bias_before_obs": "value/bias_before_obs",
    "bias_after_obs": "value/bias_after_obs",
    "adv_turn1": "gae/advantage_turn1",
    "adv_turn2": "gae/advantage_turn2",
    "adv_turn3": "gae/advantage_turn3",
    "adv_turn4plus": "gae/advantage_turn4plus",
}
"""Name in credit.csv -> metrics.csv column."""


def credit_frame(logs, order: list, last_n: int) -> pd.DataFrame | None:
    """One line per row: the row, its runs and the CREDIT means; None when no run is multi-turn."""
    if not any("rollout/observation_spans" in log.metrics for log in logs):
        return None
    records = []
    for row in order:
        runs = [log for log in logs if log.row == row]
        rec = {"row": row, "runs": len(runs)}
        for name, col in CREDIT.items():
            per_run = [
                float(s.mean())
                for s in (_col(ppo_rows(log.metrics), col).dropna().iloc[-last_n:] for log in runs)
                if len(s)
            ]
            rec[name] = sum(per_run) / len(per_run) if per_run else float("nan")
        records.append(rec)
    return pd.DataFrame(records, columns=["row", "runs", *CREDIT])


CREDIT_TEXT = (
    "Multi-turn credit, last {n} PPO iterations, mean over seeds: tool calls answered per episode; "
    "value bias V − Monte-Carlo return at the last action token before a tool observation and at the "
    "first one after it (where credit crosses the environment's text); mean actor advantage (whitened) of "
    "each policy turn's tokens. Critic-free rows have no value bias; their advantage is the group-"
    "normalised outcome."
)
