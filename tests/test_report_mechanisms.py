"""The report's length-mechanism section (vapo_lit/report/mechanisms.py): per-run means over the
right PPO iterations (first CALIBRATION_UPDATES, last N, all), then the mean over seeds; the
variance ratio as a ratio of per-run means; value-pretraining rows left out; absent for runs logged
without the length columns (so the committed older reports are unchanged, test_committed_reports)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from vapo_lit.report.collect import CALIBRATION_UPDATES, LONG_BIAS_BUCKETS, BIAS_BUCKETS, bias_buckets
from vapo_lit.report.logs import RunLog
from vapo_lit.report.mechanisms import markdown_tables, mechanism_frames

E = CALIBRATION_UPDATES


def log(row, seed, n_ppo=12, pretrain=3, scale=1.0):
    """`pretrain` value-pretraining rows holding 1000 (must never be read), then n_ppo PPO rows
    whose value at PPO iteration i is a known function of i."""
    i = list(range(n_ppo))
    pre = [1000.0] * pretrain
    cols = {
        "step": list(range(pretrain + n_ppo)),
        "train/value_pretraining": [1] * pretrain + [0] * n_ppo,
        "value/bias_pos_first": pre + [scale * (x - 5) for x in i],
        "gae/lambda_policy_min": pre + [0.9 + 0.001 * x for x in i],
        "gae/lambda_policy_max": pre + [0.99 + 0.0001 * x for x in i],
        "policy/clipfrac_low": pre + [0.01 * x for x in i],
        "policy/clipfrac_high": pre + [0.0 if x % 3 else 0.02 for x in i],
        "policy/entropy": pre + [1.0 - 0.05 * x for x in i],
        "gae/lambda_policy_len_20-49": pre + [0.95] * n_ppo,
        "gae/adv_bias_len_20-49": pre + [scale * x for x in i],
        "gae/adv_var_len_20-49": pre + [2.0] * n_ppo,
        "gae/adv_var_mc_len_20-49": pre + [4.0 + x for x in i],
        "policy/loss_share_len_20-49": pre + [0.25] * n_ppo,
        "policy/loss_share_len_ge1000": pre + [0.75] * n_ppo,
    }
    return RunLog(Path(f"/x/{row}-{seed}"), row, seed, 4, n_ppo, [], "gae", pd.DataFrame(cols))


def test_row_and_length_means_over_the_right_iterations():
    logs = [log("vapo", 0), log("vapo", 1, scale=3.0), log("vanilla_ppo", 0)]
    mech, by_length = mechanism_frames(logs, ["vapo", "vanilla_ppo"], last_n=4)
    r = mech.set_index("row").loc["vapo"]
    first = [x - 5 for x in range(E)]
    assert math.isclose(r["v0_bias_early"], (sum(first) / E + 3 * sum(first) / E) / 2)
    assert math.isclose(r["lambda_min"], 0.9) and math.isclose(r["lambda_max"], 0.99 + 0.0011)
    assert math.isclose(r["clipfrac_low"], 0.01 * sum(range(12)) / 12)
    assert math.isclose(r["clip_high_binding"], 4 / 12)  # iterations 0, 3, 6, 9
    assert math.isclose(r["entropy_early"], sum(1.0 - 0.05 * x for x in range(E)) / E)
    assert math.isclose(r["entropy_late"], sum(1.0 - 0.05 * x for x in range(8, 12)) / 4)
    assert int(r["runs"]) == 2
    b = by_length.set_index(["row", "bucket"])
    assert list(by_length["bucket"].unique()) == ["20-49", "ge1000"]  # length order, only buckets logged
    v = b.loc[("vapo", "20-49")]
    assert math.isclose(v["adv_bias_early"], (sum(range(E)) / E) * (1 + 3) / 2)
    assert math.isclose(v["adv_bias_late"], (sum(range(8, 12)) / 4) * (1 + 3) / 2)
    assert math.isclose(v["adv_var_ratio_early"], 2.0 / (sum(4.0 + x for x in range(E)) / E))
    assert math.isclose(v["adv_var_ratio_late"], 2.0 / (sum(4.0 + x for x in range(8, 12)) / 4))
    assert math.isclose(v["loss_share"], 0.25) and math.isclose(b.loc[("vapo", "ge1000")]["loss_share"], 0.75)
    assert math.isnan(b.loc[("vapo", "ge1000")]["adv_bias_early"])  # never logged for that bucket
    tables = markdown_tables(mech, by_length)
    assert len(tables) == 5 and "33%" in tables[0] and "25%" in tables[2] and "75%" in tables[2]


def test_critic_free_rows_have_no_advantage_numbers():
    a = log("grpo+x", 0)
    a.metrics = a.metrics.drop(columns=[c for c in a.metrics if c.startswith(("gae/", "value/"))])
    mech, by_length = mechanism_frames([a], ["grpo+x"], last_n=4)
    assert math.isnan(mech["v0_bias_early"][0]) and math.isnan(mech["lambda_min"][0])
    assert by_length["bucket"].tolist() == ["20-49", "ge1000"]  # the loss share is all they have
    assert by_length["adv_bias_early"].isna().all() and by_length["lambda_policy"].isna().all()
    assert by_length["loss_share"].tolist() == [0.25, 0.75]


def test_runs_without_the_length_columns_have_no_section():
    df = pd.DataFrame(
        {
            "step": [0, 1],
            "train/value_pretraining": [0, 0],
            "policy/entropy": [1.0, 2.0],
            "value/bias_pos_ge128": [0.1, 0.2],
        }
    )
    logs = [RunLog(Path("/x"), "vapo", 0, 4, 1, [], "gae", df)]
    assert mechanism_frames(logs, ["vapo"], 10) is None
    assert bias_buckets(logs) == BIAS_BUCKETS


@pytest.mark.parametrize("col", ["value/bias_pos_128-511", "value/bias_pos_ge512"])
def test_position_buckets_past_128_tokens_switch_to_the_long_edges(col):
    df = pd.DataFrame({"step": [0], col: [0.1]})
    assert bias_buckets([RunLog(Path("/x"), "vapo", 0, 4, 1, [], "gae", df)]) == LONG_BIAS_BUCKETS


def test_mechanism_figures_are_written(tmp_path):
    from vapo_lit.report.figures import MECHANISM_FIGURES, NAMES, plot_all

    logs = [log("vapo", 0), log("vanilla_ppo", 0)]
    for lg in logs:
        lg.metrics["train/ppo_update"] = (lg.metrics["step"] - 2).clip(lower=0)
    calibration = {"bias": {}, "vp": {}, "buckets": BIAS_BUCKETS}
    written = plot_all(
        logs,
        ["vapo", "vanilla_ppo"],
        tmp_path,
        4,
        {"tokens": 1.0, "seconds": 1.0},
        calibration,
        mechanisms=True,
    )
    assert [p.name for p in written] == [f"{n}.png" for n in (*NAMES, *MECHANISM_FIGURES)]
    assert all(p.stat().st_size > 1000 for p in written)
    assert [p.name for p in plot_all(logs, ["vapo"], tmp_path / "old", 4, {}, calibration)] == [
        f"{n}.png" for n in NAMES
    ]
