"""The report's multi-turn credit section (vapo_lit/report/credit.py): per-row means of the last N
PPO iterations' credit diagnostics, mean over seeds, value-pretraining rows left out; absent for
single-turn runs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from vapo_lit.report.credit import CREDIT, credit_frame
from vapo_lit.report.logs import RunLog
from vapo_lit.report.table import pretty


def log(row, seed, values, pretrain=2):
    """A run: `pretrain` value-pretraining rows (value 100, must be ignored), then one PPO row per value."""
    n = pretrain + len(values)
    df = pd.DataFrame({"step": range(n), "train/value_pretraining": [1] * pretrain + [0] * len(values)})
    for name, col in CREDIT.items():
        df[col] = [100.0] * pretrain + [v + len(name) for v in values]  # a different number per column
    return RunLog(Path(f"/x/{row}-{seed}"), row, seed, 4, len(values), [], "gae", df)


def test_last_n_ppo_iterations_then_mean_over_seeds():
    logs = [
        log("vapo", 0, [1.0, 2.0, 3.0, 5.0]),
        log("vapo", 1, [0.0, 0.0, 7.0, 9.0]),
        log("vapo-obs-step", 0, [4.0]),
    ]
    frame = credit_frame(logs, ["vapo", "vapo-obs-step"], last_n=2)
    rec = frame.set_index("row")
    for name in CREDIT:
        assert math.isclose(rec.loc["vapo", name], ((3 + 5) / 2 + (7 + 9) / 2) / 2 + len(name))
        assert math.isclose(rec.loc["vapo-obs-step", name], 4.0 + len(name))
    assert list(rec["runs"]) == [2, 1]


def test_a_column_a_row_never_logged_is_nan():
    a = log("grpo+x", 0, [1.0, 2.0])
    a.metrics = a.metrics.drop(columns=["value/bias_after_obs"])
    frame = credit_frame([a], ["grpo+x"], last_n=5)
    assert math.isnan(frame["bias_after_obs"][0]) and frame["adv_turn1"][0] == 1.5 + len("adv_turn1")


def test_single_turn_runs_have_no_credit_section():
    df = pd.DataFrame({"step": [0, 1], "train/value_pretraining": [0, 0], "policy/entropy": [1.0, 2.0]})
    assert credit_frame([RunLog(Path("/x"), "vapo", 0, 4, 1, [], "gae", df)], ["vapo"], 10) is None


def test_row_names_of_the_observation_settings():
    assert pretty("vapo-obs-step") == "VAPO (full), observations: step"
    assert pretty("vapo-no-value_pretraining-obs-zero") == "w/o value_pretraining, observations: zero"
    assert pretty("vapo") == "VAPO (full)"
