"""The report's statistics (vapo_lit.seed_stats) against references: scipy's values (computed
once with scipy 1.17.1 and written here, since scipy is not a dependency), float64 numpy
recomputations on random inputs, and hand-computed / closed-form numbers.

    .venv/bin/python -m pytest tests/test_report_stats.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from vapo_lit import seed_stats as stats

# scipy.stats.t.ppf(0.975, df), df = 1..30 (scipy 1.17.1)
T975 = [
    12.706204736174694,
    4.302652729749462,
    3.1824463052837078,
    2.7764451051977934,
    2.5705818356363146,
    2.4469118511449786,
    2.364624251592784,
    2.306004135204166,
    2.262157162798205,
    2.228138851986274,
    2.200985160091639,
    2.1788128296672284,
    2.1603686564627913,
    2.144786687917804,
    2.131449545559776,
    2.1199052992212546,
    2.1098155778333156,
    2.1009220402410382,
    2.0930240544083087,
    2.085963447265864,
    2.0796138447276795,
    2.0738730679040254,
    2.0686576104190486,
    2.0638985616280245,
    2.0595385527532972,
    2.0555294386428735,
    2.0518305164802846,
    2.0484071417952454,
    2.045229642132703,
    2.0422724563012378,
]
# 2 * scipy.stats.t.sf(t, df)
SF2 = [
    (2.5, 3, 0.08770664700806556),
    (0.7, 1, 0.6111997755715705),
    (4.0, 9, 0.0031104283103858543),
    (12.0, 4, 0.000276428548502973),
    (1.96, 1000, 0.050273184955748736),
]
A = [61.2, 80.5, 44.9, 70.3, 55.0]
B = [92.1, 93.4, 90.8, 94.0, 91.7]
# scipy.stats.ttest_rel(A, B): statistic, pvalue, confidence_interval(0.95)
REL = (-5.346209185508484, 0.005900633073460191, -45.61027699177288, -14.42972300822712)
# scipy.stats.ttest_ind(A, B, equal_var=False): statistic, pvalue, df, confidence_interval(0.95)
WELCH = (-4.87255487535234, 0.007844412799252725, 4.071226618051642, -47.00840487755056, -13.03159512244946)


def test_t_quantiles_and_tails_equal_scipy():
    for df, q in enumerate(T975, start=1):
        assert stats.t_ppf(0.975, df) == pytest.approx(q, abs=1e-8)
    for t, df, p in SF2:
        assert stats.t_sf2(t, df) == pytest.approx(p, rel=1e-9)
        assert stats.t_sf2(-t, df) == pytest.approx(p, rel=1e-9)


def test_summary_is_the_textbook_t_interval():
    s = stats.summarize([1.0, 2.0, 4.0])
    assert (
        s["n"] == 3
        and s["mean"] == pytest.approx(7 / 3)
        and s["std"] == pytest.approx(np.std([1, 2, 4], ddof=1))
    )
    assert s["ci_hi"] - s["mean"] == pytest.approx(T975[1] * s["std"] / math.sqrt(3))
    one = stats.summarize([0.5, float("nan"), None])
    assert one["n"] == 1 and math.isnan(one["std"]) and math.isnan(one["ci_lo"])
    assert stats.summarize([])["n"] == 0


def test_paired_delta_equals_scipy_ttest_rel():
    d = stats.paired_delta(dict(enumerate(A)), dict(enumerate(B)))
    assert d["pairs"] == 5 and d["mean"] == pytest.approx(np.mean(np.subtract(A, B)))
    assert (d["ci_lo"], d["ci_hi"]) == pytest.approx(REL[2:], rel=1e-9)
    assert d["p"] == pytest.approx(REL[1], rel=1e-8)


def test_paired_delta_equals_float64_recomputation_on_random_inputs():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 31))
        ref = rng.normal(50, 20, n)
        row = ref + rng.normal(rng.normal(0, 3), rng.uniform(0.1, 5), n)
        diffs = row.astype(np.float64) - ref
        mean, sd = diffs.mean(), diffs.std(ddof=1)
        half = T975[n - 2] * sd / math.sqrt(n)
        d = stats.paired_delta(dict(enumerate(row)), dict(enumerate(ref)))
        assert d["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-12)
        assert d["std"] == pytest.approx(sd, rel=1e-10)
        assert (d["ci_lo"], d["ci_hi"]) == pytest.approx((mean - half, mean + half), rel=1e-9, abs=1e-9)
        assert (d["ci_lo"] > 0 or d["ci_hi"] < 0) == (d["p"] < 0.05)  # the interval and the test agree


def test_paired_delta_pairs_only_shared_seeds_and_names_the_others():
    d = stats.paired_delta({0: 1.0, 1: 2.0, 2: float("nan"), 3: 5.0}, {0: 0.5, 1: 1.0, 2: 3.0, 4: 1.0})
    assert d["pairs"] == 2 and d["seeds"] == [0, 1] and d["unpaired"] == [2, 3, 4]
    assert d["mean"] == pytest.approx(0.75)
    zero = stats.paired_delta({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0})  # a bit-identical row
    assert zero["mean"] == 0.0 and zero["ci_lo"] == zero["ci_hi"] == 0.0 and zero["p"] == 1.0
    one = stats.paired_delta({0: 1.0}, {0: 0.0})
    assert one["pairs"] == 1 and math.isnan(one["ci_lo"]) and math.isnan(one["p"])


def test_identical_nonzero_differences_have_no_p_value():
    """Every seed's difference the same nonzero number: the t statistic is a nonzero mean over a
    zero standard error, undefined, so p is NaN (not 0, which would read as a certain effect); the
    interval is that one point. All differences 0 keep p = 1 (nothing to detect). Welch likewise
    when both samples have zero spread. Holm leaves the undefined p out of its family."""
    d = stats.paired_delta({0: 63.28125, 1: 61.71875, 2: 64.0625}, {0: 62.5, 1: 60.9375, 2: 63.28125})
    assert d["pairs"] == 3 and d["mean"] == 0.78125 and d["std"] == 0.0
    assert d["ci_lo"] == d["ci_hi"] == 0.78125 and math.isnan(d["p"])
    for values in ([0.8, 0.8], [-2.5, -2.5, -2.5, -2.5]):
        t = stats.one_sample_t(values)
        assert t["std"] == 0.0 and t["mean"] == values[0] and math.isnan(t["p"]), (values, t)
    assert stats.one_sample_t([0.0, 0.0, 0.0])["p"] == 1.0
    w = stats.welch_delta([3.0, 3.0], [1.0, 1.0, 1.0])
    assert w["mean"] == w["ci_lo"] == w["ci_hi"] == 2.0 and math.isnan(w["p"])
    assert stats.welch_delta([1.0, 1.0], [1.0, 1.0])["p"] == 1.0
    adj = stats.holm([0.01, d["p"], 0.04])
    assert adj[0] == pytest.approx(0.02) and math.isnan(adj[1]) and adj[2] == pytest.approx(0.04)


def test_welch_equals_scipy():
    w = stats.welch_delta(A, B)
    assert w["mean"] == pytest.approx(np.mean(A) - np.mean(B))
    assert w["df"] == pytest.approx(WELCH[2], rel=1e-10)
    assert (w["ci_lo"], w["ci_hi"]) == pytest.approx(WELCH[3:], rel=1e-8)
    assert w["p"] == pytest.approx(WELCH[1], rel=1e-7)


def test_shared_seed_effect_paired_interval_excludes_zero_where_unpaired_does_not():
    """Rows share a large per-seed effect and differ by a small constant: pairing removes the
    shared part (the issue's case: 2 seeds gave an unpaired interval of [-101.9, 225.7])."""
    rng = np.random.default_rng(1)
    seed_effect = rng.normal(0, 20, 5)  # what a seed shares across rows
    ref = 70 + seed_effect
    row = ref - 2.0 + rng.normal(0, 0.3, 5)  # 2 points worse, little own noise
    paired = stats.paired_delta(dict(enumerate(row)), dict(enumerate(ref)))
    unpaired = stats.welch_delta(row, ref)
    assert paired["ci_hi"] < 0  # resolved
    assert unpaired["ci_lo"] < 0 < unpaired["ci_hi"]  # not resolved
    assert paired["mean"] == pytest.approx(unpaired["mean"])  # same point estimate when every seed pairs


def _holm_reference(ps):
    """Holm by its definition, written independently: reject in order of p while p_(j) <= a/(m-j+1);
    the adjusted p-value of H_i is the smallest a at which H_i is rejected."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    for rank, i in enumerate(order):
        out[i] = min(1.0, max((m - j) * ps[order[j]] for j in range(rank + 1)))
    return out


def test_holm_equals_reference():
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])  # by hand
    rng = np.random.default_rng(2)
    for _ in range(100):
        ps = list(rng.uniform(0, 0.2, int(rng.integers(1, 12))))
        assert stats.holm(ps) == pytest.approx(_holm_reference(ps), abs=1e-15)
    out = stats.holm([0.02, float("nan"), 0.04])  # undefined p: not in the family
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1, monotone in p


def _closed_form_seeds(mean, sd, cap=31):
    """min n >= 2 with t_{0.975, n-1} sd / sqrt(n) < |mean|, from scipy's quantiles."""
    for n in range(2, cap + 1):
        if T975[n - 2] * sd / math.sqrt(n) < abs(mean):
            return n
    return None


def test_seeds_needed_matches_the_closed_form():
    assert stats.seeds_needed(2.0, 3.0) == 12  # t(11) 3/sqrt(12) = 1.906 < 2 < t(10) 3/sqrt(11) = 2.015
    rng = np.random.default_rng(3)
    for _ in range(60):
        mean, sd = rng.normal(0, 5), rng.uniform(0.1, 15)
        assert stats.seeds_needed(mean, sd, cap=31) == _closed_form_seeds(mean, sd)
    assert stats.seeds_needed(0.0, 1.0) is None and stats.seeds_needed(float("nan"), 1.0) is None
    assert stats.seeds_needed(1.0, 0.0) == 2
    assert stats.seeds_needed(0.1, 10.0, cap=20) is None  # within noise at any affordable budget
    # consistency with the interval: at the returned n the interval excludes zero, at n - 1 it does not
    n = stats.seeds_needed(-1.5, 2.5)
    assert T975[n - 2] * 2.5 / math.sqrt(n) < 1.5 <= T975[n - 3] * 2.5 / math.sqrt(n - 1)


def test_decide_seeds_rule():
    # resolved (interval excludes 0), unreachable (0 delta), needs more (plug-in estimate 12)
    resolved = [-10.0, -11.0, -9.0]
    zero = [0.0, 0.0, 0.0]
    d = stats.decide_seeds({"a": resolved, "b": zero}, seeds=3, max_seeds=10)
    assert d.seeds is None and d.status == {"a": "resolved", "b": "unreachable"}
    noisy = [2.0 + x for x in (3.0, -3.0, 0.0)]  # mean 2, sd 3 -> 12 pairs needed
    d = stats.decide_seeds({"a": resolved, "c": noisy}, seeds=3, max_seeds=20)
    assert d.status["c"] == "needs 12 pairs" and d.seeds == 12
    d = stats.decide_seeds({"c": noisy}, seeds=3, max_seeds=10)
    assert d.status["c"] == "unreachable" and d.seeds is None
    d = stats.decide_seeds({"c": noisy[:1]}, seeds=3, max_seeds=10)  # a failed cell left one pair
    assert d.status["c"] == "needs 2 pairs" and d.seeds == 4
    d = stats.decide_seeds(
        {"c": [1.0, 2.0, 3.0]}, seeds=4, max_seeds=6
    )  # needs 4 pairs, has 3 (a failed cell)
    assert d.status["c"] == "needs 4 pairs" and d.seeds == 5
    d = stats.decide_seeds({"c": [1.0, 2.0, 3.0]}, seeds=6, max_seeds=6)
    assert d.seeds is None and "cap of 6 seeds" in d.reason


def test_curve_functions():
    ups, scores = [0, 2, 4, 10], [10.0, 30.0, float("nan"), 50.0]
    auc = ((30 + 10) / 2 * (2 - 0) + (50 + 30) / 2 * (10 - 2)) / 10  # trapezoids over the finite points
    assert stats.curve_auc(ups, scores) == pytest.approx(auc)
    assert stats.reach_update(ups, scores, 30.0) == 2 and math.isnan(stats.reach_update(ups, scores, 60.0))
    assert stats.reach_update(ups, scores, 5.0) == 0  # the base policy already reaches it
    assert math.isnan(stats.curve_auc([0], [1.0]))
    costs = [0.0, 100.0, 200.0, 300.0]
    assert stats.at_budget(costs, [1.0, 2.0, 3.0, 4.0], 250.0) == 3.0
    assert stats.at_budget(costs, [1.0, 2.0, 3.0, 4.0], 300.0) == 4.0
    assert math.isnan(stats.at_budget([10.0], [1.0], 5.0))


def test_stats_module_stays_pure():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(stats))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "dataclasses"}


@pytest.mark.parametrize("seed", range(5))
def test_spearman_matches_a_reference_with_and_without_ties(seed):
    """Reference: NumPy's Pearson correlation of pandas' average ranks, in float64."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    for n in (3, 7, 12):
        x = rng.normal(size=n)
        y = rng.integers(0, 4, size=n).astype(float) if seed % 2 else x + rng.normal(size=n)  # ties when odd
        rx, ry = (
            pd.Series(x).rank(method="average").to_numpy(),
            pd.Series(y).rank(method="average").to_numpy(),
        )
        assert stats.ranks(y.tolist()) == ry.tolist()
        want = np.corrcoef(rx, ry)[0, 1] if ry.std() > 0 else float("nan")
        got = stats.spearman(x.tolist(), y.tolist())
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, abs=1e-12)


def test_ranks_average_ties_and_spearman_edge_cases():
    assert stats.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert stats.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert math.isnan(stats.spearman([1, 2], [1, 2]))  # fewer than 3 pairs
    assert math.isnan(stats.spearman([1, 2, 3], [5, 5, 5]))  # no spread on one side
    assert stats.spearman([1, float("nan"), 2, 3], [1, 9, 2, 3]) == pytest.approx(1.0)  # NaN pairs left out
    assert stats.spearman([1, 2, 3, 4], [np.float32("nan"), 3, 2, 1]) == pytest.approx(
        -1.0
    )  # NumPy's NaN too
    with pytest.raises(ValueError, match="NaN or None has no rank"):
        stats.ranks([1.0, float("nan"), 0.5])
