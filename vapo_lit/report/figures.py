"""Figures (matplotlib Agg, PNG) from the runs' logs; one line per row unless said otherwise.

- score.png, strict_score.png: eval avg@k / strict avg@k (points) vs PPO update; mean over seeds,
  min-max band.
- response_length.png, entropy.png: mean over seeds of the PPO rows, min-max band.
- explained_variance.png (vs Monte-Carlo returns), explained_variance_target.png (vs the critic's
  targets): robust to single bad batches: a centred rolling median over ROLLING PPO iterations per run, the
  median over seeds, a min-max band, on a symlog axis (linear in [-1, 1]), so a batch with EV -23
  neither hides the curve nor drags a mean.
- value_calibration.png: V - return by response position (first token, 1-7, 8-31, 32-127, 128+;
  128-511 and 512+ for runs with longer responses),
  mean over the first and over the last CALIBRATION_UPDATES PPO iterations of each run, mean over
  seeds; solid lines for rows with value pretraining, dashed without. The early panel is where
  value pretraining's mechanism shows (a critic biased on early positions before it has caught up).
- score_vs_tokens.png, score_vs_seconds.png: eval score vs cumulative generated tokens / wall
  time, one thin line per run (colour = row), the compute-matched budget as a dashed line.
- clip_fractions.png (runs that log the length mechanisms, report/mechanisms.py): the lower and
  upper clip fractions vs PPO update, a panel each, mean over seeds.
- loss_share.png (likewise): the share of the policy-gradient weight carried by responses of 500
  tokens and more (`policy/loss_share_len_500-999` + `_ge1000`) vs PPO update.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vapo_lit.report.collect import CALIBRATION_UPDATES, cost_curves, eval_curve, ppo_rows
from vapo_lit.report.table import pretty

ROLLING = 5
TRAIN = {
    "response_length": ("response length (tokens)", "rollout/response_length", False),
    "entropy": ("policy entropy", "policy/entropy", False),
    "explained_variance": ("critic EV vs Monte-Carlo returns", "value/explained_variance", True),
    "explained_variance_target": ("critic EV vs its own targets", "value/explained_variance_target", True),
}
COST = {
    "score_vs_tokens": ("tokens", "generated tokens (training rollouts)", 1.0),
    "score_vs_seconds": ("seconds", "wall time (min)", 60.0),
}
"""Score vs cost figures: name -> (cost_curves column, x label, x divisor)."""
NAMES = ("score", "strict_score", *TRAIN, "value_calibration", *COST)
MECHANISM_FIGURES = ("clip_fractions", "loss_share")
LONG = ("500-999", "ge1000")
"""The length buckets loss_share.png adds up: responses of 500 tokens and more."""
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#000000",
    "#b15928",
    "#6a3d9a",
    "#01665e",
    "#fb9a99",
    "#fdbf6f",
    "#a6cee3",
    "#cab2d6",
    "#b2df8a",
    "#8c6d31",
)
"""A row's colour, by its place in the report's row order, the same in every figure (also where a row
has nothing to draw): matplotlib's ten default colours, then ten more, so a Table 1 grid's eleven rows
(full VAPO, seven drops, vanilla PPO, GRPO, an oracle row) never share one."""


def colour(order, row) -> str:
    return COLOURS[list(order).index(row) % len(COLOURS)]


def _train_series(log, col: str, robust: bool) -> pd.Series:
    ppo = ppo_rows(log.metrics)
    if col not in ppo:
        return pd.Series(dtype=float)
    s = pd.Series(
        ppo[col].to_numpy(),
        index=ppo["train/ppo_update"].to_numpy() if "train/ppo_update" in ppo else ppo["step"].to_numpy(),
    ).dropna()
    s = s.groupby(level=0).last()
    return s.rolling(ROLLING, min_periods=1, center=True).median() if robust else s


def _score_series(log, strict: bool) -> pd.Series:
    ups, scores = eval_curve(log, strict=strict)
    return pd.Series(scores, index=ups, dtype=float).groupby(level=0).last()


def _lines(ax, logs, order, get, robust=False, marker=None) -> bool:
    drawn = False
    for row in order:
        runs = [s for s in (get(log) for log in logs if log.row == row) if len(s)]
        if not runs:
            continue
        frame = pd.concat(runs, axis=1).sort_index()
        centre = frame.median(axis=1) if robust else frame.mean(axis=1)
        c = colour(order, row)
        ax.plot(
            centre.index, centre.values, marker=marker, ms=3, color=c, label=f"{pretty(row)} (n={len(runs)})"
        )
        if len(runs) > 1:
            ax.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), color=c, alpha=0.2)
        drawn = True
    return drawn


def _finish(fig, ax, drawn: bool, path: Path) -> Path:
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    return path


def _finish_panels(fig, axes, drawn: bool, path: Path) -> Path:
    """A figure of side-by-side panels: the legend in the last one (or 'not logged'), then saved."""
    if drawn:
        axes[-1].legend(fontsize=6)
    else:
        axes[0].text(0.5, 0.5, "not logged", ha="center", va="center", transform=axes[0].transAxes)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    return path


def _long_share(log) -> pd.Series:
    ppo = ppo_rows(log.metrics)
    cols = [f"policy/loss_share_len_{b}" for b in LONG if f"policy/loss_share_len_{b}" in ppo]
    if not cols or "train/ppo_update" not in ppo:
        return pd.Series(dtype=float)
    share = ppo[cols].fillna(0.0).sum(axis=1).where(ppo[cols].notna().any(axis=1))
    return (
        pd.Series(share.to_numpy(), index=ppo["train/ppo_update"].to_numpy()).dropna().groupby(level=0).last()
    )


def plot_all(
    logs, order: list, folder: Path, k: int, budgets: dict, calibration: dict, mechanisms: bool = False
) -> list[Path]:
    """Write every figure in NAMES (and, with `mechanisms`, MECHANISM_FIGURES) into `folder`.
    `budgets`: {'tokens': float, 'seconds': float}; `calibration`: {row: {(phase, bucket): mean
    bias}}, {row: has value pretraining} under 'vp' and the position buckets under 'buckets'."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [_plot_score(logs, order, folder, k, strict) for strict in (False, True)]
    written += [_plot_train(logs, order, folder, name) for name in TRAIN]
    written.append(_plot_value_calibration(order, folder, calibration))
    written += [_plot_cost(logs, order, folder, k, budgets, name) for name in COST]
    if mechanisms:
        written += [_plot_clip_fractions(logs, order, folder), _plot_loss_share(logs, order, folder)]
    return written


def _pyplot():
    """pyplot on the Agg backend, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _new(xlabel: str, ylabel: str):
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.0), dpi=110)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def _closed(fig, path: Path) -> Path:
    _pyplot().close(fig)
    return path


def _plot_score(logs, order, folder: Path, k: int, strict: bool) -> Path:
    """score.png (strict: strict_score.png): eval avg@k vs PPO update."""
    fig, ax = _new("PPO update", f"eval {'strict ' if strict else ''}avg@{k} (points)")
    drawn = _lines(ax, logs, order, lambda log: _score_series(log, strict), marker="o")
    return _closed(fig, _finish(fig, ax, drawn, folder / f"{'strict_score' if strict else 'score'}.png"))


def _plot_train(logs, order, folder: Path, name: str) -> Path:
    """<name>.png for a TRAIN entry: the PPO rows' metric vs PPO update (robust ones on a symlog axis)."""
    ylabel, col, robust = TRAIN[name]
    fig, ax = _new("PPO update", ylabel)
    drawn = _lines(ax, logs, order, lambda log: _train_series(log, col, robust), robust=robust)
    if robust:
        ax.set_yscale("symlog", linthresh=1.0)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_title(
            f"centred rolling median over {ROLLING} PPO iterations, median over seeds; symlog axis",
            fontsize=8,
        )
    return _closed(fig, _finish(fig, ax, drawn, folder / f"{name}.png"))


def _plot_value_calibration(order, folder: Path, calibration: dict) -> Path:
    """value_calibration.png: V - return by response position, an early and a late panel."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9.6, 4.0), dpi=110, sharey=True)
    drawn = False
    for ax, phase in zip(axes, ("early", "late")):
        drawn |= _calibration_panel(ax, order, calibration, phase)
    axes[0].set_ylabel("V - return (mean)")
    return _closed(fig, _finish_panels(fig, axes, drawn, folder / "value_calibration.png"))


def _calibration_panel(ax, order, calibration: dict, phase: str) -> bool:
    """One phase's panel: a line per row with a logged bias (solid with value pretraining, dashed without)."""
    drawn, buckets = False, calibration["buckets"]
    for row in order:
        vals = calibration["bias"].get(row)
        if not vals:
            continue
        ys = [vals.get((phase, b), float("nan")) for b in buckets]
        if all(y != y for y in ys):
            continue
        style = "-" if calibration["vp"].get(row) else "--"
        ax.plot(
            range(len(buckets)),
            ys,
            style,
            marker="o",
            ms=3,
            color=colour(order, row),
            label=f"{pretty(row)} ({'with' if calibration['vp'].get(row) else 'without'} value pretraining)",
        )
        drawn = True
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(
        range(len(buckets)), [b.replace("ge", "") + "+" if b.startswith("ge") else b for b in buckets]
    )
    ax.set_xlabel("response position (tokens)")
    ax.set_title(
        f"{'first' if phase == 'early' else 'last'} {CALIBRATION_UPDATES} PPO iterations", fontsize=9
    )
    ax.grid(alpha=0.3)
    return drawn


def _plot_cost(logs, order, folder: Path, k: int, budgets: dict, name: str) -> Path:
    """<name>.png for a COST entry: eval score vs cumulative cost, the compute-matched budget dashed."""
    what, xlabel, scale = COST[name]
    fig, ax = _new(xlabel, f"eval avg@{k} (points)")
    drawn = _cost_lines(ax, logs, order, what, scale)
    budget = budgets.get(what)
    if drawn and budget == budget and budget is not None:
        ax.axvline(budget / scale, color="grey", ls="--", lw=0.8)
    return _closed(fig, _finish(fig, ax, drawn, folder / f"{name}.png"))


def _cost_lines(ax, logs, order, what: str, scale: float) -> bool:
    """One thin step line per run, coloured by its row, labelled once per row."""
    drawn = False
    for row in order:
        first = True
        for log in (x for x in logs if x.row == row):
            df = log.metrics
            if log.score_key not in df:
                continue
            mask = df[log.score_key].notna()
            xs = cost_curves(log)[what][mask] / scale
            ax.step(
                xs,
                100 * df.loc[mask, log.score_key],
                where="post",
                lw=1,
                color=colour(order, row),
                label=pretty(row) if first else None,
            )
            first, drawn = False, True
    return drawn


def _plot_clip_fractions(logs, order, folder: Path) -> Path:
    """clip_fractions.png: the lower and upper clip fractions vs PPO update, a panel each."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9.6, 4.0), dpi=110)
    drawn = False
    for ax, side in zip(axes, ("low", "high")):
        drawn |= _lines(
            ax, logs, order, lambda log, c=f"policy/clipfrac_{side}": _train_series(log, c, False)
        )
        ax.set_xlabel("PPO update")
        ax.set_title(f"{side} side: tokens whose gradient the clip removed", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("clip fraction")
    return _closed(fig, _finish_panels(fig, axes, drawn, folder / "clip_fractions.png"))


def _plot_loss_share(logs, order, folder: Path) -> Path:
    """loss_share.png: the policy-gradient weight share of responses of 500 tokens and more."""
    fig, ax = _new("PPO update", "share of the policy-gradient weight, responses >= 500 tokens")
    drawn = _lines(ax, logs, order, _long_share)
    return _closed(fig, _finish(fig, ax, drawn, folder / "loss_share.png"))
