"""The report's critic-quality section (vapo_lit/report/critic.py): per-run medians over the right
iterations (the last value-pretraining ones, the first CALIBRATION_UPDATES and the last N PPO ones),
then the mean over seeds; a cached value-pretraining phase read from its logged summary; rows
without a critic left out; the figure written."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from vapo_lit.config import COMPONENTS
from vapo_lit.report import critic
from vapo_lit.report.collect import CALIBRATION_UPDATES
from vapo_lit.report.logs import RunLog

E = CALIBRATION_UPDATES


def run(
    row,
    seed,
    *,
    vp=12,
    n_ppo=15,
    oracle=True,
    components=COMPONENTS,
    cached=False,
    offset=0.0,
    end=None,
    ppo_ceiling=0.6,
    late_ceiling=None,
):
    """vp value-pretraining rows whose EV at VP iteration i is 0.01 * i + offset, then PPO rows with
    EV 0.5 + 0.01 * i; the true-value columns likewise shifted; the ceiling 0.6 (0.7 during VP)."""
    n = vp + n_ppo
    cols = {
        "step": list(range(1, n + 1)),
        "train/iteration": list(range(1, n + 1)),
        "train/ppo_update": [0] * vp + list(range(1, n_ppo + 1)),
        "train/value_pretraining": [1] * vp + [0] * n_ppo,
        "value/explained_variance": [0.01 * i + offset for i in range(vp)]
        + [0.5 + 0.01 * i for i in range(n_ppo)],
    }
    if oracle:
        cols["value/explained_variance_oracle"] = [0.02 * i for i in range(vp)] + [
            0.8 + 0.001 * i for i in range(n_ppo)
        ]
        late = ppo_ceiling if late_ceiling is None else late_ceiling  # the last 4 PPO iterations
        cols["value/oracle_ceiling"] = [0.7] * vp + [ppo_ceiling] * (n_ppo - 4) + [late] * 4
    if cached:
        cols["value_pretrain/steps"] = [50.0] + [float("nan")] * (n - 1)
        cols["value_pretrain/final_ev"] = [0.33] + [float("nan")] * (n - 1)
        for k, v in (end or {}).items():
            cols[f"value_pretrain/{k}"] = [v] + [float("nan")] * (n - 1)
    return RunLog(Path(f"/x/{row}-{seed}"), row, seed, 4, n_ppo, list(components), "gae", pd.DataFrame(cols))


def median(xs):
    return float(pd.Series(xs).median())


def test_the_critic_frame_against_hand_computed_medians():
    logs = [
        run("vapo", 0),
        run("vapo", 1, offset=0.1),
        run("vapo-oracle", 0, vp=0, components=COMPONENTS[1:]),
    ]
    frame = critic.critic_frame(logs, ["vapo", "vapo-oracle"], last_n=4).set_index("row")
    vp_end = [median([0.01 * i + off for i in range(12)][-critic.LAST_VP :]) for off in (0.0, 0.1)]
    assert frame.loc["vapo", "ev_vp_end"] == pytest.approx(sum(vp_end) / 2)
    assert frame.loc["vapo", "ev_early"] == pytest.approx(median([0.5 + 0.01 * i for i in range(E)]))
    assert frame.loc["vapo", "ev_late"] == pytest.approx(median([0.5 + 0.01 * i for i in range(15)][-4:]))
    assert frame.loc["vapo", "ev_oracle_vp_end"] == pytest.approx(
        median([0.02 * i for i in range(12)][-critic.LAST_VP :])
    )
    assert frame.loc["vapo", "ceiling"] == pytest.approx(
        0.6
    )  # the run's median: 15 PPO rows at 0.6, 12 at 0.7
    assert frame.loc["vapo", "vp_end_of_ceiling"] == pytest.approx(sum(v / 0.7 for v in vp_end) / 2)
    assert frame.loc["vapo", "vp_end_of_ceiling_min"] == pytest.approx(min(vp_end) / 0.7)  # seed 0's
    assert frame.loc["vapo", "vp_iterations"] == 12 and frame.loc["vapo", "runs"] == 2
    assert frame.loc["vapo-oracle", "vp_iterations"] == 0 and math.isnan(
        frame.loc["vapo-oracle", "ev_vp_end"]
    )


def test_the_share_of_the_ceiling_held_at_the_end_of_ppo():
    """EV over the last N PPO iterations divided by the ceiling's median over the same iterations, per
    run; the row's mean and its smallest seed (the critic's fit must hold on every seed)."""
    logs = [run("vapo", 0, late_ceiling=0.8), run("vapo", 1, late_ceiling=0.9)]  # 0.6 before the last 4
    frame = critic.critic_frame(logs, ["vapo"], last_n=4).set_index("row")
    late = median([0.5 + 0.01 * i for i in range(15)][-4:])
    assert frame.loc["vapo", "late_of_ceiling"] == pytest.approx((late / 0.8 + late / 0.9) / 2)
    assert frame.loc["vapo", "late_of_ceiling_min"] == pytest.approx(late / 0.9)
    assert "late / ceiling (min)" in critic.markdown_table(frame.reset_index())


def test_a_cached_value_pretraining_phase_is_read_from_its_logged_summary():
    frame = critic.critic_frame([run("vapo", 0, vp=0, cached=True)], ["vapo"], last_n=4).set_index("row")
    assert frame.loc["vapo", "vp_iterations"] == 50
    old = critic.critic_frame([run("vapo", 0, vp=0)], ["vapo"], last_n=4).set_index(
        "row"
    )  # logged before the summary
    assert math.isnan(old.loc["vapo", "vp_iterations"]) and math.isnan(old.loc["vapo", "ev_vp_end"])
    assert math.isnan(frame.loc["vapo", "vp_end_of_ceiling"])  # an entry without its end: no share
    # an entry that kept where its phase ended: its medians, and the share of the ceiling then
    end = {"ev_end": 0.41, "ev_oracle_end": 0.55, "ceiling_end": 0.62}
    kept = critic.critic_frame([run("vapo", 0, vp=0, cached=True, end=end)], ["vapo"], last_n=4).set_index(
        "row"
    )
    assert (
        kept.loc["vapo", "ev_vp_end"] == pytest.approx(0.41) and kept.loc["vapo", "ev_oracle_vp_end"] == 0.55
    )
    assert kept.loc["vapo", "vp_end_of_ceiling"] == pytest.approx(0.41 / 0.62)


def test_a_cached_entry_with_only_the_last_batch_has_no_vp_end():
    """`value_pretrain/final_ev` is one batch's explained variance, not the median of the last LAST_VP
    iterations that 'EV VP end' is: a run whose cache entry kept only it gets NaN (shown as –), and a
    row's mean is over the seeds that have a median."""
    only_last = run("vapo", 0, vp=0, cached=True)  # final_ev 0.33, no ev_end
    assert not math.isnan(only_last.metrics["value_pretrain/final_ev"].iloc[0])
    alone = critic.critic_frame([only_last], ["vapo"], last_n=4).set_index("row")
    for col in ("ev_vp_end", "ev_oracle_vp_end", "vp_end_of_ceiling", "vp_end_of_ceiling_min"):
        assert math.isnan(alone.loc["vapo", col]), col
    assert "| – | 0.52 |" in critic.markdown_table(
        alone.reset_index()
    )  # EV VP end shown as –, EV early beside it
    ran = run("vapo", 1)  # this seed ran its phase: its median counts, alone
    mixed = critic.critic_frame([only_last, ran], ["vapo"], last_n=4).set_index("row")
    assert mixed.loc["vapo", "ev_vp_end"] == pytest.approx(
        median([0.01 * i for i in range(12)][-critic.LAST_VP :])
    )
    assert "kept only the last batch's EV" in critic.CRITIC_TEXT and "shows –" in critic.CRITIC_TEXT


def test_rows_without_a_critic_are_left_out_and_no_critic_means_no_section():
    grpo = run("grpo", 0, vp=0, oracle=False)
    grpo.metrics["value/explained_variance"] = float("nan")
    frame = critic.critic_frame([run("vapo", 0), grpo], ["vapo", "grpo"], last_n=4)
    assert list(frame["row"]) == ["vapo"]
    no_critic = run("grpo", 0, vp=0, oracle=False)
    del no_critic.metrics["value/explained_variance"]
    assert critic.critic_frame([no_critic], ["grpo"], last_n=4) is None


def test_the_table_and_the_figure(tmp_path):
    logs = [run("vapo", 0), run("vapo", 1, offset=0.1)]
    frame = critic.critic_frame(logs, ["vapo"], last_n=4)
    text = critic.markdown_table(frame)
    mean, low = frame["vp_end_of_ceiling"][0], frame["vp_end_of_ceiling_min"][0]
    assert low < mean and f"| {100 * mean:.0f}% ({100 * low:.0f}%) |" in text
    critic.plot(logs, ["vapo"], tmp_path / "critic_quality.png")
    assert (tmp_path / "critic_quality.png").stat().st_size > 10_000


def test_the_share_held_through_ppo_is_the_lowest_block_against_a_float64_reference():
    """'lowest / ceiling': per block of N PPO iterations counted back from the last, the EV's median over
    the ceiling's median in the block; the smallest block per run (a remainder at the start left out), then
    the row's mean and its smallest seed. Against statistics.median on random inputs."""
    import random
    import statistics

    def reference(ev, ceiling, n):
        m = len(ev) - len(ev) % n
        if m == 0:
            blocks = [range(len(ev))]
        else:
            blocks = [range(len(ev) - m + i, len(ev) - m + i + n) for i in range(0, m, n)]
        return min(
            statistics.median(ev[i] for i in b) / statistics.median(ceiling[i] for i in b) for b in blocks
        )

    rng = random.Random(7)
    logs, expected = [], []
    for seed, n_ppo in enumerate((23, 20, 4)):
        log = run("vapo", seed, n_ppo=n_ppo)
        ppo = log.metrics["train/value_pretraining"] == 0
        ev = [rng.uniform(-0.2, 0.6) for _ in range(n_ppo)]
        ceiling = [rng.uniform(0.4, 0.8) for _ in range(n_ppo)]
        log.metrics.loc[ppo, "value/explained_variance"] = ev
        log.metrics.loc[ppo, "value/oracle_ceiling"] = ceiling
        logs.append(log)
        expected.append(reference(ev, ceiling, 5))
    frame = critic.critic_frame(logs, ["vapo"], last_n=5).set_index("row")
    assert frame.loc["vapo", "lowest_of_ceiling"] == pytest.approx(sum(expected) / 3, rel=1e-12)
    assert frame.loc["vapo", "lowest_of_ceiling_min"] == pytest.approx(min(expected), rel=1e-12)
    one = critic.critic_frame(logs[:1], ["vapo"], last_n=5).set_index("row")
    assert one.loc["vapo", "lowest_of_ceiling"] <= one.loc["vapo", "late_of_ceiling"]  # the late block is one
    assert "lowest / ceiling (min)" in critic.markdown_table(frame.reset_index())
    no_truth = run("vapo", 0, oracle=False)
    assert math.isnan(critic.critic_frame([no_truth], ["vapo"], last_n=5)["lowest_of_ceiling"][0])
