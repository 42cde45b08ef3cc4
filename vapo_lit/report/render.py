"""table.csv's numbers as Markdown and LaTeX tables, and the notes printed under them.

Every number is formatted with a fixed number of digits (no locale, no timestamps), so the same
CSVs always give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from vapo_lit import seed_stats as stats
from vapo_lit.protocol import Endpoint
from vapo_lit.report.table import PAPER_DROPS, pretty, resolved

DASH = "–"


@dataclass
class Context:
    """What the formatting needs besides the table."""

    k: int
    last_n: int
    threshold: float
    reference: str | None
    token_budget: float
    time_budget: float
    max_seeds: int
    endpoint: Endpoint = Endpoint(1)
    """The primary endpoint: what the tables' "final" columns hold (protocol.py)."""


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x, digits: int = 1, signed: bool = False) -> str:
    if _nan(x):
        return DASH
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def pval(p) -> str:
    if _nan(p):
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"


UNDEFINED_P = "n/a ‡"
"""A Holm p cell whose paired t statistic is undefined (zero spread; see `zero_spread_note`)."""


def zero_spread(rec, m: str) -> bool:
    """Two or more paired seeds whose differences row - reference are all the same nonzero number:
    the interval is one point and the t statistic divides by a zero standard error, so
    `seed_stats.one_sample_t` gives no p-value (NaN), and Holm leaves the row out of its family."""
    pairs, lo, hi = rec[f"delta_{m}_pairs"], rec[f"delta_{m}_ci_lo"], rec[f"delta_{m}_ci_hi"]
    return not _nan(pairs) and pairs >= 2 and _nan(rec[f"delta_{m}_p"]) and not _nan(lo) and lo == hi


def holm_p(rec, m: str) -> str:
    return UNDEFINED_P if zero_spread(rec, m) else pval(rec[f"delta_{m}_p_holm"])


def tokens(x) -> str:
    if _nan(x):
        return DASH
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def duration(seconds) -> str:
    """Wall time: seconds below two minutes, minutes below two hours, else hours."""
    if _nan(seconds):
        return DASH
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def spread(rec, m: str, digits: int = 1) -> str:
    n = rec["n"]
    if n == 0:
        return DASH
    if n == 1:
        return f"{num(rec[f'{m}_mean'], digits)} (n=1)"
    return f"{num(rec[f'{m}_mean'], digits)} ± {num(rec[f'{m}_std'], digits)}"


def delta(rec, m: str, ctx: Context, digits: int = 1) -> str:
    if rec["row"] == ctx.reference:
        return "—"
    pairs = rec[f"delta_{m}_pairs"]
    if _nan(pairs) or pairs == 0:
        return DASH
    if pairs == 1:
        return f"{num(rec[f'delta_{m}'], digits, True)} (1 pair, no CI)"
    return (
        f"{num(rec[f'delta_{m}'], digits, True)} [{num(rec[f'delta_{m}_ci_lo'], digits, True)}, "
        f"{num(rec[f'delta_{m}_ci_hi'], digits, True)}]"
    )


def welch(rec, m: str, ctx: Context) -> str:
    if rec["row"] == ctx.reference or _nan(rec[f"delta_{m}_unpaired"]):
        return "—" if rec["row"] == ctx.reference else DASH
    if _nan(rec[f"delta_{m}_unpaired_ci_lo"]):
        return f"{num(rec[f'delta_{m}_unpaired'], 1, True)} (no CI)"
    return (
        f"{num(rec[f'delta_{m}_unpaired'], 1, True)} [{num(rec[f'delta_{m}_unpaired_ci_lo'], 1, True)}, "
        f"{num(rec[f'delta_{m}_unpaired_ci_hi'], 1, True)}]"
    )


def reach(rec) -> str:
    n, hit = rec["n"], rec["updates_to_threshold_reached"]
    if n == 0:
        return DASH
    if hit == 0:
        return "not reached"
    body = (
        spread({**rec, "n": hit}, "updates_to_threshold", 1)
        if hit > 1
        else num(rec["updates_to_threshold_mean"], 0)
    )
    return body if hit == n else f"{body} ({hit}/{n} reached)"


def threshold(ctx: Context) -> str:
    return DASH if _nan(ctx.threshold) else f"{ctx.threshold:g}"


def pair_of(rec, name: str, digits: int) -> str:
    return f"{num(rec[f'{name}_final_mean'], digits)} / {num(rec[f'{name}_last_mean'], digits)}"


def marked(rec) -> str:
    return pretty(rec["row"]) + (" †" if rec["truncated_runs"] else "")


# ----------------------------------------------------------------------------- the four tables
Column = tuple[str, Callable[[dict, Context], str]]
"""(header, formatter): the header may name {k}, {n}, {threshold}, {tokens} and {time} (see
`headers`); the formatter turns one table.csv line (a dict) into the cell's text."""


def final_range(r, c) -> str:
    return DASH if r["n"] == 0 else f"{num(r['final_min'])}–{num(r['final_max'])}"


MAIN: list[Column] = [
    ("row", lambda r, c: marked(r)),
    ("n", lambda r, c: str(r["n"])),
    ("base avg@{k}", lambda r, c: num(r["base_mean"])),
    ("{final} avg@{k}", lambda r, c: spread(r, "final")),
    ("peak avg@{k}", lambda r, c: spread(r, "peak")),
    ("Δ {final} (paired, 95% CI)", lambda r, c: delta(r, "final", c)),
    ("Holm p", lambda r, c: holm_p(r, "final")),
    ("updates to {threshold}", lambda r, c: reach(r)),
    ("AUC avg@{k}", lambda r, c: spread(r, "auc")),
    ("strict final", lambda r, c: spread(r, "strict_final")),
]
PAIRED: list[Column] = [  # rows other than the reference
    ("row", lambda r, c: marked(r)),
    ("pairs", lambda r, c: num(r["delta_final_pairs"], 0)),
    ("Δ {final} [95% CI]", lambda r, c: delta(r, "final", c)),
    ("Holm p", lambda r, c: holm_p(r, "final")),
    ("Δ peak [95% CI]", lambda r, c: delta(r, "peak", c)),
    ("Holm p", lambda r, c: holm_p(r, "peak")),
    ("Δ AUC [95% CI]", lambda r, c: delta(r, "auc", c)),
    ("Holm p", lambda r, c: holm_p(r, "auc")),
    ("Δ updates to {threshold} [95% CI]", lambda r, c: delta(r, "updates_to_threshold", c)),
    ("unpaired Δ {final} [Welch 95% CI]", lambda r, c: welch(r, "final", c)),
]
COMPUTE: list[Column] = [
    ("row", lambda r, c: marked(r)),
    ("generated tokens", lambda r, c: tokens(r["cumulative_tokens_mean"])),
    ("wall time", lambda r, c: duration(r["cumulative_seconds_mean"])),
    ("avg@{k} at {tokens} tokens", lambda r, c: spread(r, "score_at_tokens")),
    ("Δ (paired, 95% CI)", lambda r, c: delta(r, "score_at_tokens", c)),
    ("avg@{k} at {time}", lambda r, c: spread(r, "score_at_seconds")),
    ("Δ (paired, 95% CI)", lambda r, c: delta(r, "score_at_seconds", c)),
]
DIAGNOSTICS: list[
    Column
] = [  # a TRACKED metric (report/collect.py) NAME gives NAME_final_mean, NAME_last_mean
    ("row", lambda r, c: marked(r)),
    ("entropy (final / last {n})", lambda r, c: pair_of(r, "entropy", 3)),
    ("response length (final / last {n})", lambda r, c: pair_of(r, "response_length", 1)),
    ("EV vs MC (final / median last {n})", lambda r, c: pair_of(r, "ev_mc", 3)),
    ("EV vs targets (final / median last {n})", lambda r, c: pair_of(r, "ev_target", 3)),
    ("wall time", lambda r, c: duration(r["cumulative_seconds_mean"])),
    ("tokens/s", lambda r, c: num(r["tokens_per_second_mean"], 0)),
    ("peak memory (MB)", lambda r, c: num(r["peak_memory_mb_max"], 0)),
    ("{final} range", final_range),
    ("attempts / crashes", lambda r, c: f"{r['attempts']} / {r['crashes']}"),
]
TABLES: dict[str, list[Column]] = {
    "main": MAIN,
    "paired": PAIRED,
    "compute": COMPUTE,
    "diagnostics": DIAGNOSTICS,
}
WITHOUT_REFERENCE = ("paired",)
"""Tables of differences to the reference row: the reference itself has no line in them."""


def headers(columns: list[Column], ctx: Context) -> list[str]:
    names = {
        "k": ctx.k,
        "n": ctx.last_n,
        "threshold": threshold(ctx),
        "tokens": tokens(ctx.token_budget),
        "time": duration(ctx.time_budget),
        "final": ctx.endpoint.label,
    }
    return [head.format(**names) for head, _ in columns]


def rows(name: str, table: pd.DataFrame, ctx: Context) -> tuple[list[str], list[list[str]]]:
    """(header, body) of the table `name` (in TABLES): one line per table.csv row."""
    columns = TABLES[name]
    recs = [
        r for r in table.to_dict("records") if not (name in WITHOUT_REFERENCE and r["row"] == ctx.reference)
    ]
    return headers(columns, ctx), [[cell(r, ctx) for _, cell in columns] for r in recs]


def markdown(head, body) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _esc(s: str) -> str:
    return (
        s.replace("\\", "\\textbackslash{}")
        .replace("_", "\\_")
        .replace("%", "\\%")
        .replace("&", "\\&")
        .replace("#", "\\#")
        .replace("±", "$\\pm$")
        .replace("Δ", "$\\Delta$")
        .replace("—", "---")
        .replace("–", "--")
        .replace("†", "$^\\dagger$")
        .replace("‡", "$^\\ddagger$")
        .replace("<", "$<$")
    )


def latex(head, body) -> str:
    out = [
        "\\begin{tabular}{l" + "r" * (len(head) - 1) + "}",
        "\\toprule",
        " & ".join(map(_esc, head)) + " \\\\",
        "\\midrule",
    ]
    out += [" & ".join(map(_esc, r)) + " \\\\" for r in body]
    out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out)


def latex_all(table: pd.DataFrame, ctx: Context) -> str:
    parts = []
    for name in TABLES:
        head, body = rows(name, table, ctx)
        if body:
            parts.append(f"% {name}\n" + latex(head, body))
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------- notes under the tables
def holm_note(table: pd.DataFrame, ctx: Context, m: str = "final", what: str | None = None) -> str:
    what = what or f"Δ {ctx.endpoint.label}"
    recs = [
        r for r in table.to_dict("records") if r["row"] != ctx.reference and not _nan(r[f"delta_{m}_p_holm"])
    ]
    if not recs:
        return f"Multiple comparisons ({what}): no row has two paired seeds with {pretty(ctx.reference)}, so no p-value."
    yes = [
        f"{pretty(r['row'])} (p={pval(r[f'delta_{m}_p_holm'])})"
        for r in recs
        if r[f"delta_{m}_p_holm"] <= 0.05
    ]
    no = [
        f"{pretty(r['row'])} (p={pval(r[f'delta_{m}_p_holm'])})"
        for r in recs
        if r[f"delta_{m}_p_holm"] > 0.05
    ]
    flat = [
        pretty(r["row"]) for r in table.to_dict("records") if r["row"] != ctx.reference and zero_spread(r, m)
    ]
    return (
        f"Multiple comparisons ({what}, Holm over the {len(recs)} rows compared with {pretty(ctx.reference)}, "
        f"family-wise 5%): survive: {', '.join(yes) or 'none'}; do not: {', '.join(no) or 'none'}"
        + (f"; no p-value (zero spread, ‡): {', '.join(flat)}." if flat else ".")
    )


def paper_note(table: pd.DataFrame, ctx: Context) -> str:
    """The single drops against VAPO's Table 1 (`PAPER_DROPS`), when the reference is the full recipe:
    how many move in the paper's direction (Δ endpoint < 0), which survive Holm on either side, and
    the rank correlation of the deltas with the paper's. Empty without such rows."""
    if ctx.reference != "vapo":
        return ""
    drops = [
        (r, PAPER_DROPS[r["row"][len("vapo-no-") :]])
        for r in table.to_dict("records")
        if r["row"].startswith("vapo-no-")
        and r["row"][len("vapo-no-") :] in PAPER_DROPS
        and not _nan(r["delta_final"])
    ]
    if not drops:
        return ""
    down = [pretty(r["row"]) for r, _ in drops if r["delta_final"] < 0]
    held = [
        f"{pretty(r['row'])} (Δ {num(r['delta_final'], 1, True)}, p={pval(r['delta_final_p_holm'])})"
        for r, _ in drops
        if not _nan(r["delta_final_p_holm"]) and r["delta_final_p_holm"] <= 0.05
    ]
    rho = stats.spearman([r["delta_final"] for r, _ in drops], [paper for _, paper in drops])
    corr = (
        f"Rank correlation (Spearman) of the {len(drops)} deltas with the paper's: {num(rho, 2, True)}."
        if not _nan(rho)
        else "Too few single drops for a rank correlation with the paper's."
    )
    return (
        f"Against the paper's Table 1 (Δ {ctx.endpoint.label}; there every single drop lowers the score): "
        f"{len(down)} of the "
        f"{len(drops)} single drops move in the paper's direction (Δ < 0){': ' + ', '.join(down) if down else ''}; "
        f"surviving Holm: {', '.join(held) or 'none'}. {corr}"
    )


def zero_spread_note(table: pd.DataFrame, ctx: Context, metrics: dict) -> str:
    """The footnote of the n/a p-values (`zero_spread`) in the columns `metrics` ({m: 'Δ peak'})."""
    parts = []
    for r in table.to_dict("records"):
        if r["row"] == ctx.reference:
            continue
        cells = [
            f"{what} {num(r[f'delta_{m}'], 1, True)} in all {int(r[f'delta_{m}_pairs'])} pairs"
            for m, what in metrics.items()
            if zero_spread(r, m)
        ]
        if cells:
            parts.append(f"{pretty(r['row'])} ({', '.join(cells)})")
    if not parts:
        return ""
    return (
        "‡ n/a: zero spread: every seed's difference is the same, so the paired t statistic (the mean over its "
        "standard error, here 0) is undefined and no p-value is given; the row is left out of that column's Holm "
        "adjustment. Identical differences are what a quantised score gives (one sample more or fewer in the "
        "eval), not evidence of an effect: " + "; ".join(parts) + "."
    )


def seeds_note(table: pd.DataFrame, ctx: Context, m: str = "final", what: str | None = None) -> str:
    what = what or f"Δ {ctx.endpoint.label}"
    parts = []
    for r in table.to_dict("records"):
        if r["row"] == ctx.reference:
            continue
        pairs = 0 if _nan(r[f"delta_{m}_pairs"]) else int(r[f"delta_{m}_pairs"])
        if pairs < 2:
            say = "needs 2 paired seeds for an estimate"
        elif resolved(r, m):
            say = f"resolved with {pairs} pairs"
        elif _nan(r[f"seeds_needed_{m}"]):
            say = f"not reachable within {ctx.max_seeds} seeds (within noise)"
        else:
            say = f"≈ {int(r[f'seeds_needed_{m}'])} seeds"
        parts.append(f"{pretty(r['row'])}: {say}")
    if not parts:
        return ""
    return (
        f"Seeds needed ({what}; plug-in: the n at which a paired 95% interval with the observed mean and "
        f"spread excludes zero, about even odds for a fresh set of n seeds): " + "; ".join(parts) + "."
    )


def pairing_note(table: pd.DataFrame, ctx: Context, missing: dict) -> str:
    parts = []
    for r in table.to_dict("records"):
        bits = []
        lost = missing.get(r["row"], [])
        if lost:
            bits.append(
                "no log for seed(s) "
                + " ".join(str(s) for s, _ in sorted(lost, key=lambda x: x[0]))
                + " (missing or failed cells)"
            )
        if r["row"] != ctx.reference and r["unpaired_seeds_final"]:
            bits.append(
                f"seed(s) {r['unpaired_seeds_final']} unpaired with {pretty(ctx.reference)}, left out of the "
                "paired Δ"
            )
        if bits:
            parts.append(f"{pretty(r['row'])}: " + "; ".join(bits))
    return ("Unpaired seeds: " + "; ".join(parts) + ".") if parts else ""


def no_log_note(rows: list, missing: dict) -> str:
    """Rows of the grid without a single run log (every cell failed, or none ran yet)."""
    if not rows:
        return ""
    parts = []
    for row in rows:
        cells = sorted(missing.get(row, []), key=lambda x: x[0])
        crashed = sum(a.get("failed", 0) + a.get("lost", 0) for _, a in cells)
        parts.append(
            f"{pretty(row)} (seed(s) {' '.join(str(s) for s, _ in cells)}; {crashed} crashed attempt(s))"
        )
    return "Rows without any run log, left out of the tables: " + "; ".join(parts) + "."


def truncation_note(seeds: pd.DataFrame) -> str:
    bad = seeds[seeds["truncated"].fillna("") != ""]
    if bad.empty:
        return ""
    items = [f"`{r['run']}` ({r['truncated']})" for r in bad.to_dict("records")]
    return (
        "† Truncated runs, reported and included in the numbers above, so read their rows with care: "
        + "; ".join(items)
        + "."
    )
