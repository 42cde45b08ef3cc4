"""Golden metric histories: short fixed-seed runs of the full VAPO recipe and of vanilla PPO on a
shrunken built-in chain task, with a tiny policy SFT'd in float64 inside the test (seconds, and
reproducible across machines: float64 leaves no rounding that could flip a sampled token).

    python tests/golden.py --record     # rewrite tests/data/golden_*.csv (say why in the commit)

`tests/test_golden.py` reruns both and compares every non-`perf/` column. The histories were
first recorded on the code before the `Experience` redesign; a change that alters them on
purpose re-records them and says so.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
DATA = HERE / "data"
RUNS = {"vapo": None, "vanilla_ppo": []}  # components: None = all seven

CONFIG = {
    "task": "chain",
    "task_options": {"min_n": 2, "max_n": 7, "n_buckets": 2, "eval_per_bucket": 3},
    "ppo": {"actor_lr": 5e-4, "critic_lr": 1e-3, "responses_per_step": 16, "mini_batch_size": 8,
            "micro_batch_size": 4, "ppo_epochs": 2, "warmup_steps": 2},
    "vapo": {"alpha": 0.5, "value_pretrain_steps": 2, "samples_per_prompt": 4, "lambda_critic": 1.0,
             "eps_high": 0.28, "mu": 0.1},
    "steps": 4, "eval_every": 2, "eval_k": 2, "checkpoint_every": 2, "seed": 3, "wandb": "disabled",
}


def make_config(tmp: Path, label: str):
    from vapo_lit.config import COMPONENTS, RunConfig, merge

    comps = RUNS[label]
    return merge(RunConfig(), {**CONFIG, "components": list(COMPONENTS) if comps is None else comps,
                               "out_dir": str(tmp / "runs"), "name": label, "cache_dir": str(tmp / "cache")})


def factory(cfg):
    """Task from the config; tiny Llama SFT'd for 150 steps in float64; critic = its backbone + fresh head."""
    from vapo_lit.models.builtin import SFTConfig, TinyModelConfig, train_sft
    from vapo_lit.models.value import ValueModel
    from vapo_lit.module import VapoModule
    from vapo_lit.tasks import get_task

    task = get_task(cfg.task, **cfg.task_options)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        actor = train_sft(task, TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=64, max_position_embeddings=64),
                          SFTConfig(steps=150, batch_size=16, lr=1e-2, warmup_steps=5), seed=0)
        with torch.random.fork_rng():
            torch.manual_seed(1)
            critic = ValueModel.from_causal_lm(actor)
    finally:
        torch.set_default_dtype(before)
    return VapoModule(cfg, task, actor, task.tokenizer, critic)


def run(tmp: Path, label: str) -> list[dict]:
    from vapo_lit.train import train

    summary = train(make_config(tmp, label), module_factory=factory)
    with open(Path(summary["run_dir"]) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and v != ""} for r in rows]


def path_of(label: str) -> Path:
    return DATA / f"golden_{label}.csv"


def record(tmp: Path) -> None:
    DATA.mkdir(exist_ok=True)
    for label in RUNS:
        rows = comparable(run(tmp, label))
        keys = sorted({k for r in rows for k in r})
        with open(path_of(label), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        print(f"{path_of(label)}: {len(rows)} rows, {len(keys)} columns")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/golden.py --record")
    with tempfile.TemporaryDirectory() as d:
        record(Path(d))
