"""GPU check of the one-device path: a randomly initialised Qwen2-shaped model of about 0.5B
parameters (built from a config, nothing downloaded) trained for a few iterations of the paper's
recipe scaled to fit one GPU, in bf16-mixed precision with fp32 master weights, gradient
checkpointing and the memory-bounded passes. Prints seconds per iteration, generated tokens per
second and peak GPU memory. Under 8 minutes on one H100/H200-class GPU (not yet run on one).

    python benchmarks/gpu_smoke.py                 # 0.5B on the GPU
    python benchmarks/gpu_smoke.py --shape tiny    # the same code path on the CPU in seconds (in the test suite)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {
    # Qwen2.5-0.5B's block (hidden 896, 14 heads, 2 KV heads, MLP 4864) with a 32k vocabulary and 30
    # layers instead of 24 x 152k vocabulary: about the same 0.5B parameters, no tokenizer download.
    "0.5b": dict(
        model=dict(
            hidden_size=896,
            num_hidden_layers=30,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
        ),
        vocab=32_000,
        prompt_len=64,
        max_new_tokens=512,
        ppo=dict(
            responses_per_step=512,
            mini_batch_size=64,
            micro_batch_size=16,
            rollout_batch_size=256,
            logits_chunk=256,
            actor_lr=1e-6,
            critic_lr=2e-6,
        ),
        samples_per_prompt=16,
        iterations=3,
        precision="bf16-mixed",
        accelerator="cuda",
    ),
    "tiny": dict(
        model=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
        ),
        vocab=512,
        prompt_len=8,
        max_new_tokens=16,
        ppo=dict(
            responses_per_step=16,
            mini_batch_size=8,
            micro_batch_size=4,
            rollout_batch_size=8,
            logits_chunk=8,
            actor_lr=1e-6,
            critic_lr=2e-6,
        ),
        samples_per_prompt=4,
        iterations=2,
        precision="32-true",
        accelerator="cpu",
    ),
}


def build(shape: dict, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from synthetic import SyntheticTask
    from vapo_lit.models.value import ValueModel

    task = SyntheticTask(
        vocab=shape["vocab"], prompt_len=shape["prompt_len"], max_new_tokens=shape["max_new_tokens"]
    )
    tok = task.tokenizer
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=shape["vocab"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **shape["model"],
    )
    actor = Qwen2ForCausalLM(cfg)
    critic = ValueModel.from_causal_lm(actor)
    return task, actor, critic


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--iterations", type=int, help="PPO iterations after one value-pretraining iteration")
    ap.add_argument("--out", help="run folder parent (default: a temporary folder)")
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]

    import torch

    from vapo_lit.config import COMPONENTS, RunConfig, merge
    from vapo_lit.models import enable_gradient_checkpointing
    from vapo_lit.module import VapoModule
    from vapo_lit.train import train

    if shape["accelerator"] == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_smoke: no CUDA device; use --shape tiny for the CPU variant")
    iterations = args.iterations or shape["iterations"]
    task, actor, critic = build(shape)
    n_params = sum(p.numel() for p in actor.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        cfg = merge(
            RunConfig(),
            {
                "components": list(COMPONENTS),
                "ppo": shape["ppo"],
                "steps": iterations,
                "eval_every": 0,
                "eval_k": 1,
                "eval_problems": 4,
                "accelerator": shape["accelerator"],
                "precision": shape["precision"],
                "gradient_checkpointing": True,
                "wandb": "disabled",
                "out_dir": out,
                "cache_dir": out,
                "name": "gpu_smoke",
                "vapo": {"samples_per_prompt": shape["samples_per_prompt"], "value_pretrain_steps": 1},
            },
        )
        if shape["accelerator"] == "cpu":
            cfg = merge(cfg, {"threads": 1})

        def factory(c):
            for m in (actor, critic):
                enable_gradient_checkpointing(m)
            return VapoModule(c, task, actor, task.tokenizer, critic)

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        summary = train(cfg, module_factory=factory)
        wall = time.perf_counter() - t0
        import csv

        rows = [
            r
            for r in csv.DictReader(open(Path(summary["run_dir"]) / "metrics.csv"))
            if r.get("perf/step_seconds")
        ]
    steps = [float(r["perf/step_seconds"]) for r in rows]
    tps = [float(r["perf/tokens_per_second"]) for r in rows]
    result = {
        "shape": args.shape,
        "parameters": n_params,
        "device": torch.cuda.get_device_name()
        if torch.cuda.is_available() and shape["accelerator"] == "cuda"
        else "cpu",
        "precision": shape["precision"],
        "responses_per_iteration": shape["ppo"]["responses_per_step"],
        "max_new_tokens": shape["max_new_tokens"],
        "iterations": len(rows),
        "seconds_per_iteration": steps,
        "generated_tokens_per_second": tps,
        "peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 2**30
        if torch.cuda.is_available()
        else None,
        "wall_seconds": wall,
        "final_loss_policy": rows[-1].get("loss/policy"),
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
