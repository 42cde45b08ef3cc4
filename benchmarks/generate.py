"""Sampling speed: vapo-lit's static-cache loop (finished rows dropped) against stepping
transformers' own forward for every row, side by side, interleaved, on the same prompts and seeds;
`unfused` is the same loop with the q/k/v and gate/up fusion switched off (FUSE_MAX_BYTES = -1).

    python benchmarks/generate.py                 # built-in policy, 64 responses of the chain task
    python benchmarks/generate.py --fixed 96      # every response exactly 96 tokens (EOS suppressed)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--responses", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fixed", type=int, default=0, help="suppress EOS and generate exactly this many tokens")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from vapo_lit.models import load_policy
    from vapo_lit.engines.hf import generate
    from vapo_lit.tasks import get_task

    task = get_task("chain")
    model, tok = load_policy("builtin", task)
    max_new = args.fixed or task.max_new_tokens
    if args.fixed:  # no token counts as EOS: every response runs to the limit
        import vapo_lit.engines.hf as hf

        hf.eos_ids_of = lambda model, tokenizer: [-1]
    prompts = [p.prompt for p in task.train_problems(args.responses, seed=123)]
    import vapo_lit.engines.fast_decode as fast_decode

    names = ("fast", "unfused", "plain")
    cap = fast_decode.FUSE_MAX_BYTES
    times = {name: [] for name in names}
    tokens, ids = {}, {}
    for r in range(args.repeats + 1):  # the first round warms up
        for name in names[r % 3:] + names[:r % 3]:  # the order rotates
            fast_decode.FUSE_MAX_BYTES = -1 if name == "unfused" else cap
            t0 = time.perf_counter()
            ro = generate(model, tok, prompts, max_new_tokens=max_new, seeds=r, fast=name != "plain")
            if r:
                times[name].append(time.perf_counter() - t0)
                tokens[name] = int(ro.lengths.sum())
            ids[name] = ro.response_ids
        assert all(torch.equal(ids["fast"], ids[n]) for n in names), "the loops sampled different tokens"
    fast_decode.FUSE_MAX_BYTES = cap
    print(f"built-in policy, {args.responses} responses, max_new_tokens {max_new}, {args.threads} thread(s), "
          f"{args.repeats} interleaved repetitions")
    for name in names:
        t = times[name]
        print(f"  {name:<6} {statistics.median(t):.3f} s [{min(t):.3f}-{max(t):.3f}]  "
              f"{tokens[name] / statistics.median(t):.0f} tokens/s")
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"fused vs unfused: {med['unfused'] / med['fast']:.2f}x")
    print(f"fast vs plain: {med['plain'] / med['fast']:.2f}x")


if __name__ == "__main__":
    main()
