"""Sampling speed: vapo-lit's static-cache loop (finished rows dropped) against stepping
transformers' own forward for every row, side by side, interleaved, on the same prompts and seeds;
`unfused` is the same loop with the q/k/v and gate/up fusion switched off (FUSE_MAX_BYTES = -1).
Then the loop's seconds per token step against its floor.

    python benchmarks/generate.py                 # built-in policy, 64 responses of the chain task
    python benchmarks/generate.py --fixed 96      # every response exactly 96 tokens (EOS suppressed)
    python benchmarks/generate.py --long          # 32 responses x 1,024 tokens (EOS suppressed), 3 repetitions

The floor of one token step (32 rows at the long shape) is the larger of two lower bounds, each
measured on this machine in this run, single-threaded like the loop:

* compute: the step's floating-point work (2 x rows x the weights of every matrix product, plus the
  attention's 4 x rows x heads x head_dim x context) at the measured float32 matmul rate (a large
  square product);
* memory: the bytes the step must read (every weight once, and each row's whole K/V cache, all
  layers) at the measured read bandwidth (a sum over a buffer larger than the caches).

At long responses the K/V cache dominates: each token step reads every row's cache once, so the
memory bound is the one that binds (the line says which).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def matmul_rate(size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a float32 (size x size) @ (size x size) product, best of `repeats`."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best


def read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a float32 sum over a buffer of `megabytes` (larger than the last-level cache), best of `repeats`."""
    x = torch.ones(megabytes * 2**20 // 4)
    x.sum()
    best = min(_seconds(x.sum) for _ in range(repeats))
    return x.numel() * 4 / best


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_floor(model, rows: int, prompt: int, tokens: int, rate: float, bandwidth: float) -> dict:
    """Lower bounds of the mean token step of `rows` rows decoding `tokens` tokens after a
    `prompt`-token prompt: FLOPs at `rate`, bytes at `bandwidth`."""
    cfg = model.config
    layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    elem = next(model.parameters()).element_size()
    matmul_weights = sum(
        m.weight.numel() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    )  # projections, MLPs, output layer
    context = prompt + (tokens - 1) / 2  # mean keys attended per step
    flops = 2 * rows * matmul_weights + 4 * rows * layers * heads * head_dim * context
    weight_bytes = sum(p.numel() for p in model.parameters()) * elem
    cache_bytes = 2 * layers * rows * kv_heads * head_dim * context * elem
    compute, memory = flops / rate, (weight_bytes + cache_bytes) / bandwidth
    return {
        "flops": flops,
        "bytes": weight_bytes + cache_bytes,
        "cache_bytes": cache_bytes,
        "compute_s": compute,
        "memory_s": memory,
        "floor_s": max(compute, memory),
        "bound": "memory" if memory >= compute else "compute",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--responses", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fixed", type=int, default=0, help="suppress EOS and generate exactly this many tokens")
    ap.add_argument(
        "--long", action="store_true", help="32 responses x 1,024 tokens (EOS suppressed), 3 repetitions"
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.long:
        args.responses, args.fixed, args.repeats = 32, 1024, min(args.repeats, 3)
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
        for name in names[r % 3 :] + names[: r % 3]:  # the order rotates
            fast_decode.FUSE_MAX_BYTES = -1 if name == "unfused" else cap
            t0 = time.perf_counter()
            ro = generate(model, tok, prompts, max_new_tokens=max_new, seeds=r, fast=name != "plain")
            if r:
                times[name].append(time.perf_counter() - t0)
                tokens[name] = int(ro.lengths.sum())
            ids[name] = ro.response_ids
        assert all(torch.equal(ids["fast"], ids[n]) for n in names), "the loops sampled different tokens"
    fast_decode.FUSE_MAX_BYTES = cap
    params = sum(p.numel() for p in model.parameters())
    print(
        f"built-in policy ({params:,} parameters), {args.responses} responses, max_new_tokens {max_new}, "
        f"{args.threads} thread(s), {args.repeats} interleaved repetitions"
    )
    for name in names:
        t = times[name]
        print(
            f"  {name:<6} {statistics.median(t):.3f} s [{min(t):.3f}-{max(t):.3f}]  "
            f"{tokens[name] / statistics.median(t):.0f} tokens/s"
        )
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"fused vs unfused: {med['unfused'] / med['fast']:.2f}x")
    print(f"fast vs plain: {med['plain'] / med['fast']:.2f}x")
    if args.fixed:  # every row decodes every token: the step's cost is known
        rate, bandwidth = matmul_rate(), read_bandwidth()
        prompt = max(len(tok(p)["input_ids"]) for p in prompts)
        f = step_floor(model, args.responses, prompt, max_new, rate, bandwidth)
        step = med["fast"] / max_new
        print(
            f"token step (fast, {args.responses} rows, mean over {max_new} steps): {step * 1e3:.3f} ms; floor "
            f"{f['floor_s'] * 1e3:.3f} ms ({f['bound']}-bound; compute {f['compute_s'] * 1e3:.3f} ms = "
            f"{f['flops'] / 1e6:.1f} MFLOP at {rate / 1e9:.1f} GFLOP/s matmul, memory {f['memory_s'] * 1e3:.3f} ms = "
            f"{f['bytes'] / 2**20:.1f} MiB, of which K/V cache {f['cache_bytes'] / 2**20:.1f} MiB, at "
            f"{bandwidth / 2**30:.1f} GiB/s); step / floor: {step / f['floor_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
