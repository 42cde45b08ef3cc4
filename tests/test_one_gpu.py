"""Issue 10's one-device path, checked on the CPU: memory-bounded passes equal the plain ones
(float64), chunked rollouts sample the same responses, bf16-mixed training moves fp32 master
weights at lr 1e-6, gradient checkpointing gives the same gradients, `--preset paper --model DIR`
runs through the CLI with the default critic init, and the exported policy loads with
`AutoModelForCausalLM.from_pretrained` and gives the trained module's log-probs."""

from __future__ import annotations

import copy
import csv
import json

import pytest
import torch
from test_own_model import data_file, make_model_dir  # noqa: F401  (fixture)
from test_rollout import PROMPTS, tiny_model

from vapo_lit import passes
from vapo_lit.config import COMPONENTS, RunConfig, merge
from vapo_lit.experience import Experience, fill_values
from vapo_lit.models import enable_gradient_checkpointing
from vapo_lit.models.value import ValueModel
from vapo_lit.presets import PRESETS
from vapo_lit.engines.hf import generate
from vapo_lit.rollout import concat_rollouts
from vapo_lit.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


def rollout(task, model, n_prompts=3, max_new=10, seed=1):
    return generate(model, task.tokenizer, PROMPTS * n_prompts, max_new_tokens=max_new, seeds=seed)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_chunked_logprob_pass_equals_the_plain_one(task, kind):
    model = tiny_model(kind, len(task.tokenizer), task.tokenizer).double()
    ro = rollout(task, model)
    P = ro.prompt_ids.shape[1]
    results = []
    for chunk in (None, 3, 1):
        model.zero_grad()
        lp, ent = passes.response_logprobs(
            model,
            ro.input_ids,
            ro.attention_mask,
            P,
            ro.response_ids,
            temperature=0.7,
            entropy=True,
            chunk=chunk,
        )
        (lp * ro.response_mask).sum().backward()
        results.append((lp.detach(), ent, [p.grad.clone() for p in model.parameters()]))
    assert passes.output_layer_split(model) is not None  # the chunked path was taken
    for lp, ent, grads in results[1:]:
        torch.testing.assert_close(lp, results[0][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(ent, results[0][1], rtol=0, atol=1e-12)
        for a, b in zip(grads, results[0][2]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # without autograd (recomputed behaviour log-probs, the KL reference): the same numbers at T = 0.7
    with torch.no_grad():
        for chunk in (3, 1):
            lp, ent = passes.response_logprobs(
                model,
                ro.input_ids,
                ro.attention_mask,
                P,
                ro.response_ids,
                temperature=0.7,
                entropy=True,
                chunk=chunk,
            )
            torch.testing.assert_close(lp, results[0][0], rtol=0, atol=1e-12)
            torch.testing.assert_close(ent, results[0][1], rtol=0, atol=1e-12)


def test_chunked_value_pass_equals_the_plain_one(task):
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer).double()
    critic = ValueModel.from_causal_lm(model).double()
    ro = rollout(task, model, n_prompts=4)
    whole = Experience.from_rollout(ro, [None] * len(ro.texts))
    parts = Experience.from_rollout(ro, [None] * len(ro.texts))
    fill_values(whole, critic, truncation="bootstrap")
    fill_values(parts, critic, truncation="bootstrap", chunk=3)
    torch.testing.assert_close(parts.values, whole.values, rtol=0, atol=1e-12)
    torch.testing.assert_close(parts.bootstrap, whole.bootstrap, rtol=0, atol=1e-12)


def test_chunked_rollout_samples_the_same_responses(task):
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer).double()
    prompts = PROMPTS * 3
    seeds = list(range(100, 100 + len(prompts)))
    whole = generate(model, task.tokenizer, prompts, max_new_tokens=12, seeds=seeds)
    parts = concat_rollouts(
        [
            generate(model, task.tokenizer, prompts[s : s + 5], max_new_tokens=12, seeds=seeds[s : s + 5])
            for s in range(0, len(prompts), 5)
        ],
        task.tokenizer.pad_token_id,
    )
    assert parts.texts == whole.texts
    for f in ("response_mask", "lengths", "truncated"):
        assert torch.equal(getattr(parts, f), getattr(whole, f)), f
    m = whole.response_mask.bool()
    torch.testing.assert_close(parts.logprobs[m], whole.logprobs[m], rtol=0, atol=1e-6)
    # prompts re-padded on the left: the same real tokens in the same places relative to the response
    assert torch.equal(parts.prompt_ids[parts.prompt_mask.bool()], whole.prompt_ids[whole.prompt_mask.bool()])


def test_gradient_checkpointing_gives_the_same_gradients(task):
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer).double()
    ro = rollout(task, model)
    P = ro.prompt_ids.shape[1]
    critic0 = ValueModel.from_causal_lm(model).double()
    grads = []
    for checkpointed in (False, True):
        m, critic = copy.deepcopy(model), copy.deepcopy(critic0)
        if checkpointed:
            enable_gradient_checkpointing(m)
            enable_gradient_checkpointing(critic)
            assert m.model.gradient_checkpointing and m.training
        lp, _ = passes.response_logprobs(
            m, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=1.0
        )
        v = passes.state_values(critic, ro.input_ids, ro.attention_mask, P)
        ((lp * ro.response_mask).sum() + v.pow(2).sum()).backward()
        grads.append([p.grad.clone() for p in [*m.parameters(), *critic.parameters()]])
        if checkpointed:  # sampling still works (eval mode with a KV cache), then back to training mode
            again = generate(m, task.tokenizer, PROMPTS, max_new_tokens=4, seeds=0)
            assert again.response_ids.shape[0] == len(PROMPTS) and m.training
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def smoke(tmp_path, **delta) -> RunConfig:
    cfg = merge(RunConfig(), PRESETS["smoke"])
    return merge(
        cfg,
        {
            "out_dir": str(tmp_path / "runs"),
            "wandb": "disabled",
            "cache_dir": str(tmp_path / "cache"),
            "model": "random",
            "threads": 1,
            **delta,
        },
    )


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().float() for p in model.parameters()])


def test_bf16_mixed_moves_fp32_master_weights_at_small_lr(tmp_path):
    """fp32 weights + bf16 compute (Lightning's bf16-mixed): lr 1e-6 changes (almost) every weight.
    bf16 weights (bf16-true) lose most such updates to rounding, which is why the default is fp32."""
    from vapo_lit.build import build_module
    from vapo_lit.train import train

    changed = {}
    for label, delta in (
        ("mixed", {"precision": "bf16-mixed"}),
        ("bf16_weights", {"precision": "bf16-true", "model_dtype": "bfloat16"}),
    ):
        cfg = smoke(
            tmp_path,
            name=label,
            components=[],
            steps=2,
            eval_every=0,
            ppo={"actor_lr": 1e-6, "critic_lr": 1e-6, "warmup_steps": 0},
            **delta,
        )
        made = {}

        def factory(c):
            made["m"] = build_module(c)
            made["before"] = _flat(made["m"].actor)
            return made["m"]

        with pytest.warns(UserWarning, match="AdamW") if label == "bf16_weights" else _nothing():
            summary = train(cfg, module_factory=factory)
        after = _flat(made["m"].actor)
        changed[label] = float((after != made["before"]).float().mean())
        card = json.loads(open(f"{summary['run_dir']}/run_card.json").read())
        assert (
            card["hardware"]["precision"] == delta["precision"] and card["hardware"]["accelerator"] == "cpu"
        )
    print("share of actor weights changed by 2 iterations at lr 1e-6:", changed)
    assert changed["mixed"] > 0.95, changed
    assert changed["bf16_weights"] < 0.5 * changed["mixed"], changed


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_bf16_behaviour_logprobs_agree_with_the_update(task):
    """Sampling and the update's forward both under bf16 autocast: the PPO ratio starts near 1.
    The tolerance that holds here (mean |log ratio| < 0.02, max < 0.25) is what bf16's 8-bit mantissa
    allows; `ppo.recompute_logprobs` removes the gap entirely (the update's own numerics)."""
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ro = rollout(task, model, n_prompts=4, max_new=16)
        P = ro.prompt_ids.shape[1]
        lp, _ = passes.response_logprobs(
            model, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=1.0
        )
    m = ro.response_mask.bool()
    gap = (lp.detach().float() - ro.logprobs)[m].abs()
    assert float(gap.mean()) < 0.02 and float(gap.max()) < 0.25, (float(gap.mean()), float(gap.max()))


def test_paper_preset_on_a_local_model_through_the_cli(tmp_path, data_file):  # noqa: F811
    from vapo_lit.cli.train import main

    model_dir = make_model_dir(tmp_path / "my-model")
    out = tmp_path / "runs"
    code = main(
        [
            "--preset",
            "paper",
            "--model",
            str(model_dir),
            "--task",
            "math",
            "--task_options",
            json.dumps({"train_path": str(data_file), "max_new_tokens": 8, "max_eval": 4}),
            "--ppo.responses_per_step",
            "16",
            "--ppo.mini_batch_size",
            "8",
            "--ppo.micro_batch_size",
            "4",
            "--ppo.rollout_batch_size",
            "8",
            "--ppo.logits_chunk",
            "4",
            "--vapo.samples_per_prompt",
            "4",
            "--vapo.value_pretrain_steps",
            "1",
            "--steps",
            "2",
            "--eval_k",
            "2",
            "--eval_every",
            "1",
            "--wandb",
            "disabled",
            "--threads",
            "1",
            "--out_dir",
            str(out),
            "--cache_dir",
            str(tmp_path / "c"),
        ]
    )
    assert code == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [r["train/ppo_update"] for r in rows] == ["0", "0", "1", "2"]
    card = json.loads((run / "run_card.json").read_text())
    assert (
        card["config"]["critic_init"] == "auto"
        and card["value_initialisation_and_warmup"]["critic_init"] == "actor"
    )
    for name in ("policy-final", "policy-best", "critic-final"):
        assert (run / name / "config.json").is_file(), name


def test_exported_policy_loads_and_gives_the_trained_log_probs(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vapo_lit.build import build_module
    from vapo_lit.train import train

    made = {}

    def factory(c):
        made["m"] = build_module(c)
        return made["m"]

    cfg = smoke(
        tmp_path, components=list(COMPONENTS), steps=2, eval_every=1, vapo={"value_pretrain_steps": 1}
    )
    summary = train(cfg, module_factory=factory)
    run = summary["run_dir"]
    loaded = AutoModelForCausalLM.from_pretrained(f"{run}/policy-final", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(f"{run}/policy-final", local_files_only=True)
    trained = made["m"].actor
    ro = generate(trained, made["m"].tokenizer, PROMPTS, max_new_tokens=8, seeds=3)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        a, _ = passes.response_logprobs(
            trained, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=1.0
        )
        b, _ = passes.response_logprobs(
            loaded, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=1.0
        )
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert tok(PROMPTS[0])["input_ids"] == made["m"].tokenizer(PROMPTS[0])["input_ids"]
    critic = ValueModel.from_pretrained(f"{run}/critic-final")
    assert ValueModel.is_value_dir(f"{run}/critic-final")
    with torch.no_grad():
        torch.testing.assert_close(
            critic(ro.input_ids, ro.attention_mask),
            made["m"].critic(ro.input_ids, ro.attention_mask),
            rtol=0,
            atol=1e-6,
        )
    # a run can start from the exported policy
    again = train(
        smoke(
            tmp_path,
            model=f"{run}/policy-best",
            critic_init="actor",
            name="again",
            components=[],
            steps=1,
            eval_every=0,
        )
    )
    assert again["ppo_updates"] == 1


def test_gpu_smoke_script_cpu_variant():
    """benchmarks/gpu_smoke.py's code path (random Qwen2, bf16-capable config, gradient checkpointing,
    memory-bounded passes, all components) on a tiny shape, so the GPU script cannot rot."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_smoke

    out = gpu_smoke.main(["--shape", "tiny"])
    assert out["iterations"] == 3 and out["parameters"] > 0  # 1 value-pretraining + 2 PPO iterations
    assert all(s > 0 for s in out["seconds_per_iteration"]) and all(
        t > 0 for t in out["generated_tokens_per_second"]
    )


def test_trimmed_micro_batches_give_the_same_numbers(task):
    """Experience.select(trim=True) cuts the columns no selected row uses (leading prompt padding,
    trailing response padding): the update's log-probs and values on valid tokens are unchanged."""
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer).double()
    with torch.no_grad():
        model.lm_head.weight[task.tokenizer.eos_token_id] += 3 * model.lm_head.weight.std()  # varied lengths
    critic = ValueModel.from_causal_lm(model).double()
    ro = generate(
        model, task.tokenizer, ["7:", "chain 3 from 12: 12: 6 11: 0"] * 4, max_new_tokens=20, seeds=2
    )
    exp = Experience.from_rollout(ro, [None] * len(ro.texts))
    short = torch.argsort(exp.lengths)[:2]
    assert int(exp.lengths[short].max()) < exp.mask.shape[1]  # there is something to trim
    full, cut = exp.select(short), exp.select(short, trim=True)
    assert cut.mask.shape[1] < full.mask.shape[1] or cut.prompt_width < full.prompt_width
    for mb in (full, cut):
        mb.lp, _ = passes.response_logprobs(
            model, mb.input_ids, mb.attention_mask, mb.prompt_width, mb.response_ids, temperature=1.0
        )
        mb.v = passes.state_values(critic, mb.input_ids, mb.attention_mask, mb.prompt_width)[:, :-1]
    R = cut.mask.shape[1]
    m = cut.mask.bool()
    torch.testing.assert_close(cut.lp[m], full.lp[:, :R][m], rtol=0, atol=1e-12)
    torch.testing.assert_close(cut.v[m], full.v[:, :R][m], rtol=0, atol=1e-12)
    assert torch.equal(full.mask[:, R:], torch.zeros_like(full.mask[:, R:]))  # only padding was cut
