"""Figure-2-style PNGs (matplotlib Agg): score, response length, entropy and explained variance
against PPO update; one line per row (mean over seeds), a min-max band over seeds."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from vapo_lit.report.table import pretty

PLOTS = {
    "score": ("eval avg@k (points)", None),
    "response_length": ("response length (tokens)", "rollout/response_length"),
    "entropy": ("policy entropy", "policy/entropy"),
    "explained_variance": ("critic explained variance", "value/explained_variance"),
}


def _series(log, what: str) -> pd.Series:
    """y indexed by PPO update for one run (score: eval rows, base policy at update 0)."""
    df = log.metrics
    x = df["train/ppo_update"] if "train/ppo_update" in df else df["step"]
    if what == "score":
        key = log.score_key
        if key not in df:
            return pd.Series(dtype=float)
        mask = df[key].notna()  # the step-0 row (ppo_update 0) is the base policy's eval
        xs = x[mask].astype(float).tolist()
        return pd.Series((100 * df.loc[mask, key]).tolist(), index=xs).groupby(level=0).last()
    col = PLOTS[what][1]
    if col not in df:
        return pd.Series(dtype=float)
    ppo = df["train/value_pretraining"] == 0 if "train/value_pretraining" in df else df[col].notna()
    mask = ppo & df[col].notna()
    return pd.Series(df.loc[mask, col].tolist(), index=x[mask].astype(float).tolist()).groupby(level=0).last()


def plot_all(logs, order: list[str], folder: Path, k: int) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for what, (ylabel, _) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
        drawn = False
        for row in order:
            runs = [_series(log, what) for log in logs if log.row == row]
            runs = [s for s in runs if len(s)]
            if not runs:
                continue
            frame = pd.concat(runs, axis=1).sort_index()
            mean = frame.mean(axis=1)
            (line,) = ax.plot(mean.index, mean.values, marker="o" if what == "score" else None, ms=3,
                              label=f"{pretty(row)} (n={len(runs)})")
            if len(runs) > 1:
                ax.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), color=line.get_color(), alpha=0.2)
            drawn = True
        ax.set_xlabel("PPO update")
        ax.set_ylabel(ylabel.replace("avg@k", f"avg@{k}"))
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = folder / f"{what}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
