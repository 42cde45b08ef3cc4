"""The Table-1-style table: one row per grid row (paper order), statistics over seeds.

Scores are eval avg@k in points (x100). Columns of `table.csv`:
  row, n, base_mean, {final,peak}_{mean,std,ci_lo,ci_hi}, delta_final, delta_peak (points vs the
  full recipe's mean), {entropy,response_length,explained_variance}_{final,last}_{mean,std}.
"""
from __future__ import annotations

import math

import pandas as pd

from vapo_lit.config import row_order
from vapo_lit.report.collect import TRACKED
from vapo_lit.report.stats import summarize

SCORES = ("final", "peak")


def pretty(label: str) -> str:
    if label == "vapo":
        return "VAPO (full)"
    if label == "vanilla_ppo":
        return "vanilla PPO"
    if label.startswith("vapo-no-"):
        return "w/o " + " + ".join(label[len("vapo-no-"):].split("+"))
    if label.startswith("grpo+"):
        return "critic-free GRPO (" + ", ".join(label[len("grpo+"):].split("+")) + ")"
    return label


def build_table(per_run: pd.DataFrame, orders: dict) -> pd.DataFrame:
    """Aggregate the per-run frame (one row per run, from collect.per_run) over seeds."""
    rows = []
    for label, group in per_run.groupby("row", sort=False):
        rec = {"row": label, "n": int(len(group))}
        rec["base_mean"] = summarize(100 * group["base"])["mean"]
        for s in SCORES:
            st = summarize(100 * group[s])
            for key in ("mean", "std", "ci_lo", "ci_hi"):
                rec[f"{s}_{key}"] = st[key]
        for name in TRACKED:
            for kind in ("final", "last"):
                st = summarize(group[f"{name}_{kind}"])
                rec[f"{name}_{kind}_mean"], rec[f"{name}_{kind}_std"] = st["mean"], st["std"]
        rows.append(rec)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["_order"] = [orders.get(r, (9, (), r)) for r in table["row"]]
    table = table.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)
    full = table[table["row"] == "vapo"]
    for s in SCORES:
        ref = float(full[f"{s}_mean"].iloc[0]) if len(full) else float("nan")
        table[f"delta_{s}"] = table[f"{s}_mean"] - ref
    return table


def orders_of(logs) -> dict:
    return {log.row: row_order(log.components, log.estimator, log.row) for log in logs}


# ----------------------------------------------------------------------------- formatting
def _num(x, digits=1, signed=False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _score(rec, s) -> str:
    if rec["n"] == 1:
        return f"{_num(rec[f'{s}_mean'])} (n=1)"
    return f"{_num(rec[f'{s}_mean'])} ± {_num(rec[f'{s}_std'])}"


def _ci(rec, s) -> str:
    if rec["n"] < 2:
        return "n=1, no CI"
    return f"[{_num(rec[f'{s}_ci_lo'])}, {_num(rec[f'{s}_ci_hi'])}]"


def _pair(rec, name, digits) -> str:
    return f"{_num(rec[f'{name}_final_mean'], digits)} / {_num(rec[f'{name}_last_mean'], digits)}"


def cells(table: pd.DataFrame, k: int, last_n: int) -> tuple[list, list]:
    head = ["row", "n", f"base avg@{k}", f"final avg@{k} (mean ± std)", "95% CI", "Δ final",
            f"peak avg@{k} (mean ± std)", "95% CI", "Δ peak", f"entropy (final / last {last_n})",
            f"response length (final / last {last_n})", f"explained var. (final / last {last_n})"]
    body = []
    for rec in table.to_dict("records"):
        body.append([pretty(rec["row"]), str(rec["n"]), _num(rec["base_mean"]), _score(rec, "final"), _ci(rec, "final"),
                     "—" if rec["row"] == "vapo" else _num(rec["delta_final"], signed=True), _score(rec, "peak"),
                     _ci(rec, "peak"), "—" if rec["row"] == "vapo" else _num(rec["delta_peak"], signed=True),
                     _pair(rec, "entropy", 3), _pair(rec, "response_length", 1), _pair(rec, "explained_variance", 3)])
    return head, body


def markdown(table, k, last_n) -> str:
    head, body = cells(table, k, last_n)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def latex(table, k, last_n) -> str:
    head, body = cells(table, k, last_n)

    def esc(s: str) -> str:
        return (s.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%").replace("&", "\\&")
                .replace("#", "\\#").replace("±", "$\\pm$").replace("Δ", "$\\Delta$").replace("–", "--")
                .replace("—", "---"))

    out = ["\\begin{tabular}{l" + "r" * (len(head) - 1) + "}", "\\toprule", " & ".join(map(esc, head)) + " \\\\",
           "\\midrule"]
    out += [" & ".join(map(esc, r)) + " \\\\" for r in body]
    out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out)
