"""Peak memory of one PPO iteration against responses per step and response length (CPU).

    python benchmarks/memory.py            # the table (each configuration in its own process)
    python benchmarks/memory.py --quick    # fewer configurations

A random Llama with a 32,000-token vocabulary (so full-vocabulary logits dominate, as they do for
real LLMs) answers synthetic prompts; EOS is suppressed so every response has exactly the
requested length. Each configuration runs one full iteration (rollout, critic values, GAE, critic
and actor updates) through `vapo_lit.train.train` in a fresh process; the reported number is the
process's peak resident memory during the iteration minus its resident memory just before it.

Two settings side by side, on the same model and batch:
* plain:    everything at once (rollout_batch_size = micro_batch_size = responses per step, no logits chunks)
* bounded:  rollout_batch_size 16, micro_batch_size 8, logits_chunk 32 (the memory-bounded passes)
Peak memory of `bounded` must stay flat as the responses per step grow; `plain` grows with them.

    python benchmarks/memory.py --decode   # the static-cache decoder at a GQA shape, before/after
    python benchmarks/memory.py --load     # host memory of one rank loading actor + critic

`--decode`: peak memory of the fast decoder's token loop (vapo_lit.engines.fast_decode) at a 7:1
grouped-query shape (14 query heads, 2 K/V heads, head dim 64; 64 rows, 16-token prompts, 1024
positions; half the rows dropped by `keep()` halfway), each in its own process: `before` is the
decoder as it was (K/V cache in the prefill's dtype, float32 under autocast; grouped K/V copied
by repeat_interleave at every layer step; `keep()` building the new cache beside the old), `after`
is the current one (cache in the compute dtype, `enable_gqa` inside SDPA, `keep()` in place).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB, HIDDEN, LAYERS = 32_000, 128, 2


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(spec: dict) -> dict:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from vapo_lit.config import RunConfig, merge
    from vapo_lit.models.value import ValueModel
    from vapo_lit.module import VapoModule
    from vapo_lit.tasks.base import Problem, Task, Verdict
    from vapo_lit.train import train

    torch.set_num_threads(1)
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=wl, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )

    class Synthetic(Task):
        name, version, max_new_tokens = "synthetic", "1", spec["length"]

        @property
        def tokenizer(self):
            return tok

        def train_problems(self, n, seed):
            return [
                Problem(" ".join(f"w{(seed + i * 7 + j) % 900}" for j in range(16)), "0") for i in range(n)
            ]

        def eval_problems(self):
            return self.train_problems(2, 0)

        def verify(self, problem, response):
            return Verdict(0.0)

    class NoEos(LlamaForCausalLM):
        def forward(self, *a, **kw):
            out = super().forward(*a, **kw)
            out.logits[..., tok.eos_token_id] = -1e4
            return out

    torch.manual_seed(0)
    actor = NoEos(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=4 * HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    )
    critic = ValueModel.from_causal_lm(actor)
    n = spec["responses"]
    bounded = spec["mode"] == "bounded"
    ppo = {
        "responses_per_step": n,
        "mini_batch_size": n,
        "micro_batch_size": 8 if bounded else n,
        "rollout_batch_size": 16 if bounded else n,
        "logits_chunk": 32 if bounded else None,
        "max_new_tokens": spec["length"],
    }
    with tempfile.TemporaryDirectory() as d:
        cfg = merge(
            RunConfig(),
            {
                "components": [],
                "ppo": ppo,
                "steps": 1,
                "eval_every": 0,
                "eval_k": 1,
                "wandb": "disabled",
                "out_dir": d,
                "threads": 1,
                "cache_dir": d,
            },
        )
        base = {}

        def factory(c):
            m = VapoModule(c, Synthetic(), actor, tok, critic)
            base["rss"] = rss_mb()
            return m

        train(cfg, module_factory=factory)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**spec, "peak_mb": peak - base["rss"]}


DECODE_SHAPE = {
    "rows": 64,
    "prompt": 16,
    "positions": 1024,
    "hidden": 896,
    "heads": 14,
    "kv_heads": 2,
    "layers": 2,
    "vocab": 512,
}


def decode_one(spec: dict) -> dict:
    """Peak RSS (MB above the process after prefill) of one decode loop: `spec` = {"code": before |
    after, "compute": fp32 | bf16-autocast}, at DECODE_SHAPE."""
    import contextlib
    import time

    import torch
    import torch.nn.functional as F
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vapo_lit.engines import fast_decode
    from vapo_lit.engines.fast_decode import StaticDecoder, _rope

    def _rotary(q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rope(q, cos, sin), _rope(k, cos, sin)

    class Before(StaticDecoder):
        """The earlier decoder, kept as this benchmark's baseline (the parts it compares)."""

        def __init__(self, model, cache, key_valid, capacity):
            saved = fast_decode.compute_dtype
            fast_decode.compute_dtype = lambda m: (
                fast_decode._layer_kv(cache, 0)[0].dtype
            )  # the prefill's dtype
            try:
                super().__init__(model, cache, key_valid, capacity)
            finally:
                fast_decode.compute_dtype = saved
            self.key_valid = torch.zeros((len(key_valid), capacity), dtype=torch.bool)  # the whole row's keys
            self.key_valid[:, : key_valid.shape[1]] = key_valid.bool()

        def keep(self, keep):
            self.k = [t[keep] for t in self.k]
            self.v = [t[keep] for t in self.v]
            self.key_valid, self.rows = self.key_valid[keep], self.rows[keep]

        @torch.no_grad()
        def step(self, tokens, positions):
            t = self.length
            self.length += 1
            self.key_valid[:, t] = True
            x = self.inner.embed_tokens(tokens[:, None])
            cos, sin = self.inner.rotary_emb(x, positions[:, None])
            mask = self.key_valid[:, None, None, : t + 1]
            for i, (layer, fused) in enumerate(zip(self.inner.layers, self.fused)):
                attn = layer.self_attn
                q, k, v = fused.qkv(fused.norm(layer.input_layernorm, x))
                q, k, v = (p.view(x.shape[0], 1, -1, attn.head_dim).transpose(1, 2) for p in (q, k, v))
                q, k = _rotary(q, k, cos, sin)
                self.k[i][:, :, t : t + 1] = k
                self.v[i][:, :, t : t + 1] = v
                keys, values = self.k[i][:, :, : t + 1], self.v[i][:, :, : t + 1]
                groups = q.shape[1] // keys.shape[1]
                keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
                x = x + attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], 1, -1))
                x = x + fused.mlp(fused.norm(layer.post_attention_layernorm, x))
            return self.model.lm_head(self.inner.norm(x))[:, -1, :]

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sh = DECODE_SHAPE
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=sh["vocab"],
            hidden_size=sh["hidden"],
            intermediate_size=2 * sh["hidden"],
            num_hidden_layers=sh["layers"],
            num_attention_heads=sh["heads"],
            num_key_value_heads=sh["kv_heads"],
            max_position_embeddings=sh["positions"],
        )
    ).eval()
    n, P = sh["rows"], sh["prompt"]
    ids = torch.randint(3, sh["vocab"], (n, P))
    mask = torch.ones_like(ids)
    region = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if spec["compute"] == "bf16-autocast"
        else contextlib.nullcontext()
    )
    with torch.no_grad(), region:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        base = rss_mb()
        dec = (Before if spec["code"] == "before" else StaticDecoder)(
            model, out.past_key_values, mask, sh["positions"]
        )
        steps = sh["positions"] - P
        t0 = time.perf_counter()
        for s in range(steps):
            if s == steps // 2:
                dec.keep(torch.arange(len(dec.rows)) % 2 == 0)
            logits = dec.step(
                torch.randint(3, sh["vocab"], (len(dec.rows),)), torch.full((len(dec.rows),), P + s)
            )
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        **spec,
        "peak_mb": peak - base,
        "cache_dtype": str(dec.k[0].dtype).replace("torch.", ""),
        "tokens_per_second": steps * n * 0.75 / seconds,
        "logits_finite": bool(torch.isfinite(logits).all()),
    }


def decode_table(env: dict) -> None:
    sh = DECODE_SHAPE
    print(
        f"fast-decode peak memory (MB above the process after prefill): Qwen2 {sh['layers']}x{sh['hidden']}, "
        f"{sh['heads']}:{sh['kv_heads']} heads, {sh['rows']} rows x {sh['positions']} positions"
    )
    print(
        f"{'compute':>13} {'before MB':>9} {'after MB':>8} {'before/after':>12} {'cache dtype':>17} {'tok/s b/a':>11}"
    )
    for compute in ("fp32", "bf16-autocast"):
        row = {}
        for code in ("before", "after"):
            out = subprocess.run(
                [sys.executable, __file__, "--decode-one", json.dumps({"code": code, "compute": compute})],
                capture_output=True,
                text=True,
                env=env,
            )
            if out.returncode:
                sys.exit(out.stderr[-2000:])
            row[code] = json.loads(out.stdout.strip().splitlines()[-1])
        b, a = row["before"], row["after"]
        print(
            f"{compute:>13} {b['peak_mb']:>9.0f} {a['peak_mb']:>8.0f} {b['peak_mb'] / a['peak_mb']:>12.2f} "
            f"{b['cache_dtype'] + '/' + a['cache_dtype']:>17} "
            f"{b['tokens_per_second']:>5.0f}/{a['tokens_per_second']:<5.0f}",
            flush=True,
        )


def load_one(model_dir: str) -> dict:
    """Host memory one rank spends loading the actor and an actor-initialised critic (what every
    rank does before FSDP shards them): peak RSS above the process before, in model sizes."""
    import torch

    from vapo_lit.models import load_critic, load_policy
    from vapo_lit.tasks import get_task

    torch.set_num_threads(1)
    task = get_task("chain")
    base = rss_mb()
    actor, _ = load_policy(model_dir, task)
    critic = load_critic("actor", task, policy_spec=model_dir)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    size = sum(p.numel() * p.element_size() for p in actor.parameters()) / 2**20
    return {
        "model_mb": size,
        "peak_mb": peak,
        "held_mb": rss_mb() - base,
        "critic_params": sum(p.numel() for p in critic.parameters()),
    }


def load_table(env: dict) -> None:
    """A random ~100M-parameter Qwen2 saved as a model folder, loaded as one rank loads it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vapo_lit.tasks import get_task

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=32_000,
                hidden_size=768,
                intermediate_size=2048,
                num_hidden_layers=8,
                num_attention_heads=12,
                num_key_value_heads=2,
            )
        ).save_pretrained(d)
        get_task("chain").tokenizer.save_pretrained(d)
        out = subprocess.run(
            [sys.executable, __file__, "--load-one", d], capture_output=True, text=True, env=env
        )
        if out.returncode:
            sys.exit(out.stderr[-2000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"host memory of one rank loading actor + critic (critic_init=actor), float32: model {r['model_mb']:.0f} MB, "
        f"peak {r['peak_mb']:.0f} MB ({r['peak_mb'] / r['model_mb']:.2f} x), held after {r['held_mb']:.0f} MB "
        f"({r['held_mb'] / r['model_mb']:.2f} x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--decode", action="store_true", help="the fast decoder's memory at a GQA shape, before/after"
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--decode-one", help=argparse.SUPPRESS)
    ap.add_argument("--load", action="store_true", help="host memory of one rank loading actor + critic")
    ap.add_argument("--load-one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    if args.decode_one:
        print(json.dumps(decode_one(json.loads(args.decode_one))))
        return
    if args.load_one:
        print(json.dumps(load_one(args.load_one)))
        return
    if args.load:
        load_table({**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        return
    if args.decode:
        decode_table({**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        return
    responses = [16, 32, 64] if args.quick else [16, 32, 64, 128]
    lengths = [64] if args.quick else [64, 128]
    print(
        f"peak memory of one PPO iteration (MB above the process before it); Llama {LAYERS}x{HIDDEN}, vocab {VOCAB}"
    )
    print(f"{'responses':>9} {'length':>6} {'plain MB':>9} {'bounded MB':>10} {'plain/bounded':>13}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for length in lengths:
        for n in responses:
            row = {}
            for mode in ("plain", "bounded"):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        json.dumps({"responses": n, "length": length, "mode": mode}),
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if out.returncode:
                    sys.exit(out.stderr[-2000:])
                row[mode] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
            print(
                f"{n:>9} {length:>6} {row['plain']:>9.0f} {row['bounded']:>10.0f} {row['plain'] / row['bounded']:>13.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
