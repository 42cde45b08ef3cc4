"""Golden metric histories: short fixed-seed runs of the full VAPO recipe and of vanilla PPO on a
shrunken built-in chain task, with a tiny policy SFT'd in float64 inside the test (seconds).

    python tests/golden.py --record     # rewrite tests/data/golden_*.csv (say why in the commit)
    python tests/golden.py --check      # rerun both and compare (exit 1 with the first difference)

`tests/test_golden.py` reruns both and compares every non-`perf/` column, in its own process and,
in subprocesses, under the other CPU instruction sets this machine has (`ATEN_CPU_CAPABILITY`).

Why the histories hold on any CPU: the models are float64 and so is everything the run computes
from them (sampling, behaviour log-probs, values, GAE, losses). torch's vectorised kernels differ
between instruction sets (default, AVX2, AVX-512, NEON/SVE) in their last bits; in float64 that is
~1e-16 relative, which leaves no rounding that could flip a sampled token and moves no logged
number by more than ~1e-13 relative (measured: default vs AVX2 vs AVX-512 on one machine, largest
difference 1e-13 relative, 2e-17 absolute). A float32 result anywhere in the chain moves the
histories by 1e-7 to 4e-5 relative between instruction sets (measured before the sampler kept
float64: behaviour log-probs were rounded to float32), which `TOLERANCE` refuses.
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
    "ppo": {
        "actor_lr": 5e-4,
        "critic_lr": 1e-3,
        "responses_per_step": 16,
        "mini_batch_size": 8,
        "micro_batch_size": 4,
        "ppo_epochs": 2,
        "warmup_steps": 2,
    },
    "vapo": {
        "alpha": 0.5,
        "value_pretrain_steps": 2,
        "samples_per_prompt": 4,
        "lambda_critic": 1.0,
        "eps_high": 0.28,
        "mu": 0.1,
    },
    "steps": 4,
    "eval_every": 2,
    "eval_k": 2,
    "checkpoint_every": 2,
    "seed": 3,
    "wandb": "disabled",
}


def make_config(tmp: Path, label: str):
    from vapo_lit.config import COMPONENTS, RunConfig, merge

    comps = RUNS[label]
    return merge(
        RunConfig(),
        {
            **CONFIG,
            "components": list(COMPONENTS) if comps is None else comps,
            "out_dir": str(tmp / "runs"),
            "name": label,
            "cache_dir": str(tmp / "cache"),
        },
    )


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
        actor = train_sft(
            task,
            TinyModelConfig(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
            SFTConfig(steps=150, batch_size=16, lr=1e-2, warmup_steps=5),
            seed=0,
        )
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


TOLERANCE = {"rel": 1e-9, "abs": 1e-12}
"""Four orders of magnitude above the measured spread across instruction sets (1e-13 relative),
three below what one float32 step in the chain causes (1e-7 relative and up, 9e-9 absolute)."""


def differences(got: list[dict], want: list[dict]) -> list[tuple]:
    """(step, column, got, recorded) for every value outside TOLERANCE (NaN equals NaN), and a
    step or column that one side lacks."""
    import math

    if [r["step"] for r in got] != [r["step"] for r in want]:
        return [("steps", "step", [r["step"] for r in got], [r["step"] for r in want])]
    out = []
    for g, w in zip(got, want):
        if sorted(g) != sorted(w):
            out.append((w["step"], "columns", sorted(set(g) - set(w)), sorted(set(w) - set(g))))
            continue
        for key, expected in w.items():
            a, b = float(g[key]), float(expected)
            if math.isnan(a) and math.isnan(b):
                continue
            if math.isnan(a) or math.isnan(b) or abs(a - b) > TOLERANCE["abs"] + TOLERANCE["rel"] * abs(b):
                out.append((w["step"], key, a, b))
    return out


def recorded(label: str) -> list[dict]:
    with open(path_of(label), newline="") as f:
        return [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def check(tmp: Path) -> int:
    """Rerun every golden run and compare; print the CPU capability and the first differences."""
    capability = torch.backends.cpu.get_cpu_capability()
    bad = 0
    for label in RUNS:
        diffs = differences(comparable(run(tmp / label, label)), recorded(label))
        bad += len(diffs)
        print(f"{label}: capability {capability}: {len(diffs)} differences {diffs[:5]}")
    return 1 if bad else 0


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
    if sys.argv[1:] not in (["--record"], ["--check"]):
        sys.exit("usage: python tests/golden.py --record | --check")
    with tempfile.TemporaryDirectory() as d:
        if sys.argv[1] == "--record":
            record(Path(d))
        else:
            sys.exit(check(Path(d)))
