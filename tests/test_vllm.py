"""The vLLM rollout engine ("vllm"), with real vLLM (its CPU build here: `make test-vllm` builds
.venv-vllm with it). Where vLLM is not installed (the Makefile's .venv) these tests skip, except the
ones that check what a run without it says.

The engine contract of tests/test_engines.py, for a sampler with its own kernels: on models whose
head size vLLM's CPU backend runs, in float32 (vLLM has no float64), its log-probs compared with the
trainer's to float32 tolerance; the same seeds give the same responses, a response does not depend
on its batch; weights pushed by `load_weights` (and only then) are the ones it samples from. Then a
real `vapo-train` run and a 2-row grid with it, and the one-line refusals of preflight."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_engines import check_seeded_reproducibility, cut_at_stop_ids, set_extra_eos_ids
from test_rollout import PROMPTS, check_invariants

from vapo_lit import passes
from vapo_lit.config import RunConfig, merge
from vapo_lit.engines import RolloutEngine, SamplingParams, make_engine
from vapo_lit.rng import sample_seed
from vapo_lit.tasks import get_task

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NEEDS_VLLM = pytest.mark.skipif(
    not HAS_VLLM,
    reason="vLLM is not installed here (make test-vllm builds .venv-vllm "
    "with vLLM's CPU build and runs these)",
)
TOL = 1e-5
"""vLLM's float32 log-probs against the trainer's float32 recomputation (measured: up to 5e-7 on the
models here; its kernels sum in another order)."""
RTOL = 1e-5
"""... and relative to the log-prob, after weights are perturbed (log-probs down to about -10: one
was 1.05e-5 off, 1.2e-6 of its size)."""


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


def model_of(
    tok, kind: str = "llama", *, hidden=64, heads=1, kv_heads=None, tied=True, seed=0, positions=512
):
    """A random transformers causal LM on the task's vocabulary, in a shape vLLM's CPU backend runs."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tied,
    )
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


@pytest.fixture(scope="module")
def shared(task):
    """One model and its engine for the tests that do not change weights (vLLM starts in seconds, but
    every start costs them)."""
    tok = task.tokenizer
    model = model_of(tok)
    return model, make(model, tok)


def make(model, tok) -> RolloutEngine:
    engine = make_engine("vllm", model, tok)
    assert isinstance(engine, RolloutEngine)
    return engine


def recomputed(model, ro, temperature):
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        return passes.response_logprobs(
            model, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=temperature
        )[0]


@NEEDS_VLLM
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (1.0, 0.7), (0.8, 0.7), (0.0, 1.0)])
def test_behaviour_logprobs_equal_the_training_recomputation(task, shared, temperature, top_p):
    """vLLM's own log-probs of its samples (T = 1: raw log-probs, before the nucleus cut; greedy) and
    the engine's recomputation (other T) are the trainer's log softmax(logits / T) of the sampled token."""
    model, engine = shared
    tok = task.tokenizer
    ro = engine.generate(
        PROMPTS * 3, SamplingParams(max_new_tokens=14, temperature=temperature, top_p=top_p), 4
    )
    check_invariants(ro, len(PROMPTS) * 3, 14, tok)
    assert (engine.recompute_seconds > 0) == (temperature not in (0.0, 1.0))
    m = ro.response_mask.bool()
    want = recomputed(model, ro, temperature)
    torch.testing.assert_close(ro.logprobs[m], want[m].float(), rtol=0, atol=TOL)
    assert ro.logprobs.dtype == torch.float32 and ro.prompt_ids.dtype == torch.long
    if temperature == 0.0:  # greedy: every token is the argmax of the trainer's logits
        P = ro.prompt_ids.shape[1]
        with torch.no_grad():
            logits = model(
                input_ids=ro.input_ids,
                attention_mask=ro.attention_mask,
                position_ids=passes.position_ids_from_mask(ro.attention_mask),
            ).logits[:, P - 1 : -1]
        assert torch.equal(logits.argmax(-1)[m], ro.response_ids[m])


@NEEDS_VLLM
def test_seeded_reproducibility(task, shared):
    check_seeded_reproducibility(shared[1])


@NEEDS_VLLM
def test_a_response_does_not_depend_on_its_batch(task, shared):
    """Response i is a function of (weights, prompt i, seed i) alone: the same (prompt, seed) pairs
    in another order, in a larger batch, or alone give the same tokens and log-probs (vLLM's per-request
    generators; on the CPU backend its float32 kernels give each row the same result whatever the
    batch: equal to the last bit here)."""
    _, engine = shared
    prompts = PROMPTS * 3
    seeds = [sample_seed(5, i) for i in range(len(prompts))]
    s = SamplingParams(max_new_tokens=24)
    whole = engine.generate(prompts, s, seeds)
    order = [7, 2, 11, 0, 5, 9, 1, 4, 10, 3, 8, 6]
    shuffled = engine.generate([prompts[i] for i in order], s, [seeds[i] for i in order])
    padded = engine.generate(prompts + PROMPTS * 5, s, seeds + [sample_seed(6, i) for i in range(20)])
    for j, i in enumerate(order):
        L = int(whole.lengths[i])
        for other, k in ((shuffled, j), (padded, i)):
            assert int(other.lengths[k]) == L and whole.texts[i] == other.texts[k]
            assert torch.equal(whole.response_ids[i, :L], other.response_ids[k, :L])
            torch.testing.assert_close(whole.logprobs[i, :L], other.logprobs[k, :L], rtol=0, atol=0)
    for i in (0, 6, 11):
        one = engine.generate([prompts[i]], s, [seeds[i]])
        assert one.texts[0] == whole.texts[i]
        torch.testing.assert_close(
            one.logprobs[0], whole.logprobs[i, : int(whole.lengths[i])], rtol=0, atol=0
        )


@NEEDS_VLLM
def test_eos_and_truncation_flags(task, shared):
    """A response ends at EOS (kept, terminated) or at max_new_tokens (truncated); prompts are
    left-padded and responses right-padded with the pad id, as every engine's."""
    _, engine = shared
    tok = task.tokenizer
    ro = engine.generate(PROMPTS * 8, SamplingParams(max_new_tokens=12), 3)
    check_invariants(ro, 32, 12, tok)
    assert 0 < int(ro.terminated.sum()) < 32  # both kinds occur (a random model: EOS about 1 token in 30)
    assert bool((ro.lengths[ro.truncated] == 12).all()) and bool((ro.lengths[ro.terminated] <= 12).all())


@NEEDS_VLLM
def test_every_eos_id_of_the_generation_config_ends_a_response(task):
    """Every EOS id of the model's generation config stops a response (terminated, the id kept): the
    same seeds give the one-EOS responses cut after their first stop id."""
    tok = task.tokenizer
    model = model_of(tok, seed=1)
    engine = make(model, tok)
    prompts, s = PROMPTS * 3, SamplingParams(max_new_tokens=16)
    seeds = [sample_seed(3, i) for i in range(len(prompts))]
    free = engine.generate(prompts, s, seeds)
    stop = set_extra_eos_ids(model, tok, free)
    ro = engine.generate(prompts, s, seeds)
    assert cut_at_stop_ids(ro, free, stop, tok.pad_token_id, atol=0) >= 4


@NEEDS_VLLM
def test_callers_rng_threads_and_train_mode_are_left_alone(task):
    """vLLM seeds torch, Python and NumPy when it starts, and its CPU worker replaces
    torch.set_num_threads with a no-op: the engine hands all of it back (the trainer's own RNG streams
    and its --threads setting), and leaves the actor's train mode."""
    tok = task.tokenizer
    model = model_of(tok, seed=2).train()
    engine = make(model, tok)
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(6)
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    threads = torch.get_num_threads()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=5), 0)  # the first call starts vLLM
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, temperature=0.7), 0)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    assert model.training and all(m.training for m in model.modules())
    try:
        torch.set_num_threads(threads + 1)
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def _perturb(model, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@NEEDS_VLLM
@pytest.mark.parametrize(
    "kind,shape",
    [
        ("llama", {"tied": True}),  # the built-in variant's shape
        (
            "llama",
            {"tied": False, "hidden": 128, "heads": 4, "kv_heads": 2},
        ),  # grouped K/V heads, own output layer
        ("qwen2", {"tied": False, "hidden": 64, "heads": 2}),  # q/k/v biases, head size 32
    ],
)
def test_load_weights_makes_vllm_score_with_the_new_weights(task, kind, shape):
    """The actor changes (every weight); vLLM's log-probs of a fixed continuation equal the trainer's
    after `load_weights` and not before (names mapped by vLLM's loader: fused q/k/v and gate/up, tied
    or own output layer, biases), and so do the log-probs of what it samples afterwards."""
    tok = task.tokenizer
    model = model_of(tok, kind, **shape)
    engine = make(model, tok)
    s = SamplingParams(max_new_tokens=20)
    engine.generate(PROMPTS, s, 1)  # vLLM starts, with the initial weights
    fixed = [
        x + y
        for x, y in zip([tok(p)["input_ids"] for p in PROMPTS], ([5, 9, 11, 3, 7, 2], [4, 4, 8], [1], [6, 2]))
    ]
    start = min(map(len, fixed)) - 1

    def trainer():
        out = []
        for x in fixed:
            ids = torch.tensor([x])
            with torch.no_grad():
                lp = passes.sequence_logprobs(model, ids, torch.ones_like(ids), temperature=1.0)[0]
            out.append(lp[start - 1 :])  # column c holds the log-prob of token c + 1
        return out

    for got, want in zip(engine.score(fixed, start), trainer()):
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    _perturb(model, seed=3, scale=0.3)
    stale = engine.score(fixed, start)
    assert max(float((g - w).abs().max()) for g, w in zip(stale, trainer())) > 0.1  # not yet the new weights
    engine.load_weights(model)
    for got, want in zip(engine.score(fixed, start), trainer()):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=TOL)
    ro = engine.generate(PROMPTS * 2, s, 2)
    m = ro.response_mask.bool()
    torch.testing.assert_close(ro.logprobs[m], recomputed(model, ro, 1.0)[m].float(), rtol=RTOL, atol=TOL)


@NEEDS_VLLM
def test_no_stale_prefix_cache_after_load_weights(task):
    """Prompts longer than a KV-cache block are cached by vLLM's prefix caching; after `load_weights`
    a response to the same prompt must not reuse K/V computed with the old weights: its log-probs
    are the new actor's."""
    tok = task.tokenizer
    model = model_of(tok, seed=4)
    engine = make(model, tok)
    words = [w for w in tok.get_vocab() if w not in tok.all_special_tokens]
    long_prompt = " ".join(random.Random(0).choice(words) for _ in range(300))
    prompts = [long_prompt] * 4
    s = SamplingParams(max_new_tokens=8)
    engine.generate(prompts, s, 1)
    engine.generate(prompts, s, 1)  # the prompt's blocks are now in the prefix cache
    _perturb(model, seed=5, scale=0.3)
    engine.load_weights(model)
    ro = engine.generate(prompts, s, 1)
    m = ro.response_mask.bool()
    torch.testing.assert_close(ro.logprobs[m], recomputed(model, ro, 1.0)[m].float(), rtol=RTOL, atol=TOL)


@NEEDS_VLLM
def test_a_weight_sync_leaves_nothing_computed_with_the_old_weights_in_the_prefix_cache(task):
    """Pinned (issue 47). Score a prompt that spans several KV-cache blocks (vLLM's prefix cache keeps
    them), change the weights, sync, score it again: the second scoring is the new weights', equal to
    a fresh HF forward. The scoring is a greedy response's log-probs through `generate`, not
    `engine.score`: vLLM computes prompt log-probs without reading the prefix cache, so `score` cannot
    see a stale cache. A control shows the cache is really in play: the same new weights pushed
    without the engine's reset leave the old K/V in use, off by far more than the tolerance."""
    from vapo_lit.engines.vllm import full_weights

    tok = task.tokenizer
    model = model_of(tok, seed=6)
    engine = make(model, tok)
    words, rng = [w for w in tok.get_vocab() if w not in tok.all_special_tokens], random.Random(1)
    prompts = [" ".join(rng.choice(words) for _ in range(300)) for _ in range(3)]
    s = SamplingParams(max_new_tokens=8, temperature=0.0)

    def gap(ro) -> float:
        """Largest |vLLM log-prob - fresh HF forward's| over the response's tokens."""
        m = ro.response_mask.bool()
        return float((ro.logprobs[m] - recomputed(model, ro, 1.0)[m].float()).abs().max())

    first = engine.generate(prompts, s, 0)  # vLLM starts; the prompts' full blocks go to the prefix cache
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    assert int(first.prompt_mask.sum(1).min()) >= 2 * block, (
        "the prompts must fill KV blocks for the prefix cache"
    )
    assert gap(first) < TOL
    _perturb(model, seed=7, scale=0.3)
    weights = list(
        full_weights(model)
    )  # control: the new weights pushed as `load_weights` does, minus its reset
    engine.llm.collective_rpc(
        lambda worker: worker.model_runner.reload_weights(weights_iterator=iter(weights))
    )
    assert gap(engine.generate(prompts, s, 0)) > 0.1, (
        "no stale K/V without a reset: the check below would see nothing"
    )
    engine.load_weights(model)  # the sync under test
    again = engine.generate(prompts, s, 0)
    m = again.response_mask.bool()
    torch.testing.assert_close(
        again.logprobs[m], recomputed(model, again, 1.0)[m].float(), rtol=RTOL, atol=TOL
    )


@NEEDS_VLLM
def test_the_engine_refuses_float64(task):
    tok = task.tokenizer
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        make(model_of(tok).double(), tok).generate(PROMPTS, SamplingParams(max_new_tokens=4), 0)


# ---- preflight: one line before any run folder ---------------------------------------------


def _preflight(tmp_path, **delta):
    from vapo_lit.preflight import preflight

    cfg = merge(RunConfig(), {"rollout_engine": "vllm", "out_dir": str(tmp_path / "runs"), **delta})
    return preflight(cfg)


@pytest.mark.skipif(HAS_VLLM, reason="checks what a run says where vLLM is not installed")
def test_preflight_without_vllm_names_the_install(tmp_path):
    with pytest.raises(
        ValueError, match=r"^rollout_engine=vllm: vLLM is not installed; pip install 'vapo-lit\[vllm\]'"
    ):
        _preflight(tmp_path)
    assert not (tmp_path / "runs").exists()


@NEEDS_VLLM
def test_preflight_refusals_are_one_line(tmp_path, task):
    """A head size vLLM's CPU backend refuses, float64, a KV cache larger than the machine: one line
    each, naming the fix, before anything is written; the built-in and random models pass (their vLLM
    variants)."""
    tok = task.tokenizer
    local = tmp_path / "head16"
    model_of(tok, hidden=64, heads=4).save_pretrained(local)  # head size 16, as the default built-in
    tok.save_pretrained(local)
    cases = [
        (
            {"model": str(local)},
            r"head size 16 .*which vLLM's CPU backend does not run .*use a model with a head size",
        ),
        ({"builtin_shape": "default"}, r"head size 16 .*--builtin_shape auto or vllm"),
        ({"model_dtype": "float64"}, r"not float64 .*use model_dtype float32"),
        ({"precision": "64-true"}, r"not float64"),
        (
            {"num_nodes": 2},
            r"runs on one machine, one engine per training process \(num_nodes=2\): several machines",
        ),
        (
            {"vllm_kv_cache_gib": 100000.0},
            r"KV cache needs 100000.00 GiB .* available; set a smaller vllm_kv_cache_gib",
        ),
        (
            {"vllm_kv_cache_gib": 1e-6},
            r"vllm_kv_cache_gib=1e-06 holds less than one sequence of the model's 512 "
            r"positions .*give at least 0.00",
        ),
    ]
    for delta, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as e:
            _preflight(tmp_path, accelerator="cpu", **delta)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists()
    for model in ("builtin", "random"):
        _preflight(tmp_path, accelerator="cpu", model=model)
    ok = tmp_path / "head64"
    model_of(tok).save_pretrained(ok)
    tok.save_pretrained(ok)
    _preflight(tmp_path, accelerator="cpu", model=str(ok))


def test_vllm_builtin_variant_has_a_head_size_vllm_runs(task):
    """--rollout_engine vllm builds the built-in models with one attention head of 64 (the default's 4
    heads of 16 are refused), with the default's parameter count; other engines keep the default."""
    from vapo_lit.build import builtin_variant, policy_config
    from vapo_lit.engines.vllm import CPU_HEAD_SIZES, check_shape, head_size
    from vapo_lit.models.builtin import default_model, llama_config

    cfg = merge(RunConfig(), {"rollout_engine": "vllm"})
    variant = builtin_variant(cfg)["model_config"]
    vllm_cfg, default_cfg = policy_config(cfg, task), llama_config(task, default_model(task))
    assert head_size(vllm_cfg) == 64 and head_size(default_cfg) == 16 and 64 in CPU_HEAD_SIZES
    assert check_shape(vllm_cfg, "cpu") is None and "head size 16" in check_shape(default_cfg, "cpu")
    assert variant.hidden_size == default_model(task).hidden_size and variant.num_attention_heads == 1
    assert builtin_variant(merge(RunConfig(), {"rollout_engine": "hf"})) == {}
    assert head_size(policy_config(merge(RunConfig(), {"rollout_engine": "hf"}), task)) == 16
    assert head_size(policy_config(merge(cfg, {"model": "random"}), task)) == 32


# ---- end to end: vapo-train and vapo-ablate with the vllm engine ----------------------------


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@NEEDS_VLLM
@pytest.mark.slow
def test_vapo_train_with_vllm_logs_the_sampler_gap_and_runs_tis(tmp_path):
    """A real vapo-train run with --rollout_engine vllm (the smoke preset, the random model in its vLLM
    shape): the trainer recomputes the behaviour log-probs and logs the sampler's gap every iteration
    (float32: within the engine tolerance); with ppo.tis_cap the TIS weights are logged too, all within
    the cap and near 1 (the gap is that small)."""
    env = {"WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    base = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--rollout_engine",
        "vllm",
        "--out_dir",
        str(tmp_path / "runs"),
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
    ]
    for name, extra in (("plain", []), ("tis", ["--ppo.tis_cap", "2"])):
        done = subprocess.run(
            base + ["--name", name] + extra, capture_output=True, text=True, timeout=600, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        rows = [r for r in _rows(tmp_path / "runs" / name / "metrics.csv") if r["step"] != "0"]
        # plain: 2 value-pretraining iterations, 3 PPO updates; tis: the pretrained critic from the cache
        # (ppo.tis_cap cannot change what value pretraining produces: not in its cache key)
        assert len(rows) == (5 if name == "plain" else 3)
        for r in rows:
            assert 0 <= float(r["rollout/sampler_logprob_diff_max"]) < TOL
            assert (
                0
                <= float(r["rollout/sampler_logprob_diff_mean"])
                <= float(r["rollout/sampler_logprob_diff_max"])
            )
            assert abs(float(r["rollout/sampler_approx_kl"])) < 1e-9
            if name == "tis":
                assert (
                    abs(float(r["rollout/tis_weight_mean"]) - 1) < 1e-4
                    and float(r["rollout/tis_capped_frac"]) == 0
                )
            else:
                assert "rollout/tis_weight_mean" not in r
        card = json.loads((tmp_path / "runs" / name / "run_card.json").read_text())
        assert card["config"]["rollout_engine"] == "vllm" and card["sampling"]["recompute_logprobs"] is True


@NEEDS_VLLM
@pytest.mark.slow
def test_a_two_row_grid_with_vllm(tmp_path):
    """vapo-ablate with --rollout_engine vllm: full VAPO against VAPO without value pretraining, one
    seed, the smoke preset: both cells finish, the report is written and both rows logged the gap."""
    env = {"WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.ablate",
        "--drop",
        "value_pretraining",
        "--seeds",
        "1",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--rollout_engine",
        "vllm",
        "--out",
        str(tmp_path / "abl"),
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted((tmp_path / "abl" / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        rows = [r for r in _rows(run / "metrics.csv") if r["rollout/sampler_logprob_diff_max"]]
        assert rows and all(float(r["rollout/sampler_logprob_diff_max"]) < TOL for r in rows)
    assert list((tmp_path / "abl" / "reports").rglob("table.md"))


@NEEDS_VLLM
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_data_parallel_processes_with_vllm_equal_one(tmp_path, strategy):
    """Data-parallel training with vLLM, DDP and FSDP (actor and critic sharded; each sync gathers
    the actor's shards on every rank): 2 CPU processes (gloo), one engine each, built inside the
    trainer's process group, each sampling its half of the batch with the same per-response seeds as
    one process. The first rollout (before any update) is the single process's exactly; the whole
    metric history equals it within float32 all-reduce rounding; every iteration's sampler gap stays
    at rounding level on both halves (each rank's engine got every weight sync)."""
    env = {"WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    base = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--rollout_engine",
        "vllm",
        "--accelerator",
        "cpu",
        "--out_dir",
        str(tmp_path / "runs"),
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--eval_every",
        "1",
    ]
    runs = {}
    for name, extra in (("single", []), ("ddp", ["--devices", "2", "--strategy", strategy])):
        done = subprocess.run(
            base + ["--name", name, "--cache_dir", str(tmp_path / f"cache-{name}")] + extra,
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = _rows(tmp_path / "runs" / name / "metrics.csv")
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr  # really two processes
    single, ddp = runs["single"], runs["ddp"]
    assert [r["step"] for r in single] == [r["step"] for r in ddp] and len(single) == 6
    first = next(i for i, r in enumerate(single) if r["step"] == "1")
    for k in ("objective/score", "rollout/response_length", "rollout/response_length_max"):
        assert single[first][k] and single[first][k] == ddp[first][k], k
    assert single[0]["eval/avg@2"] == ddp[0]["eval/avg@2"]  # the base eval, each rank sampling its half
    for a, b in zip(single, ddp):
        assert {k for k in a if not k.startswith("perf/")} == {k for k in b if not k.startswith("perf/")}
        for k in a:
            if k.startswith("perf/") or a[k] == b[k]:
                continue
            fa, fb = float(a[k]), float(b[k])
            assert (math.isnan(fa) and math.isnan(fb)) or fa == pytest.approx(fb, rel=1e-4, abs=1e-6), (
                a["step"],
                k,
            )
        if b.get("rollout/sampler_logprob_diff_max"):
            assert float(b["rollout/sampler_logprob_diff_max"]) < TOL
    card = json.loads((tmp_path / "runs" / "ddp" / "run_card.json").read_text())
    assert card["hardware"]["devices"] == 2 and card["hardware"]["strategy"] == f"vapo_{strategy}"
    assert card["config"]["rollout_engine"] == "vllm"


def test_behaviour_logprobs_are_recomputed_by_default_with_vllm_and_with_tis():
    """ppo.recompute_logprobs None (auto) is on for an engine with its own kernels (vllm) and with
    truncated importance sampling, whatever the precision; an explicit setting wins; TIS without the
    recomputation is refused in one line (it would compare the sampler with itself)."""
    from vapo_lit.config import validate
    from vapo_lit.devices import recompute_logprobs
    from vapo_lit.engines import own_kernels

    base = merge(RunConfig(), {"accelerator": "cpu"})
    assert own_kernels("vllm") and not own_kernels("hf") and not own_kernels("cb")
    assert recompute_logprobs(base, "32-true", torch.float32) is False
    assert recompute_logprobs(merge(base, {"rollout_engine": "vllm"}), "32-true", torch.float32) is True
    assert recompute_logprobs(merge(base, {"ppo": {"tis_cap": 2.0}}), "32-true", torch.float32) is True
    off = merge(base, {"rollout_engine": "vllm", "ppo": {"recompute_logprobs": False}})
    assert recompute_logprobs(off, "32-true", torch.float32) is False
    with pytest.raises(
        ValueError,
        match=r"^ppo.tis_cap=2.0 weighs the trainer's behaviour log-probs against the "
        r"sampler's, .*set ppo.recompute_logprobs to true or none",
    ):
        validate(merge(off, {"ppo": {"tis_cap": 2.0}}))
    with pytest.raises(ValueError, match=r"ppo.tis_cap=0.5 is out of range; valid range: >= 1.0"):
        validate(merge(base, {"ppo": {"tis_cap": 0.5}}))


# ----------------------------------------------------------------------------- multi-turn episodes
@pytest.fixture(scope="module")
def tool_task():
    return get_task("toolchain", max_n=4, eval_per_bucket=2)


def replay_observations(task, ro, i) -> None:
    """Walk episode i: every turn (actions up to EOS or a completed stop string) must be followed by
    exactly the observation the environment gives that turn, with no log-prob, until the episode ends."""
    from vapo_lit.engines.episodes import Rules

    rules = Rules.of(task, task.tokenizer)
    prompt = task.tokenizer.decode(
        ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist(), skip_special_tokens=True
    )
    ep = rules.episodes([prompt])[0]
    n = int(ro.lengths[i])
    ids, action = ro.response_ids[i, :n].tolist(), ro.action_mask[i, :n].tolist()
    eos = set(vllm_eos(task))
    j = 0
    while j < n:
        assert action[j] == 1.0, (i, j)
        ep.turn.append(ids[j])
        j += 1
        if ids[j - 1] in eos or rules.stops.completed(ep.turn):
            ep.end_turn(rules, ids[:j], final=ids[j - 1] in eos)
            obs = ep.queue[: n - j]
            assert ids[j : j + len(obs)] == obs and action[j : j + len(obs)] == [0.0] * len(obs), (i, j)
            assert float(ro.logprobs[i, j : j + len(obs)].abs().sum()) == 0.0
            j += len(obs)
            ep.queue = []
            if ep.done:
                assert j == n
    assert int(ro.turns[i]) == ep.turns


def vllm_eos(task):
    tok = task.tokenizer
    return [tok.eos_token_id]


@NEEDS_VLLM
def test_multi_turn_episodes_through_vllm(tool_task):
    """toolchain's episodes sampled by vLLM: each turn is followed by exactly its observation (no
    action mask, no log-prob), vLLM's log-probs of the actions are the trainer's, the same seeds give
    the same episodes and an episode does not depend on its batch-mates."""
    tok = tool_task.tokenizer
    model = model_of(tok, positions=256)
    engine = make_engine("vllm", model, tok, task=tool_task)
    prompts = [p.prompt for p in tool_task.train_problems(6, seed=0)]
    seeds = [sample_seed(3, i) for i in range(len(prompts))]
    s = SamplingParams(max_new_tokens=tool_task.max_new_tokens)
    ro = engine.generate(prompts, s, seeds)
    assert ro.action_mask is not None and ro.turns is not None
    for i in range(len(prompts)):
        replay_observations(tool_task, ro, i)
    assert int((ro.response_mask - ro.action_mask).sum()) > 0  # some observations were written
    act = ro.action_mask.bool()
    torch.testing.assert_close(ro.logprobs[act], recomputed(model, ro, 1.0)[act].float(), rtol=0, atol=TOL)
    again = engine.generate(prompts, s, seeds)
    assert again.texts == ro.texts and torch.equal(again.response_ids, ro.response_ids)
    alone = engine.generate(prompts[2:3], s, seeds[2:3])
    assert alone.texts[0] == ro.texts[2]


@NEEDS_VLLM
@pytest.mark.slow
def test_vapo_train_multi_turn_with_vllm(tmp_path):
    """vapo-train on the multi-turn toolchain task with --rollout_engine vllm (the random model in its
    vLLM shape): the run finishes and logs turns and the sampler's gap."""
    env = {"WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--preset",
        "smoke",
        "--task",
        "toolchain",
        "--task_options",
        json.dumps({"max_n": 3, "eval_per_bucket": 2}),
        "--model",
        "random",
        "--rollout_engine",
        "vllm",
        "--out_dir",
        str(tmp_path / "runs"),
        "--name",
        "r",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in _rows(tmp_path / "runs" / "r" / "metrics.csv") if r["step"] != "0"]
    assert rows and all(0 <= float(r["rollout/sampler_logprob_diff_max"]) < TOL for r in rows)
