"""Aggregate the per-run frame (seeds.csv) into one line per row (table.csv).

Per row and metric m: m_{mean,std,ci_lo,ci_hi} over the row's runs (unpaired, per-row
t-interval). Against the reference row (the full recipe), for each metric in DELTAS:
  delta_m                       mean of the per-seed differences row - reference (paired seeds)
  delta_m_ci_lo, delta_m_ci_hi  its 95% t-interval; delta_m_pairs: how many seeds are paired
  delta_m_p, delta_m_p_holm     paired t-test p-value, Holm-adjusted over the table's rows
  delta_m_unpaired(_ci_lo/_hi)  difference of the row means with Welch's interval (seeds ignored)
  seeds_needed_m                plug-in seeds at which the paired interval would exclude zero
                                (empty: not within --max-seeds)
  unpaired_seeds_m              seeds with a value in only one of the two rows (space-separated)
Scores are in points; updates_to_threshold in PPO updates (mean over the runs that reached it,
`updates_to_threshold_reached` of n did; its deltas pair only seeds where both rows reached it).
"""

from __future__ import annotations

import math

import pandas as pd

from vapo_lit import seed_stats as stats
from vapo_lit.report.collect import TRACKED
from vapo_lit.report.logs import attempt_counts

SUMMARIES = (
    "base",
    "final",
    "peak",
    "strict_final",
    "strict_peak",
    "auc",
    "updates_to_threshold",
    "score_at_tokens",
    "score_at_seconds",
)
DELTAS = ("final", "peak", "auc", "updates_to_threshold", "score_at_tokens", "score_at_seconds")
NAN = float("nan")
PAPER_DROPS = {
    "value_pretraining": -49.0,
    "decoupled_gae": -27.0,
    "length_adaptive_gae": -15.0,
    "token_level_loss": -7.0,
    "clip_higher": -14.0,
    "positive_lm_loss": -6.0,
    "group_sampling": -5.0,
}
"""VAPO's Table 1: the change of AIME24 avg@32 (points) when one component is removed from the
full recipe (Qwen2.5-32B; full VAPO 60). Every single drop lowers the score there."""


def pretty(label: str) -> str:
    for mode in ("step", "zero"):  # GAE's observation treatment other than the default skip
        if label.endswith(f"-obs-{mode}"):
            return f"{pretty(label[: -len(f'-obs-{mode}')])}, observations: {mode}"
    if "-with-" in label:  # optional components on top of a row (labels.run_label)
        base, extras = label.split("-with-", 1)
        return f"{pretty(base)} with {', '.join(extras.split('+'))}"
    if label == "vapo":
        return "VAPO (full)"
    if label == "vanilla_ppo":
        return "vanilla PPO"
    if label.startswith("vapo-no-"):
        return "w/o " + " + ".join(label[len("vapo-no-") :].split("+"))
    if label.startswith("grpo+"):
        return "critic-free GRPO (" + ", ".join(label[len("grpo+") :].split("+")) + ")"
    return label


def by_seed(group: pd.DataFrame, col: str) -> dict:
    """{seed: value}, the first run (in run-folder order) of a seed when a row has several."""
    out = {}
    for seed, value in zip(group["seed"], group[col]):
        out.setdefault(int(seed), float(value))
    return out


def columns() -> list[str]:
    cols = ["row", "label", "n", "missing_cells", "truncated_runs"]
    for m in SUMMARIES:
        cols += [f"{m}_{k}" for k in ("mean", "std", "ci_lo", "ci_hi")]
    cols += ["updates_to_threshold_reached", "final_min", "final_max"]
    for m in DELTAS:
        cols += [
            f"delta_{m}",
            f"delta_{m}_ci_lo",
            f"delta_{m}_ci_hi",
            f"delta_{m}_pairs",
            f"delta_{m}_p",
            f"delta_{m}_p_holm",
            f"delta_{m}_unpaired",
            f"delta_{m}_unpaired_ci_lo",
            f"delta_{m}_unpaired_ci_hi",
            f"seeds_needed_{m}",
            f"unpaired_seeds_{m}",
        ]
    for name in TRACKED:
        cols += [f"{name}_{kind}_{k}" for kind in ("final", "last") for k in ("mean", "std")]
    cols += [
        "cumulative_seconds_mean",
        "cumulative_tokens_mean",
        "tokens_per_second_mean",
        "peak_memory_mb_max",
        "attempts",
        "crashes",
        "interrupted",
    ]
    return cols


def build_table(
    seeds: pd.DataFrame, rows: list, reference: str | None, missing: dict | None = None, max_seeds: int = 20
) -> pd.DataFrame:
    """One line per label in `rows` (in that order)."""
    missing = missing or {}
    ref = seeds[seeds["row"] == reference] if reference else seeds.iloc[0:0]
    records = []
    for label in rows:
        g = seeds[seeds["row"] == label]
        lost = missing.get(label, [])
        rec = dict.fromkeys(columns(), NAN)
        rec.update(
            row=label,
            label=pretty(label),
            n=len(g),
            missing_cells=len(lost),
            truncated_runs=int((g["truncated"].fillna("") != "").sum()),
        )
        for m in SUMMARIES:
            st = stats.summarize(g[m])
            for k in ("mean", "std", "ci_lo", "ci_hi"):
                rec[f"{m}_{k}"] = st[k]
        rec["updates_to_threshold_reached"] = int(g["updates_to_threshold"].notna().sum())
        rec["final_min"], rec["final_max"] = (
            (float(g["final"].min()), float(g["final"].max())) if len(g) else (NAN, NAN)
        )
        if reference and label != reference and len(ref):
            rec.update(deltas(g, ref, max_seeds))
        for name in TRACKED:
            for kind in ("final", "last"):
                st = stats.summarize(g[f"{name}_{kind}"])
                rec[f"{name}_{kind}_mean"], rec[f"{name}_{kind}_std"] = st["mean"], st["std"]
        rec["cumulative_seconds_mean"] = stats.summarize(g["cumulative_seconds"])["mean"]
        rec["cumulative_tokens_mean"] = stats.summarize(g["cumulative_tokens"])["mean"]
        rec["tokens_per_second_mean"] = stats.summarize(g["tokens_per_second"])["mean"]
        mem = g["peak_memory_mb"].dropna()
        rec["peak_memory_mb_max"] = float(mem.max()) if len(mem) else NAN
        for k in ("attempts", "crashes", "interrupted"):  # cells without a log count too
            rec[k] = int(g[k].sum()) + sum(attempt_counts(a)[k] for _, a in lost)
        records.append(rec)
    table = pd.DataFrame(records, columns=columns())
    for m in DELTAS:
        table[f"delta_{m}_p_holm"] = stats.holm(list(table[f"delta_{m}_p"]))
    for m in DELTAS:
        table[f"unpaired_seeds_{m}"] = table[f"unpaired_seeds_{m}"].map(
            lambda v: "" if isinstance(v, float) else v
        )
    return table


def deltas(g: pd.DataFrame, ref: pd.DataFrame, max_seeds: int) -> dict:
    """A row's differences to the reference row (`g` and `ref`: their per-seed lines), for each of
    DELTAS: paired by seed (with its p-value and the seeds needed to resolve it) and unpaired (Welch)."""
    rec = {}
    for m in DELTAS:
        pd_ = stats.paired_delta(by_seed(g, m), by_seed(ref, m))
        wd = stats.welch_delta(g[m], ref[m])
        rec.update(
            {
                f"delta_{m}": pd_["mean"],
                f"delta_{m}_ci_lo": pd_["ci_lo"],
                f"delta_{m}_ci_hi": pd_["ci_hi"],
                f"delta_{m}_pairs": pd_["pairs"],
                f"delta_{m}_p": pd_["p"],
                f"delta_{m}_unpaired": wd["mean"],
                f"delta_{m}_unpaired_ci_lo": wd["ci_lo"],
                f"delta_{m}_unpaired_ci_hi": wd["ci_hi"],
                f"unpaired_seeds_{m}": " ".join(str(s) for s in pd_["unpaired"]),
            }
        )
        need = stats.seeds_needed(pd_["mean"], pd_["std"], cap=max_seeds) if pd_["pairs"] >= 2 else None
        rec[f"seeds_needed_{m}"] = float(need) if need is not None else NAN
    return rec


def resolved(rec: dict, m: str = "final") -> bool:
    lo, hi = rec.get(f"delta_{m}_ci_lo", NAN), rec.get(f"delta_{m}_ci_hi", NAN)
    return not (math.isnan(lo) or math.isnan(hi)) and (lo > 0 or hi < 0)
