"""The update's forward + backward passes on a padded micro-batch: with a dense attention mask (the
rows as they are, the masked baseline) against vapo-lit's mask-free causal pass
(`vapo_lit.passes`: rows moved left by their prompt padding, no mask), side by side, interleaved,
on the same rows; the two agree to float rounding (checked here, and in tests/test_passes.py).

    python benchmarks/passes.py                 # 8 rows x (5 + 1,024) tokens, the step benchmark's 0.86M model
    python benchmarks/passes.py --reps 7 --tokens 512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def masked_actor(actor, ids, attn, P, response):
    from vapo_lit import algos, passes

    logits = actor(
        input_ids=ids, attention_mask=attn, position_ids=passes.position_ids_from_mask(attn)
    ).logits
    return algos.token_logprobs(logits[:, P - 1 : -1].float(), response)


def masked_critic(critic, ids, attn, P):
    return critic(ids, attn)[:, P - 1 : -1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024, help="response columns (the prompt has 5)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import step

    from vapo_lit import passes

    task = step.chain_task()
    shape = SimpleNamespace(hidden=128, layers=3, heads=4, intermediate=544, seed=0)
    actor = step.build_policy(shape, task.tokenizer).train()
    critic = step.build_critic(actor, 0).train()
    n, P, R = args.rows, 5, args.tokens
    g = torch.Generator().manual_seed(0)
    attn = torch.ones(n, P + R, dtype=torch.long)
    attn[::2, :2] = 0  # half the prompts left-padded by 2
    for i in range(1, n, 2):  # the other half's responses end early, by up to 30%
        attn[i, P + R - int(torch.randint(1, max(2, int(0.3 * R)), (1,), generator=g)) :] = 0
    ids = torch.randint(5, len(task.tokenizer), (n, P + R), generator=g) * attn
    response, m = ids[:, P:], attn[:, P:].float()

    sides = {
        "actor, masked": lambda: masked_actor(actor, ids, attn, P, response),
        "actor, mask-free": lambda: passes.response_logprobs(actor, ids, attn, P, response, temperature=1.0)[
            0
        ],
        "critic, masked": lambda: masked_critic(critic, ids, attn, P),
        "critic, mask-free": lambda: passes.state_values(critic, ids, attn, P)[:, :-1],
    }
    for pair in (("actor, masked", "actor, mask-free"), ("critic, masked", "critic, mask-free")):
        a, b = (sides[k]() for k in pair)
        gap = float(((a - b).detach() * m).abs().max())
        assert gap < 1e-4, f"{pair}: the passes disagree by {gap}"
    times = {k: [] for k in sides}
    names = list(sides)
    for r in range(args.reps + 1):  # the first round warms up
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            (sides[name]() * m).sum().backward()
            if r:
                times[name].append(time.perf_counter() - t0)
    print(
        f"forward + backward of one micro-batch: {n} rows x ({P} + {R}) tokens, half the prompts left-padded, the other "
        f"half's responses shorter; 0.86M-parameter Llama, fp32, 1 thread, {args.reps} interleaved repetitions"
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"  {k:<18} {med[k]:.3f} s [{min(v):.3f}-{max(v):.3f}]")
    print(
        f"mask-free vs masked: actor {med['actor, masked'] / med['actor, mask-free']:.2f}x, "
        f"critic {med['critic, masked'] / med['critic, mask-free']:.2f}x"
    )


if __name__ == "__main__":
    main()
