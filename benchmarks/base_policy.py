"""Build the built-in base policy + reward model from an empty cache and measure them.

    .venv/bin/python benchmarks/base_policy.py [--cache-dir DIR] [--keep-cache] [--ev-steps N]

Prints: build times (policy, reward model, total), cached load time, the per-bucket avg@8 table
(temperature 1.0, top-p 0.7) on the eval set, seconds per generate() of 64 responses, and the
token-level explained variance of a critic pretrained with Monte-Carlo returns (lambda = 1) on
base-policy samples, measured on held-out base-policy samples.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temporary directory (empty cache)")
    ap.add_argument("--keep-cache", action="store_true")
    ap.add_argument("--ev-steps", type=int, default=300, help="value-pretraining steps for the EV check")
    ap.add_argument("--ev-samples", type=int, default=1024)
    ap.add_argument("--ev-lr", type=float, default=5e-3)
    ap.add_argument("--skip-ev", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))

    from vapo_lit.evaluation import evaluate, format_table
    from vapo_lit.models import load_critic, load_policy
    from vapo_lit.models.builtin import explained_variance, sample_scored, train_value
    from vapo_lit.engines.hf import generate
    from vapo_lit.tasks import get_task

    cache = args.cache_dir or tempfile.mkdtemp(prefix="vapo-lit-bench-")
    task = get_task("chain")
    log = lambda m: print("  " + m, flush=True)  # noqa: E731
    try:
        t0 = time.time()
        policy, tok = load_policy("builtin", task, seed=args.seed, cache_dir=cache, log=log)
        t1 = time.time()
        rm = load_critic("reward_model", task, seed=args.seed, cache_dir=cache, log=log)
        t2 = time.time()
        print(f"build: policy {t1 - t0:.1f}s, reward model {t2 - t1:.1f}s, total {t2 - t0:.1f}s")
        t3 = time.time()
        policy, tok = load_policy("builtin", task, seed=args.seed, cache_dir=cache)
        rm = load_critic("reward_model", task, seed=args.seed, cache_dir=cache)
        print(f"cached load (policy + reward model): {time.time() - t3:.2f}s")
        print(f"policy parameters: {sum(p.numel() for p in policy.parameters())}")

        t4 = time.time()
        metrics = evaluate(
            policy, task, task.eval_problems(), k=8, temperature=1.0, top_p=0.7, seed=args.seed
        )
        print(f"eval ({len(task.eval_problems())} problems x 8) took {time.time() - t4:.1f}s")
        print(format_table(metrics, task))

        longest = [p for p in task.eval_problems() if 2 * p.meta["n"] + 3 >= 200]
        lm = evaluate(policy, task, longest, k=128, temperature=1.0, top_p=0.7, seed=args.seed + 1)
        print(
            f"eval problems with a >= 200-token answer: {len(longest)} x 128 samples: avg@128"
            f" {100 * lm['eval/avg@128']:.2f}%, rewarded responses {round(lm['eval/avg@128'] * len(longest) * 128)},"
            f" longest rewarded {lm['eval/correct_len_max']:.0f} tokens"
        )

        probs = task.train_problems(64, seed=123)
        times = []
        for _ in range(3):
            s = time.time()
            ro = generate(
                policy,
                tok,
                [p.prompt for p in probs],
                max_new_tokens=task.max_new_tokens,
                temperature=1.0,
                top_p=1.0,
                seeds=0,
            )
            times.append(time.time() - s)
        print(
            f"generate() of 64 responses (top-p 1): {', '.join(f'{t:.2f}' for t in times)} s;"
            f" max length {int(ro.lengths.max())}, mean {ro.lengths.float().mean():.1f}"
        )

        if not args.skip_ev:
            t5 = time.time()
            train = sample_scored(policy, task, args.ev_samples, seed=args.seed + 555)
            held = sample_scored(policy, task, 256, seed=args.seed + 777)
            print(
                f"EV data: train {args.ev_samples} / held-out 256 base samples (top-p 1),"
                f" held-out mean reward {torch.cat([r for _, r in held]).mean():.3f}"
                f" ({time.time() - t5:.1f}s)"
            )
            print(f"reward model as critic, before value pretraining: {explained_variance(rm, held)}")
            inits = [
                ("reward_model", rm),
                ("actor", load_critic("actor", task, seed=args.seed, cache_dir=cache)),
            ]
            for init, critic in inits:
                s = time.time()
                train_value(
                    critic,
                    train,
                    steps=args.ev_steps,
                    batch_size=32,
                    lr=args.ev_lr,
                    warmup_steps=10,
                    all_tokens=True,
                    balance=False,
                    seed=args.seed,
                )
                print(
                    f"critic init={init}, {args.ev_steps} MC value-pretraining steps, lr {args.ev_lr}"
                    f" ({time.time() - s:.1f}s): held-out {explained_variance(critic, held)}",
                    flush=True,
                )
    finally:
        if not args.keep_cache and args.cache_dir is None:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
