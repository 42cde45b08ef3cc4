"""Synthetic run folders for the report tests: metrics.csv (written like Lightning's CSV logger,
CRLF lines), config.yaml, run_card.json, attempts.jsonl and a grid manifest, with scores and costs
chosen by the test, so every number in the report can be checked by hand. No training."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import yaml

from vapo_lit.config import COMPONENTS
from vapo_lit.labels import run_label

K = 4
BUCKETS = ("first", "1-7", "8-31", "32-127", "ge128")


def components_of(label: str) -> list:
    if label == "vapo":
        return list(COMPONENTS)
    if label == "vanilla_ppo":
        return []
    if label.startswith("vapo-no-"):
        gone = label[len("vapo-no-") :].split("+")
        return [c for c in COMPONENTS if c not in gone]
    raise ValueError(label)


def write_run(
    run_dir: Path,
    label: str,
    seed: int,
    evals: dict,
    *,
    steps: int,
    pretrain: int = 0,
    seconds_per_iter: float = 1.0,
    tokens_per_iter: tuple = (10.0, 4, 2),
    cumulative: bool = False,
    ev: list | None = None,
    ev_target: list | None = None,
    strict_offset: float = 0.05,
    memory: float | None = None,
    bias: dict | None = None,
    attempts: list = ("done",),
    updates: int | None = None,
    wandb: str | None = None,
) -> Path:
    """One run: `pretrain` value-pretraining iterations, then `updates` (default `steps`) PPO
    updates; `evals` = {ppo_update: score fraction} (0 = the base eval on step 0)."""
    updates = steps if updates is None else updates
    run_dir.mkdir(parents=True, exist_ok=True)
    comps = components_of(label)
    cfg = {
        "components": comps,
        "advantage_estimator": "gae",
        "seed": seed,
        "eval_k": K,
        "steps": steps,
        "wandb_job_type": label,
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    card = {"run_dir": str(run_dir.resolve())}
    if wandb:
        card["wandb"] = {"id": f"id{seed}", "project": "p", "group": "g", "mode": wandb}
    (run_dir / "run_card.json").write_text(json.dumps(card))
    with open(run_dir / "attempts.jsonl", "w") as f:
        for i, outcome in enumerate(attempts):
            f.write(json.dumps({"trial": i, "event": "start", "mode": "fresh"}) + "\n")
            f.write(json.dumps({"trial": i, "event": "end", "outcome": outcome}) + "\n")
    cols = [
        "step",
        "train/iteration",
        "train/ppo_update",
        "train/value_pretraining",
        f"eval/avg@{K}",
        f"eval/strict_avg@{K}",
        "perf/total_seconds",
        "perf/eval_seconds",
        "perf/tokens_per_second",
        "rollout/response_length",
        "rollout/prompts",
        "rollout/samples_per_prompt",
        "policy/entropy",
        "value/explained_variance",
        "value/explained_variance_target",
    ] + [f"value/bias_pos_{b}" for b in BUCKETS]
    if cumulative:
        cols += ["perf/cumulative_seconds", "perf/cumulative_tokens"]
    if memory is not None:
        cols += ["perf/peak_memory_mb"]
    rows = [
        {
            "step": 0,
            "train/iteration": 0,
            "train/ppo_update": 0,
            f"eval/avg@{K}": evals.get(0, ""),
            f"eval/strict_avg@{K}": evals.get(0, ""),
            "perf/eval_seconds": 0.5,
        }
    ]
    cum_s, cum_t = 0.5, 0.0
    if cumulative:
        rows[0].update({"perf/cumulative_seconds": cum_s, "perf/cumulative_tokens": 0})
    length, prompts, spp = tokens_per_iter
    for it in range(1, pretrain + updates + 1):
        upd = max(0, it - pretrain)
        r = {
            "step": it,
            "train/iteration": it,
            "train/ppo_update": upd,
            "train/value_pretraining": int(it <= pretrain),
            "perf/total_seconds": seconds_per_iter,
            "perf/tokens_per_second": length * prompts * spp / seconds_per_iter,
            "rollout/response_length": length,
            "rollout/prompts": prompts,
            "rollout/samples_per_prompt": spp,
            "policy/entropy": 1.0 / it,
        }
        if ev is not None and upd > 0:
            r["value/explained_variance"] = ev[(upd - 1) % len(ev)]
        if ev_target is not None and upd > 0:
            r["value/explained_variance_target"] = ev_target[(upd - 1) % len(ev_target)]
        for b in BUCKETS:
            if bias is not None and upd > 0:
                r[f"value/bias_pos_{b}"] = bias[b] / upd
        if it > pretrain and upd in evals:
            r[f"eval/avg@{K}"] = evals[upd]
            r[f"eval/strict_avg@{K}"] = max(0.0, evals[upd] - strict_offset)
        cum_s += seconds_per_iter
        cum_t += length * prompts * spp
        if cumulative:
            r["perf/cumulative_seconds"], r["perf/cumulative_tokens"] = cum_s, cum_t
        if memory is not None:
            r["perf/peak_memory_mb"] = memory + it
        rows.append(r)
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if isinstance(v, float) and math.isnan(v) else v) for c, v in r.items()})
    return run_dir


def write_manifest(out: Path, grid: str, rows: list, cells: list) -> Path:
    """cells: [(row, seed, run folder)]."""
    path = out / "grids" / f"{grid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "grid": grid,
                "description": "synthetic",
                "rows": rows,
                "cells": [
                    {"row": r, "seed": s, "cell_id": f"{r}-{s}", "run_dir": str(Path(d).relative_to(out))}
                    for r, s, d in cells
                ],
            }
        )
    )
    return path


def label(components) -> str:
    return run_label(components, "gae")
