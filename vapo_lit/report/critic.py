"""The critic's quality, from the logs: how well each row's critic predicts, when it gets there,
and (where the task has true state values) how far it is from the best possible critic.

Every critic-based run logs, per iteration (value pretraining included), `value/explained_variance`
(against Monte-Carlo returns, measured on the batch before the critic's update on it); runs on a
task with true values (longchain) also log `value/explained_variance_oracle` (the critic against
the true values V*) and `value/oracle_ceiling` (V*'s own explained variance against the
Monte-Carlo returns: a critic that predicts V* exactly scores it; outcomes are random given the
state, so on a finite batch a critic exceeds it only where its departures from V* track that batch's
outcome noise).
`critic.csv`, one line per row with a critic:

* `vp_iterations`: value-pretraining iterations (mean over seeds; 0 without value pretraining; a
  run that loaded its pretrained critic from the cache logs the cached phase's count and where it
  ended as `value_pretrain/steps` and `value_pretrain/ev_end`, `ev_oracle_end`, `ceiling_end`
  (medians over its last LAST_VP iterations), which stand in for its missing rows; a cache entry
  from before those were kept gives only `value_pretrain/final_ev`, the last batch's explained
  variance, which is not such a median: that run's `ev_vp_end` and `ev_oracle_vp_end` stay NaN,
  never the last batch's value);
* `ev_vp_end`, `ev_early`, `ev_late`: explained variance against Monte-Carlo returns, median over
  the last LAST_VP value-pretraining iterations, the first CALIBRATION_UPDATES and the last N PPO
  iterations;
* `ev_oracle_*`: the same against the true values; `ceiling`: the oracle's own explained variance
  against Monte-Carlo returns (median over the run); `vp_end_of_ceiling`: ev_vp_end / ceiling per
  run, the share of the ceiling reached when PPO starts; `vp_end_of_ceiling_min`: its smallest
  value over the row's seeds (every seed with a value reached at least this); `late_of_ceiling`,
  `late_of_ceiling_min`: ev_late over the ceiling's median in the same last N PPO iterations, the
  share still held at the end, and its smallest value over the seeds; `lowest_of_ceiling`,
  `lowest_of_ceiling_min`: the same share in every block of N PPO iterations, counted back from the
  last (whose block is the late one), and its smallest value over the blocks: the share held
  through PPO (a run shorter than N iterations is one block); the row's mean and smallest seed.

Medians within a run (one batch without a correct response gives an explained variance far below
0), then the mean over the row's seeds that have a value (NaN when none has). Rows without a critic
are left out.
"""

from __future__ import annotations

import pandas as pd

from vapo_lit.report.collect import CALIBRATION_UPDATES, _col, ppo_rows

LAST_VP = 10
"""Value-pretraining iterations whose median is 'the critic at the end of value pretraining'."""
SIGNATURE = "value/explained_variance"
COLUMNS = (
    "vp_iterations",
    "ev_vp_end",
    "ev_early",
    "ev_late",
    "ev_oracle_vp_end",
    "ev_oracle_early",
    "ev_oracle_late",
    "ceiling",
    "vp_end_of_ceiling",
    "vp_end_of_ceiling_min",
    "late_of_ceiling",
    "late_of_ceiling_min",
    "lowest_of_ceiling",
    "lowest_of_ceiling_min",
)
SHARES = ("vp_end_of_ceiling", "late_of_ceiling", "lowest_of_ceiling")
"""Per-run shares of the ceiling whose smallest value over a row's seeds is kept beside the mean."""
NAN = float("nan")


def _median(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.median()) if len(s) else NAN


def _mean(xs) -> float:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else NAN


def vp_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The value-pretraining iterations of a run's metrics."""
    return df[df["train/value_pretraining"] == 1] if "train/value_pretraining" in df else df.iloc[0:0]


def run_quality(df: pd.DataFrame, last_n: int, value_pretraining: bool) -> dict:
    """One run's line of `critic.csv` (before the mean over seeds)."""
    vp, ppo = vp_rows(df), ppo_rows(df)
    cached = _col(df, "value_pretrain/steps").dropna()
    out = {
        "vp_iterations": float(len(vp))
        if len(vp) or not value_pretraining
        else float(cached.iloc[-1])
        if len(cached)
        else NAN
    }
    for suffix, col in (("", "value/explained_variance"), ("_oracle", "value/explained_variance_oracle")):
        out[f"ev{suffix}_vp_end"] = _median(_col(vp, col).iloc[-LAST_VP:]) if len(vp) else NAN
        out[f"ev{suffix}_early"] = _median(_col(ppo, col).dropna().iloc[:CALIBRATION_UPDATES])
        out[f"ev{suffix}_late"] = _median(_col(ppo, col).dropna().iloc[-last_n:])
    out["ceiling"] = _median(_col(df, "value/oracle_ceiling"))
    ceiling_vp = _median(_col(vp, "value/oracle_ceiling").iloc[-LAST_VP:]) if len(vp) else NAN
    if not len(vp) and value_pretraining:  # loaded from the cache: the cached phase's end, where logged
        # (never `final_ev`, the last batch alone: an entry that kept only that leaves these NaN)
        end = {
            k: _median(_col(df, f"value_pretrain/{k}").dropna().iloc[-1:])
            for k in ("ev_end", "ev_oracle_end", "ceiling_end")
        }
        out["ev_vp_end"], out["ev_oracle_vp_end"], ceiling_vp = (
            end["ev_end"],
            end["ev_oracle_end"],
            end["ceiling_end"],
        )
    out["vp_end_of_ceiling"] = out["ev_vp_end"] / ceiling_vp if ceiling_vp > 0 else NAN
    ceiling_late = _median(_col(ppo, "value/oracle_ceiling").dropna().iloc[-last_n:])
    out["late_of_ceiling"] = out["ev_late"] / ceiling_late if ceiling_late > 0 else NAN
    out["lowest_of_ceiling"] = lowest_share(ppo, last_n)
    return out


def lowest_share(ppo: pd.DataFrame, n: int) -> float:
    """The smallest share of the ceiling over a run's PPO iterations: per block of n iterations with an
    explained variance, counted back from the last (a shorter remainder at the start is left out; a run
    shorter than n is one block), the EV's median over the ceiling's median in the block."""
    both = pd.DataFrame(
        {"ev": _col(ppo, "value/explained_variance"), "ceiling": _col(ppo, "value/oracle_ceiling")}
    ).dropna(subset=["ev"])
    if not both["ceiling"].notna().any():
        return NAN
    full = len(both) - len(both) % n  # the iterations in whole blocks, counted back from the last
    blocks = (
        [both] if full == 0 else [both.iloc[len(both) - full :].iloc[i : i + n] for i in range(0, full, n)]
    )
    shares = []
    for part in blocks:
        ceiling = _median(part["ceiling"])
        shares.append(_median(part["ev"]) / ceiling if ceiling > 0 else NAN)
    shares = [x for x in shares if x == x]
    return min(shares) if shares else NAN


def critic_frame(logs, order: list, last_n: int) -> pd.DataFrame | None:
    """`critic.csv` (module docstring); None when no run has a critic."""
    if not any(SIGNATURE in log.metrics for log in logs):
        return None
    records = []
    for row in order:
        runs = [
            log
            for log in logs
            if log.row == row and SIGNATURE in log.metrics and log.metrics[SIGNATURE].notna().any()
        ]
        if not runs:
            continue
        per_run = [run_quality(log.metrics, last_n, "value_pretraining" in log.components) for log in runs]
        means = {c: _mean(r[c] for r in per_run) for c in COLUMNS if not c.endswith("_min")}
        lows = {}
        for share in SHARES:
            values = [r[share] for r in per_run if r[share] == r[share]]
            lows[f"{share}_min"] = min(values) if values else NAN
        records.append({"row": row, "runs": len(runs), **means, **lows})
    return pd.DataFrame(records, columns=["row", "runs", *COLUMNS])


CRITIC_TEXT = (
    "How well each row's critic predicts (mean over seeds of per-run medians). EV = explained variance against "
    "Monte-Carlo returns, on each batch before the critic trains on it: at the end of value pretraining (median of "
    f"the last {LAST_VP} of its iterations), over the first {{early}} and the last {{n}} PPO iterations. A run that "
    "loaded its pretrained critic from a cache entry that kept only the last batch's EV has no VP-end values: a "
    "row whose runs all did shows –, otherwise its VP-end columns are the mean over the seeds that have them. "
    "Where the task has true state values (the success probability from each state under the sampling policy, "
    "from its measured per-step error rates): EV vs true = the critic against them, and ceiling = the true values' "
    "own EV against Monte-Carlo returns (a critic that predicts the true values exactly scores it; outcomes are "
    "random given the state, so on a finite batch a critic exceeds it only where its departures from the true "
    "values track that batch's outcome noise); 'VP end / ceiling' = the share of it reached when PPO starts, "
    "'late / ceiling' = EV late over the ceiling's median in the same iterations: the share still held at the end, "
    "and 'lowest / ceiling' = the smallest of such shares over PPO in blocks of {n} iterations counted back from "
    "the last: the share held through PPO (mean over seeds, and the smallest seed's). Figure: critic_quality.png."
)


def _share(mean: float, low: float) -> str:
    if mean != mean:
        return "–"
    return f"{100 * mean:.0f}% ({100 * low:.0f}%)"


def markdown_table(frame: pd.DataFrame) -> str:
    from vapo_lit.report.render import markdown, num
    from vapo_lit.report.table import pretty

    head = [
        "row",
        "n",
        "VP iters",
        "EV VP end",
        "EV early",
        "EV late",
        "EV vs true VP end",
        "EV vs true early",
        "EV vs true late",
        "ceiling",
        "VP end / ceiling (min)",
        "late / ceiling (min)",
        "lowest / ceiling (min)",
    ]
    body = [
        [
            pretty(r["row"]),
            str(int(r["runs"])),
            num(r["vp_iterations"], 0),
            *(num(r[c], 2) for c in COLUMNS[1:8]),
            *(_share(r[share], r[f"{share}_min"]) for share in SHARES),
        ]
        for _, r in frame.iterrows()
    ]
    return markdown(head, body)


def _curve(log, col: str) -> pd.Series:
    """`col` against the PPO update, value pretraining at x <= 0 (its last iteration at 0)."""
    df = log.metrics
    if col not in df:
        return pd.Series(dtype=float)
    vp, ppo = vp_rows(df), ppo_rows(df)
    vp_x = pd.Series(range(1 - len(vp), 1), index=vp.index, dtype=float)
    ppo_x = _col(ppo, "train/ppo_update")
    x = pd.concat([vp_x, ppo_x]).sort_index()
    rows = df.loc[x.index]
    keep = rows[col].notna() & x.notna()
    return pd.Series(rows[col][keep].to_numpy(), index=x[keep].to_numpy()).groupby(level=0).last()


def plot(logs, order: list, path) -> None:
    """critic_quality.png: EV against Monte-Carlo returns (with the ceiling dashed) and against the true
    values, over value pretraining (x <= 0) and PPO; a centred rolling median of 5 iterations per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vapo_lit.report.figures import _finish_panels, _lines

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0), dpi=110, sharey=True)
    drawn = []
    for ax, col, title in (
        (axes[0], "value/explained_variance", "against Monte-Carlo returns (dashed: ceiling)"),
        (axes[1], "value/explained_variance_oracle", "against the true values"),
    ):
        drawn.append(
            _lines(
                ax,
                logs,
                order,
                lambda log, c=col: _curve(log, c).rolling(5, min_periods=1, center=True).median(),
                robust=True,
            )
        )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("PPO update (value pretraining at <= 0)")
        ax.axvline(0.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
    ceiling = [c for c in (_curve(log, "value/oracle_ceiling") for log in logs) if len(c)]
    if ceiling:
        c = (
            pd.concat(ceiling, axis=1)
            .sort_index()
            .median(axis=1)
            .rolling(5, min_periods=1, center=True)
            .median()
        )
        axes[0].plot(c.index, c.values, "--", color="0.45", lw=1)  # grey: black is a row colour
    if not drawn[1]:
        axes[1].text(
            0.5,
            0.5,
            "not logged: these runs have no true values",
            ha="center",
            va="center",
            transform=axes[1].transAxes,
            fontsize=8,
        )
    axes[0].set_ylabel("explained variance")
    axes[0].set_ylim(-0.5, 1.0)
    panels = list(axes) if drawn[1] else [axes[1], axes[0]]  # the legend goes in the last panel with lines
    _finish_panels(fig, panels, drawn[0], path)
    plt.close(fig)
