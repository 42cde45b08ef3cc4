"""Further paired comparisons beside the table's deltas against its reference: the pairs a grid
declares (`contrasts:` in its YAML, copied into the manifest) and those `vapo-report --contrast
ROW:AGAINST` adds. A Table 1 grid compares every row with the full recipe; a question such as "is
VAPO with the true state values ahead of critic-free GRPO?" compares two other rows. A declared
pair whose rows have no logs yet is left out and named (`left_out_note`).

contrasts.csv, one line per pair, for each metric m in METRICS:
  delta_m, delta_m_ci_lo, delta_m_ci_hi  mean of the per-seed differences row - against (paired
                                         seeds) and its 95% t-interval
  delta_m_pairs, delta_m_p               paired seeds, paired t-test p-value
  delta_m_p_holm                         Holm-adjusted over the contrasts (a family of its own,
                                         separate from the table's)
"""

from __future__ import annotations

import pandas as pd

from vapo_lit import seed_stats as stats
from vapo_lit.report import render
from vapo_lit.report.table import by_seed, pretty

METRICS = ("final", "auc", "peak")
NAN = float("nan")
TEXT = (
    "Paired like the table's deltas (the per-seed difference row − against over the seeds both have, "
    "95% t-interval), between two rows the grid declares (`contrasts:`) or `vapo-report --contrast` names. "
    "Holm's adjustment runs over these contrasts, per metric, a family of its own: the declared ones and "
    "any added on the command line together. n/a ‡: the differences are the same nonzero number in every "
    "pair, so the t statistic and its p-value are undefined."
)


def columns() -> list[str]:
    cols = ["row", "against"]
    for m in METRICS:
        cols += [
            f"delta_{m}",
            f"delta_{m}_ci_lo",
            f"delta_{m}_ci_hi",
            f"delta_{m}_pairs",
            f"delta_{m}_p",
            f"delta_{m}_p_holm",
        ]
    return cols


def contrast_frame(seeds: pd.DataFrame, pairs: list) -> pd.DataFrame | None:
    """One line per (row, against) pair from the per-run frame (seeds.csv); None without pairs."""
    if not pairs:
        return None
    records = []
    for row, against in pairs:
        a, b = seeds[seeds["row"] == row], seeds[seeds["row"] == against]
        rec = dict.fromkeys(columns(), NAN)
        rec.update(row=row, against=against)
        for m in METRICS:
            d = stats.paired_delta(by_seed(a, m), by_seed(b, m))
            rec.update(
                {
                    f"delta_{m}": d["mean"],
                    f"delta_{m}_ci_lo": d["ci_lo"],
                    f"delta_{m}_ci_hi": d["ci_hi"],
                    f"delta_{m}_pairs": d["pairs"],
                    f"delta_{m}_p": d["p"],
                }
            )
        records.append(rec)
    frame = pd.DataFrame(records, columns=columns())
    for m in METRICS:
        frame[f"delta_{m}_p_holm"] = stats.holm(list(frame[f"delta_{m}_p"]))
    return frame


def left_out_note(declared: list, kept: list) -> str:
    """The declared pairs left out of the section (a row without logs yet); empty when none."""
    gone = [f"{pretty(a)} against {pretty(b)}" for a, b in map(tuple, declared) if (a, b) not in kept]
    return f"Declared contrasts left out (a row has no run log yet): {'; '.join(gone)}." if gone else ""


def markdown_table(frame: pd.DataFrame, endpoint: str = "final") -> str:
    """`endpoint`: the primary endpoint's short name (the "final" columns hold it)."""
    head = [
        "row",
        "against",
        "pairs",
        f"Δ {endpoint} [95% CI]",
        "p",
        "Holm p",
        "Δ AUC [95% CI]",
        "p",
        "Holm p",
        "Δ peak [95% CI]",
        "p",
        "Holm p",
    ]
    ctx = render.Context(0, 0, NAN, None, NAN, NAN, 0)  # no reference row: render.delta formats every line
    body = []
    for r in frame.to_dict("records"):
        line = [pretty(r["row"]), pretty(r["against"]), render.num(r["delta_final_pairs"], 0)]
        for m in METRICS:
            p = render.UNDEFINED_P if render.zero_spread(r, m) else render.pval(r[f"delta_{m}_p"])
            line += [render.delta(r, m, ctx), p, render.holm_p(r, m)]
        body.append(line)
    return render.markdown(head, body)
