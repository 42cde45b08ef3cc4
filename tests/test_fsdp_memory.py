"""Issue 21 (finding 7), on 2 CPU processes (gloo): under bf16-mixed FSDP gathers parameters in bf16
and reduces gradients in float32 over float32 master shards, with the value head kept float32;
sampling runs on the bf16 gathered copy; kl_penalty's reference model is sharded like the actor
(1/W per rank) and gives the unsharded reference's log-probs; a 2-process bf16-mixed FSDP run starts
every update at ratio 1 exactly (slow)."""

from __future__ import annotations

import copy
import dataclasses
import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_rollout import PROMPTS, tiny_model

WORLD = 2


def _local_numel(module) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in module.parameters())


def _checks(rank: int) -> None:
    from vapo_lit.components.kl_penalty import KLPenalty
    from vapo_lit.config import RunConfig, Switches
    from vapo_lit.distributed import ActorScorer, gathered_for_sampling, is_sharded, shard_model
    from vapo_lit.engines.hf import generate
    from vapo_lit.models.value import ValueModel
    from vapo_lit.passes import response_logprobs
    from vapo_lit.tasks import get_task

    tok = get_task("chain", max_n=12, n_buckets=2).tokenizer
    model = tiny_model("llama", len(tok), tok)  # seeded: the same weights on every rank
    initial = copy.deepcopy(model)
    ro = generate(model, tok, PROMPTS, max_new_tokens=6, seeds=0)
    P, mask = ro.prompt_ids.shape[1], ro.response_mask

    # bf16-mixed: bf16 all-gathers, float32 gradient reduction and master shards; the value head float32
    actor = shard_model(ActorScorer(model), "bf16-mixed")
    critic = ValueModel.from_causal_lm(initial)
    unsharded = copy.deepcopy(critic).to(
        torch.bfloat16
    )  # what the policy computes with: bf16 weights, float32 head
    unsharded.head.float()
    shard_model(critic, "bf16-mixed")
    q = model.model.layers[0].self_attn.q_proj
    seen = {}

    def record(name):
        def hook(module, args):
            seen.setdefault(name, module.weight.dtype)

        return hook

    q.register_forward_pre_hook(record("q"))
    critic.head.register_forward_pre_hook(record("head"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = actor(ro.input_ids, ro.attention_mask, P, ro.response_ids, 1.0)
        v = critic(ro.input_ids, ro.attention_mask)
    ((lp * mask).sum() + v.sum()).backward()
    assert seen == {"q": torch.bfloat16, "head": torch.float32}, seen
    assert (
        v.dtype == torch.float32 and q.weight.dtype == torch.float32 and q.weight.grad.dtype == torch.float32
    )
    assert is_sharded(critic.head) and q.weight.to_local().numel() * WORLD == q.weight.numel()
    # the same data on both ranks: the reduced gradient is one rank's (within bf16 noise: the copy's
    # rotary tables are bf16 too; a dropped hook or a wrong reduction is off by 50% or more)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        unsharded(ro.input_ids, ro.attention_mask).sum().backward()
    for name in ("head.weight", "head.bias"):
        got, want = critic.get_parameter(name).grad.full_tensor(), unsharded.get_parameter(name).grad
        assert float((got - want).abs().max()) <= 1e-2 * float(want.abs().max()), name
    with gathered_for_sampling(actor):  # sampling on the bf16 gathered copy
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        again = generate(model, tok, PROMPTS, max_new_tokens=6, seeds=0)
    assert again.response_ids.shape[0] == len(PROMPTS) and q.weight.dtype == torch.float32

    # 32-true: no policy, gathered in the weights' own dtype
    plain = shard_model(ActorScorer(copy.deepcopy(initial)), "32-true")
    with gathered_for_sampling(plain):
        assert {p.dtype for p in plain.parameters()} == {torch.float32}

    # kl_penalty's reference: sharded under FSDP, the unsharded reference's log-probs
    kl = KLPenalty()
    trainer = SimpleNamespace(strategy=SimpleNamespace(strategy_name="vapo_fsdp"), precision="32-true")
    kl.setup(
        trainer, SimpleNamespace(actor=initial, switches=Switches(), components=[], cfg=RunConfig()), "fit"
    )
    assert kl.sharded and _local_numel(kl.reference) < 0.6 * sum(p.numel() for p in initial.parameters())
    exp = SimpleNamespace(
        input_ids=ro.input_ids,
        attention_mask=ro.attention_mask,
        prompt_width=P,
        response_ids=ro.response_ids,
        n=len(PROMPTS),
        mask=mask,
        extras={},
    )
    cfg = RunConfig()  # as a module holds it: ppo's 'auto' pass sizes resolved (here: no chunking)
    cfg = dataclasses.replace(
        cfg, ppo=dataclasses.replace(cfg.ppo, logits_chunk=None, rollout_batch_size=None)
    )
    kl.on_experience(SimpleNamespace(cfg=cfg), exp)
    with torch.no_grad():
        want, _ = response_logprobs(
            initial, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=1.0
        )
    torch.testing.assert_close(exp.extras["ref_logprobs"], want, rtol=0, atol=1e-6)
    assert all(p.to_local().numel() < p.numel() for p in kl.reference.parameters()), "resharded after use"


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        _checks(rank)
    finally:
        dist.destroy_process_group()


def test_fsdp_bf16_policy_and_sharded_kl_reference_on_two_processes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port,), nprocs=WORLD, join=True)


@pytest.mark.slow
def test_two_fsdp_processes_under_bf16_mixed_start_every_update_at_ratio_one(tmp_path):
    """2-process FSDP, bf16-mixed, the smoke recipe + kl_penalty (sharded reference): each rank
    recomputes the behaviour log-probs of its own micro-batches at the gathered batch's padding,
    so every update's (single) mini-batch starts at ratio 1 exactly."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vapo_lit.cli.train",
            "--preset",
            "smoke",
            "--model",
            "random",
            "--precision",
            "bf16-mixed",
            "--accelerator",
            "cpu",
            "--devices",
            "2",
            "--strategy",
            "fsdp",
            "--add",
            "kl_penalty",
            "--steps",
            "2",
            "--eval_every",
            "1",
            "--wandb",
            "disabled",
            "--threads",
            "1",
            "--ppo.mini_batch_size",
            "16",
            "--out_dir",
            str(tmp_path),
            "--cache_dir",
            str(tmp_path / "c"),
            "--name",
            "fsdp",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out.stderr
    updates = [
        r for r in csv.DictReader(open(tmp_path / "fsdp" / "metrics.csv")) if r.get("policy/ratio_mean")
    ]
    assert len(updates) == 2
    for r in updates:
        assert float(r["policy/ratio_mean"]) == 1.0 and float(r["policy/ratio_max"]) == 1.0, r
        assert float(r["policy/approx_kl"]) == 0.0 and r["policy/kl_initial"], r
    card = json.loads((tmp_path / "fsdp" / "run_card.json").read_text())
    assert card["hardware"]["strategy"] == "vapo_fsdp" and card["sampling"]["recompute_logprobs"] is True
