"""Data-parallel throughput on the CPU: one process against two (Lightning DDP, gloo), side by side.

    python benchmarks/data_parallel.py              # default preset's batch, 6 PPO iterations, 2 rounds
    python benchmarks/data_parallel.py --rounds 3 --steps 8

Three settings run the same config (the `default` preset without value pretraining, the built-in
task and model) through `python -m vapo_lit.cli.train`, in an order that rotates every round:

* ``1 proc x 1 thread``  -- one process, one torch thread
* ``1 proc x 2 threads`` -- one process using both cores through torch's threads
* ``2 procs x 1 thread`` -- `--devices 2 --strategy ddp`: each process takes half of the prompts

The number per run is the median of `perf/step_seconds` over its PPO iterations after the first
(start-up, the first eval and the model build are outside it). Printed: the medians over rounds,
their ratios to ``1 proc x 1 thread``, and generated tokens per second. On a 2-core machine the
two processes share the cores with nothing else, so the ratio says what DDP costs or gains over
threads here; on GPUs each process has its own device.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "1 proc x 1 thread": (["--threads", "1"], 1),
    "1 proc x 2 threads": (["--threads", "2"], 2),
    "2 procs x 1 thread": (["--threads", "1", "--devices", "2", "--strategy", "ddp"], 1),
}


def run(name: str, out: Path, args) -> dict:
    extra, omp = SETTINGS[name]
    env = {**os.environ, "OMP_NUM_THREADS": str(omp), "PYTHONWARNINGS": "ignore", "VAPO_LIT_PROGRESS": "0"}
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--drop",
        "value_pretraining",
        "--steps",
        str(args.steps),
        "--eval_every",
        "0",
        "--eval_problems",
        "8",
        "--eval_k",
        "1",
        "--wandb",
        "disabled",
        "--accelerator",
        "cpu",
        "--checkpoint_every",
        "1000",
        "--out_dir",
        str(out),
        "--name",
        "run",
        *extra,
    ]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
    rows = [x for x in csv.DictReader(open(out / "run" / "metrics.csv")) if x.get("perf/step_seconds")]
    steps = [float(x["perf/step_seconds"]) for x in rows[1:]]
    toks = [float(x["perf/tokens_per_second"]) for x in rows[1:] if x.get("perf/tokens_per_second")]
    return {
        "step": statistics.median(steps),
        "tokens_per_s": statistics.median(toks) if toks else float("nan"),
        "wall": time.time() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="PPO iterations per run (the first is not timed)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each setting, in rotating order")
    args = ap.parse_args()
    names = list(SETTINGS)
    results = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                res = run(name, Path(tmp) / f"{i}-{names.index(name)}", args)
                results[name].append(res)
                print(
                    f"round {i + 1} {name}: {res['step']:.2f} s/iteration, {res['tokens_per_s']:.0f} tokens/s "
                    f"({res['wall']:.0f} s wall)",
                    flush=True,
                )
    base = statistics.median(r["step"] for r in results[names[0]])
    print(f"\n{'setting':<20} {'s/iteration':>12} {'tokens/s':>10} {'speedup vs 1x1':>15}")
    for name in names:
        step = statistics.median(r["step"] for r in results[name])
        tps = statistics.median(r["tokens_per_s"] for r in results[name])
        print(f"{name:<20} {step:>12.2f} {tps:>10.0f} {base / step:>14.2f}x")


if __name__ == "__main__":
    main()
