"""Read run folders (metrics.csv, config.yaml, run_card.json) into per-run summaries. No network.

A run's eval rows are those with `eval/avg@k` set; the row with `step == 0` is the base
policy's (evaluated before any update), the later ones are after training. PPO rows are those
with `train/value_pretraining == 0` (critic-only warmup rows are left out of final / last-N averages).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from vapo_lit.config import run_label

TRACKED = {"entropy": "policy/entropy", "response_length": "rollout/response_length",
           "explained_variance": "value/explained_variance"}


@dataclass
class RunLog:
    run_dir: Path
    row: str
    seed: int
    k: int
    components: list
    estimator: str
    metrics: pd.DataFrame
    card: dict = field(default_factory=dict)

    @property
    def score_key(self) -> str:
        return f"eval/avg@{self.k}"


def label_of(cfg: dict) -> str:
    """A row label from a run's config when no grid manifest names it."""
    return run_label(cfg.get("components", []), cfg.get("advantage_estimator", "gae"))


def load_run(run_dir: Path, row: str | None = None) -> RunLog:
    run_dir = Path(run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    card_path = run_dir / "run_card.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    df = pd.read_csv(run_dir / "metrics.csv")
    return RunLog(run_dir, row or cfg.get("wandb_job_type") or label_of(cfg), int(cfg.get("seed", 0)),
                  int(cfg.get("eval_k", 8)), list(cfg.get("components", [])), cfg.get("advantage_estimator", "gae"),
                  df, card)


def find_runs(out: Path, grid_id: str | None = None) -> list[tuple[str, Path]]:
    """(row label, run folder) pairs: the grid manifest's cells that have logs, or, without a
    manifest, every folder under `out` (two levels) holding metrics.csv and config.yaml."""
    out = Path(out)
    manifest = out / "grids" / f"{grid_id}.json" if grid_id else None
    if manifest is not None and manifest.is_file():
        data = json.loads(manifest.read_text())
        pairs = [(c["row"], out / c["run_dir"]) for c in data["cells"]]
        return [(r, d) for r, d in pairs if (d / "metrics.csv").is_file()]
    found = []
    for pattern in ("*/metrics.csv", "*/*/metrics.csv"):
        for m in sorted(out.glob(pattern)):
            if (m.parent / "config.yaml").is_file() and ".partial" not in m.parts:
                found.append((None, m.parent))
    return found


def per_run(log: RunLog, last_n: int) -> dict:
    """One run's numbers: base, final and peak eval (fractions), tracked metrics final and last-N mean."""
    df = log.metrics
    key = log.score_key
    evals = df[df[key].notna()] if key in df else df.iloc[0:0]
    base = evals[evals["step"] == 0]
    has_base = len(base) > 0
    trained = evals[evals["step"] > 0]
    ppo = df[df["train/value_pretraining"] == 0] if "train/value_pretraining" in df else df
    out = {
        "row": log.row, "seed": log.seed, "run_dir": str(log.run_dir), "ppo_updates": _last(ppo, "train/ppo_update"),
        "base": float(base[key].iloc[0]) if has_base else float("nan"),
        "final": float(trained[key].iloc[-1]) if len(trained) else float("nan"),
        "peak": float(trained[key].max()) if len(trained) else float("nan"),
    }
    for name, col in TRACKED.items():
        series = ppo[col].dropna() if col in ppo else pd.Series(dtype=float)
        out[f"{name}_final"] = float(series.iloc[-1]) if len(series) else float("nan")
        out[f"{name}_last"] = float(series.iloc[-last_n:].mean()) if len(series) else float("nan")
    return out


def _last(df, col):
    return float(df[col].dropna().iloc[-1]) if col in df and df[col].notna().any() else float("nan")
