"""What a chain-task policy does, measured on samples: the testbed properties the long Table 1
states (docs/results/table1-long/index.md), for the built-in base policy or any exported policy folder.

    python tools/chain_properties.py                         # the longchain base policy (built if needed)
    python tools/chain_properties.py runs/x/policy-final     # a trained policy (its folder's task: --task)
    python tools/chain_properties.py --task chain --samples 512 --seed 3

Samples `--samples` responses to training prompts (temperature 1, top-p 1: the policy itself) and
prints: reward and strict accuracy overall and by the task's length buckets; the length of the
correct responses (min / median / max, tokens with EOS); the per-step error rates, each step
judged against the value the response itself wrote before it (hard steps, k % 10 == 0, where the
demonstrator errs; every other step; counters), and the lambda_policy that length-adaptive GAE
gives the shortest and longest correct responses at `--alpha`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def step_errors(task, problem, text: str) -> dict:
    """Per-step error counts of one response, each value judged from the value written before it."""
    from vapo_lit.tasks.chain import step_value

    n, v = int(problem.meta["n"]), int(problem.meta["x0"])
    toks = text.split()
    out = {"hard": [0, 0], "easy": [0, 0], "counter": [0, 0]}
    for i, k in enumerate(range(n, 0, -1)):
        if 2 * i + 1 >= len(toks):
            break
        counter, digit = toks[2 * i], toks[2 * i + 1]
        out["counter"][0] += 1
        out["counter"][1] += counter != f"{k}:"
        if counter != f"{k}:" or digit not in tuple("0123456789"):
            break
        want = step_value(v, k, add_counter=task.config.add_counter, add_const=task.config.add_const)
        kind = out["hard"] if k % 10 == 0 else out["easy"]
        kind[0] += 1
        kind[1] += int(digit) != want
        v = int(digit)
    return out


def measure(model, task, samples: int, seed: int, alpha: float) -> str:
    from vapo_lit.engines import SamplingParams, make_engine
    from vapo_lit.rng import sample_seed

    engine = make_engine("hf", model, task.tokenizer, task=task)
    probs = task.train_problems(samples, seed=seed)
    sampling = SamplingParams(max_new_tokens=task.max_new_tokens, temperature=1.0, top_p=1.0)
    texts, lengths = [], []
    for s in range(0, samples, 256):
        ro = engine.generate(
            [p.prompt for p in probs[s : s + 256]],
            sampling,
            [sample_seed(seed, i) for i in range(s, min(s + 256, samples))],
        )
        texts += ro.texts
        lengths += ro.lengths.tolist()
    verdicts = [task.verify(p, t) for p, t in zip(probs, texts)]
    errors = {"hard": [0, 0], "easy": [0, 0], "counter": [0, 0]}
    for p, t in zip(probs, texts):
        for kind, (n, bad) in step_errors(task, p, t).items():
            errors[kind][0] += n
            errors[kind][1] += bad
    lines = [
        f"{samples} samples of training prompts (temperature 1, top-p 1), seed {seed}; "
        f"mean response length {statistics.mean(lengths):.0f} tokens",
        f"reward {statistics.mean(v.reward for v in verdicts):.3f}, strict "
        f"{statistics.mean(bool(v.strict) for v in verdicts):.3f}",
    ]
    for b in task.bucket_names():
        idx = [i for i, p in enumerate(probs) if task.bucket(p) == b]
        if idx:
            lines.append(
                f"  {b}: {len(idx):4d} prompts, reward {statistics.mean(verdicts[i].reward for i in idx):.3f}, "
                f"strict {statistics.mean(bool(verdicts[i].strict) for i in idx):.3f}"
            )
    correct = sorted(length for length, v in zip(lengths, verdicts) if v.reward > 0)
    if correct:
        lam = [max(0.0, 1 - 1 / (alpha * n)) for n in (correct[0], correct[-1])]
        lines.append(
            f"correct responses: {len(correct)}, length min {correct[0]} / median "
            f"{statistics.median(correct):.0f} / max {correct[-1]} tokens; lambda_policy at alpha {alpha}: "
            f"{lam[0]:.3f} .. {lam[1]:.4f}"
        )
    else:
        lines.append("correct responses: none")
    for kind, (n, bad) in errors.items():
        lines.append(f"{kind} steps: {n}, wrong {bad} ({bad / max(n, 1):.2e})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", nargs="?", default="builtin", help="'builtin' or an exported policy folder")
    ap.add_argument("--task", default="longchain", help="chain or longchain (default longchain)")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=12345, help="prompt and sampling seed (default 12345)")
    ap.add_argument("--alpha", type=float, default=0.5, help="length-adaptive GAE alpha for the lambda line")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    from vapo_lit.models import load_policy
    from vapo_lit.tasks import get_task

    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    if args.policy != "builtin" and not Path(args.policy).is_dir():
        print(
            f"{args.policy!r} is not a folder; give 'builtin' or an exported policy folder", file=sys.stderr
        )
        return 2
    model, _ = load_policy(args.policy, task)
    print(measure(model, task, args.samples, args.seed, args.alpha))
    return 0


if __name__ == "__main__":
    sys.exit(main())
