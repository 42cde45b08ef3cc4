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
    tok = PreTrainedTokenizerFast(tokenizer_object=wl, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")

    class Synthetic(Task):
        name, version, max_new_tokens = "synthetic", "1", spec["length"]

        @property
        def tokenizer(self):
            return tok

        def train_problems(self, n, seed):
            return [Problem(" ".join(f"w{(seed + i * 7 + j) % 900}" for j in range(16)), "0") for i in range(n)]

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
    actor = NoEos(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                              num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                              max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    critic = ValueModel.from_causal_lm(actor)
    n = spec["responses"]
    bounded = spec["mode"] == "bounded"
    ppo = {"responses_per_step": n, "mini_batch_size": n, "micro_batch_size": 8 if bounded else n,
           "rollout_batch_size": 16 if bounded else n, "logits_chunk": 32 if bounded else None,
           "max_new_tokens": spec["length"]}
    with tempfile.TemporaryDirectory() as d:
        cfg = merge(RunConfig(), {"components": [], "ppo": ppo, "steps": 1, "eval_every": 0, "eval_k": 1,
                                  "wandb": "disabled", "out_dir": d, "threads": 1, "cache_dir": d})
        base = {}

        def factory(c):
            m = VapoModule(c, Synthetic(), actor, tok, critic)
            base["rss"] = rss_mb()
            return m

        train(cfg, module_factory=factory)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**spec, "peak_mb": peak - base["rss"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    responses = [16, 32, 64] if args.quick else [16, 32, 64, 128]
    lengths = [64] if args.quick else [64, 128]
    print(f"peak memory of one PPO iteration (MB above the process before it); Llama {LAYERS}x{HIDDEN}, vocab {VOCAB}")
    print(f"{'responses':>9} {'length':>6} {'plain MB':>9} {'bounded MB':>10} {'plain/bounded':>13}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for length in lengths:
        for n in responses:
            row = {}
            for mode in ("plain", "bounded"):
                out = subprocess.run([sys.executable, __file__, "--one", json.dumps({"responses": n, "length": length,
                                      "mode": mode})], capture_output=True, text=True, env=env)
                if out.returncode:
                    sys.exit(out.stderr[-2000:])
                row[mode] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
            print(f"{n:>9} {length:>6} {row['plain']:>9.0f} {row['bounded']:>10.0f} {row['plain'] / row['bounded']:>13.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
