"""Statistics over seeds, as small pure functions (stdlib only: no pandas, no scipy, nothing of the
project). `vapo-report` builds its tables from them and `vapo-ablate --seeds auto` decides from
them (`decide_seeds`); this module is the one place both import, so the rule is written once.

Conventions: NaN (or None) means "no value" and is left out; intervals are two-sided t-intervals
at `level` (0.95); std is the sample std (ddof 1); with fewer than two values there is no spread,
so std, intervals and p-values are NaN; with zero spread and a nonzero mean the t statistic is
undefined, so the p-value is NaN too (a zero-width interval with n >= 2 tells that case apart).

    summarize([0.5, 0.6, 0.7])            -> {'n': 3, 'mean': 0.6, 'std': 0.1, 'ci_lo': ..., 'ci_hi': ...}
    paired_delta({0: .6, 1: .7}, {0: .9, 1: .95})   # per-seed row - reference, t-interval over the differences
    holm([0.01, 0.04, 0.03])              -> [0.03, 0.06, 0.06]
    seeds_needed(mean=2.0, std=3.0)       -> 12 (seeds at which a delta like this one excludes zero)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

NAN = float("nan")


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _values(values) -> list[float]:
    return [float(v) for v in values if _ok(v) and not math.isnan(float(v))]


# ----------------------------------------------------------------------------- Student's t
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_sf2(t: float, df: float) -> float:
    """Two-sided p-value P(|T| >= |t|) of Student's t with df degrees of freedom (exact in the
    tail: computed as I_{df/(df+t^2)}(df/2, 1/2), not as 1 - cdf)."""
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (bisection on the CDF; |error| < 1e-10)."""
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------- one sample, paired, unpaired
def summarize(values, level: float = 0.95) -> dict:
    """n, mean, sample std (ddof 1) and the two-sided t interval of the mean; NaNs are left out;
    with n = 1 std and the interval are NaN (no spread can be estimated from one seed)."""
    xs = _values(values)
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": NAN, "std": NAN, "ci_lo": NAN, "ci_hi": NAN}
    mean = sum(xs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": NAN, "ci_lo": NAN, "ci_hi": NAN}
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_lo": mean - half, "ci_hi": mean + half}


def one_sample_t(values, level: float = 0.95) -> dict:
    """`summarize` plus the two-sided p-value of H0: mean = 0. Zero spread (every value the same):
    p = 1 when every value is 0 (nothing to detect); otherwise p is undefined (NaN), since the t
    statistic divides a nonzero mean by a zero standard error: identical values say nothing about
    how far chance could move them (a quantised score often gives them), so no p-value is claimed
    (the interval is the single point)."""
    s = summarize(values, level)
    if s["n"] < 2:
        return {**s, "p": NAN}
    if s["std"] == 0.0:
        return {**s, "p": 1.0 if s["mean"] == 0.0 else NAN}
    return {**s, "p": t_sf2(s["mean"] / (s["std"] / math.sqrt(s["n"])), s["n"] - 1)}


def paired_delta(row: dict, ref: dict, level: float = 0.95) -> dict:
    """The paired comparison of a row with the reference over the seeds they share.

    `row`, `ref`: {seed: value}. A seed is paired when both have a value there (not NaN).
    Returns pairs (n), mean / std / ci_lo / ci_hi / p of the per-seed differences row - ref
    (a one-sample t over the differences), the paired seeds and the unpaired ones (a value in one
    of the two only: a missing or failed cell)."""
    seeds = sorted(set(row) | set(ref))
    paired = [s for s in seeds if _ok(row.get(s)) and _ok(ref.get(s))]
    unpaired = [s for s in seeds if s not in paired and (_ok(row.get(s)) or _ok(ref.get(s)))]
    t = one_sample_t([row[s] - ref[s] for s in paired], level)
    return {
        "pairs": t["n"],
        "mean": t["mean"],
        "std": t["std"],
        "ci_lo": t["ci_lo"],
        "ci_hi": t["ci_hi"],
        "p": t["p"],
        "seeds": paired,
        "unpaired": unpaired,
    }


def welch_delta(a, b, level: float = 0.95) -> dict:
    """Unpaired difference mean(a) - mean(b) with Welch's t-interval (Welch-Satterthwaite df):
    what the comparison gives when the seeds' shared variation is ignored."""
    xa, xb = _values(a), _values(b)
    if not xa or not xb:
        return {"mean": NAN, "ci_lo": NAN, "ci_hi": NAN, "df": NAN, "p": NAN}
    sa, sb = summarize(xa), summarize(xb)
    mean = sa["mean"] - sb["mean"]
    if len(xa) < 2 or len(xb) < 2:
        return {"mean": mean, "ci_lo": NAN, "ci_hi": NAN, "df": NAN, "p": NAN}
    va, vb = sa["std"] ** 2 / len(xa), sb["std"] ** 2 / len(xb)
    se = math.sqrt(va + vb)
    if se == 0.0:  # zero spread in both: as one_sample_t, p undefined unless the means are equal
        return {"mean": mean, "ci_lo": mean, "ci_hi": mean, "df": NAN, "p": 1.0 if mean == 0.0 else NAN}
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t_ppf(0.5 + level / 2, df) * se
    return {"mean": mean, "ci_lo": mean - half, "ci_hi": mean + half, "df": df, "p": t_sf2(mean / se, df)}


# ----------------------------------------------------------------------------- many comparisons
def holm(pvalues) -> list[float]:
    """Holm's step-down adjustment (family-wise error): the m defined p-values sorted ascending,
    p_adj(i) = max over j <= i of min(1, (m - j + 1) p_(j)) (ranks from 1). NaN stays NaN and is not
    counted in m. Reject H0 at family-wise level a where p_adj <= a."""
    ps = [float(p) if _ok(p) else NAN for p in pvalues]
    defined = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    m = len(defined)
    out = [NAN] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(defined):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def _finite(v) -> bool:
    return _ok(v) and not math.isnan(float(v))


def ranks(values) -> list[float]:
    """Ranks from 1, ties given the mean of the ranks they span. Every value must be a number (no
    NaN: it has no place in an order)."""
    xs = [float(v) for v in values]
    if not all(_finite(x) for x in xs):
        raise ValueError(f"ranks of {xs}: NaN or None has no rank; leave such values out first")
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [NAN] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x, y) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (`ranks`, ties averaged).
    NaN with fewer than 3 pairs, or when either side has a single rank (no spread)."""
    pairs = [(float(a), float(b)) for a, b in zip(x, y) if _finite(a) and _finite(b)]
    if len(pairs) < 3:
        return NAN
    rx, ry = ranks([a for a, _ in pairs]), ranks([b for _, b in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else NAN


def seeds_needed(mean: float, std: float, level: float = 0.95, cap: int = 100):
    """Plug-in sample size: the smallest n >= 2 at which a paired t-interval with this mean and
    spread would exclude zero, i.e. t_{(1+level)/2, n-1} * std / sqrt(n) < |mean|. None when no
    n <= cap does (the delta is within noise at that budget) or when mean is 0 or undefined.
    It assumes the observed mean and std are the true ones, so a fresh set of n seeds resolves the
    delta about half the time; read it as an order of magnitude, not a guarantee."""
    if not _ok(mean) or not _ok(std) or mean == 0.0:
        return None
    if std == 0.0:
        return 2
    for n in range(2, cap + 1):
        if t_ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n) < abs(mean):
            return n
    return None


@dataclass
class SeedDecision:
    """What `vapo-ablate --seeds auto` does next. `seeds`: the total seeds per row for the next
    round, or None to stop. `status`: per row, 'resolved', 'unreachable', 'needs N pairs' or
    'needs 2 pairs'. `reason`: one line for the log."""

    seeds: int | None
    status: dict = field(default_factory=dict)
    reason: str = ""


def decide_seeds(diffs: dict, seeds: int, max_seeds: int, level: float = 0.95) -> SeedDecision:
    """The `--seeds auto` rule. `diffs`: {row: [per-seed differences row - reference over the
    paired seeds]} for the rows of interest; `seeds`: seeds per row run so far.

    A row is resolved when its paired interval excludes zero; unreachable when `seeds_needed`
    finds no n <= max_seeds; otherwise it needs `seeds_needed` pairs (2 when it has fewer than two
    pairs). Next round: enough seeds for the most demanding unresolved row (the missing pairs
    added to `seeds`, at least one more seed), capped at max_seeds; stop when every row is
    resolved or unreachable, or at the cap."""
    status, targets = {}, []
    for row, ds in diffs.items():
        t = one_sample_t(ds, level)
        if t["n"] >= 2 and (t["ci_lo"] > 0 or t["ci_hi"] < 0):
            status[row] = "resolved"
            continue
        need = 2 if t["n"] < 2 else seeds_needed(t["mean"], t["std"], level, cap=max_seeds)
        if need is None:
            status[row] = "unreachable"
            continue
        status[row] = f"needs {need} pairs"
        targets.append(seeds + max(1, need - t["n"]))
    summary = ", ".join(f"{r}: {s}" for r, s in status.items())
    if not targets:
        return SeedDecision(
            None, status, f"stop: every row of interest is resolved or unreachable ({summary})"
        )
    if seeds >= max_seeds:
        return SeedDecision(None, status, f"stop: the cap of {max_seeds} seeds is reached ({summary})")
    nxt = min(max_seeds, max(targets))
    return SeedDecision(nxt, status, f"next: {nxt} seeds per row ({summary})")


# ----------------------------------------------------------------------------- eval curves
def reach_update(updates, scores, threshold: float) -> float:
    """The first update whose score is >= threshold (NaN scores skipped); NaN when never."""
    for u, s in zip(updates, scores):
        if _ok(s) and s >= threshold:
            return float(u)
    return NAN


def curve_auc(updates, scores) -> float:
    """Area under the score curve (trapezoids over the logged points, NaN scores skipped) divided
    by its update range: the mean score over training, in the score's units. NaN with fewer than
    two points or a zero range."""
    pts = [(float(u), float(s)) for u, s in zip(updates, scores) if _ok(s) and _ok(u)]
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return NAN
    area = sum((u1 - u0) * (s0 + s1) / 2.0 for (u0, s0), (u1, s1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def at_budget(costs, scores, budget: float) -> float:
    """The last score logged at a cumulative cost <= budget (the score reached within the budget);
    NaN when none was."""
    best = NAN
    for c, s in zip(costs, scores):
        if _ok(c) and _ok(s) and c <= budget * (1 + 1e-12):
            best = float(s)
    return best
