"""Mean, sample std and the t-distribution 95% confidence interval over seeds (no scipy needed).

    summarize([0.5, 0.6, 0.7]) -> {'n': 3, 'mean': 0.6, 'std': 0.1, 'ci_lo': ..., 'ci_hi': ...}
"""
from __future__ import annotations

import math


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


def summarize(values, level: float = 0.95) -> dict:
    """n, mean, sample std (ddof 1) and the two-sided t interval; NaNs are left out; with n = 1
    std and the interval are NaN (no spread can be estimated from one seed)."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "mean": nan, "std": nan, "ci_lo": nan, "ci_hi": nan}
    mean = sum(xs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": nan, "ci_lo": nan, "ci_hi": nan}
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_lo": mean - half, "ci_hi": mean + half}
