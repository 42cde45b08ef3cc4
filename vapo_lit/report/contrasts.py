"""Further paired comparisons beside the table's deltas against its reference: the pairs a grid
declares (`contrasts:` in its YAML, copied into the manifest) and those `vapo-report --contrast
ROW:AGAINST` adds. A Table 1 grid compares every row with the full recipe; a question such as "is
VAPO with the true state values ahead of critic-free GRPO?" compares two other rows.

contrasts.csv, one line per pair, for each metric m in METRICS:
  delta_m, delta_m_ci_lo, delta_m_ci_hi  mean of the per-seed differences row - against (paired
                                         seeds) and its 95% t-interval
  delta_m_pairs, delta_m_p               paired seeds, paired t-test p-value
  delta_m_p_holm                         Holm-adjusted over the contrasts (a family of its own,
                                         separate from the table's)
"""
from __future__ import annotations

import pandas as pd

from vapo_lit import statistics as stats
from vapo_lit.report import render
from vapo_lit.report.table import by_seed, pretty

METRICS = ("final", "auc", "peak")
NAN = float("nan")
TEXT = ("Paired like the table's deltas (the per-seed difference row − against over the seeds both have, "
        "95% t-interval), between two rows other than the reference. Holm's adjustment runs over these "
        "contrasts, per metric, a family of its own.")


def columns() -> list[str]:
    cols = ["row", "against"]
    for m in METRICS:
        cols += [f"delta_{m}", f"delta_{m}_ci_lo", f"delta_{m}_ci_hi", f"delta_{m}_pairs", f"delta_{m}_p",
                 f"delta_{m}_p_holm"]
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
            rec.update({f"delta_{m}": d["mean"], f"delta_{m}_ci_lo": d["ci_lo"], f"delta_{m}_ci_hi": d["ci_hi"],
                        f"delta_{m}_pairs": d["pairs"], f"delta_{m}_p": d["p"]})
        records.append(rec)
    frame = pd.DataFrame(records, columns=columns())
    for m in METRICS:
        frame[f"delta_{m}_p_holm"] = stats.holm(list(frame[f"delta_{m}_p"]))
    return frame


def _delta(rec: dict, m: str) -> str:
    pairs = rec[f"delta_{m}_pairs"]
    if render._nan(pairs) or pairs == 0:
        return render.DASH
    if pairs == 1:
        return f"{render.num(rec[f'delta_{m}'], 1, True)} (1 pair, no CI)"
    return (f"{render.num(rec[f'delta_{m}'], 1, True)} [{render.num(rec[f'delta_{m}_ci_lo'], 1, True)}, "
            f"{render.num(rec[f'delta_{m}_ci_hi'], 1, True)}]")


def markdown_table(frame: pd.DataFrame) -> str:
    head = ["row", "against", "pairs", "Δ final [95% CI]", "p", "Holm p", "Δ AUC [95% CI]", "p", "Holm p",
            "Δ peak [95% CI]"]
    body = []
    for r in frame.to_dict("records"):
        pairs = r["delta_final_pairs"]
        body.append([pretty(r["row"]), pretty(r["against"]), render.num(pairs, 0), _delta(r, "final"),
                     render.pval(r["delta_final_p"]), render.pval(r["delta_final_p_holm"]), _delta(r, "auc"),
                     render.pval(r["delta_auc_p"]), render.pval(r["delta_auc_p_holm"]), _delta(r, "peak")])
    return render.markdown(head, body)
