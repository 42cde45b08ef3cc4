"""The rollout-engine contract: every backend in vapo_lit.engines.ENGINES must pass these.

Left-padded prompts and right-padded responses, EOS vs truncation flags (several EOS ids too), behaviour log-probs equal
to a recomputation by the training actor (vapo_lit.passes, the update's own code path), seeded
reproducibility, a response independent of its batch, the caller's RNG and train mode left alone,
and weight updates visible after load_weights. Backend-specific checks follow the contract.
Every equality here compares two computations in this process (same kernels, so it holds on any CPU;
it passes under ATEN_CPU_CAPABILITY=default, avx2 and avx512); the one against a recorded
history, the cb golden, shares tests/golden.py's float64 runs and tolerance."""

import collections
import dataclasses

import pytest
import torch
from test_rollout import PROMPTS, check_invariants, tiny_model

from vapo_lit import passes
from vapo_lit.config import RunConfig
from vapo_lit.engines import ENGINES, RolloutEngine, SamplingParams, make_engine
from vapo_lit.engines.continuous import (
    ContinuousBatchingEngine,
    _import_cb,
    bits_to_uniform,
    unavailable,
    uniform_bits,
)
from vapo_lit.rng import sample_seed, uniforms
from vapo_lit.tasks import get_task


def _has_cb() -> bool:
    return unavailable() is None


# The "cb" engine is optional: it needs transformers' continuous batching and says so when it is
# missing (make test-lower runs the suite with transformers 4.56, which has none) or cannot run (a
# transformers that cannot measure this machine's memory); the Makefile's .venv has it, so `make test`
# runs every cb test, and `make test-mid` runs them on transformers 5.17 (the same classes, a config
# field under its older name).
NEEDS_CB = pytest.mark.skipif(not _has_cb(), reason=str(unavailable()))


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


# "vllm" samples with its own kernels, in float32 (vLLM has no float64) and only on models whose head
# size its backend runs: tests/test_vllm.py holds its contract tests, on such a model, with its tolerances.
@pytest.fixture(
    params=[pytest.param(b, marks=NEEDS_CB) if b == "cb" else b for b in sorted(ENGINES) if b != "vllm"]
)
def backend(request):
    return request.param


def make(backend, model, tok) -> RolloutEngine:
    engine = make_engine(backend, model, tok)
    assert isinstance(engine, RolloutEngine)
    return engine


def eos_biased(base, eos_id: int, bias: float):
    """A copy of `base` (a transformers causal LM) whose EOS logit is shifted by `bias`, still a
    transformers model, so that every backend can run it (the continuous-batching one needs a
    PreTrainedModel; test_rollout.py covers HFEngine on a plain wrapping module)."""

    class EosBiasedLM(type(base)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits[..., eos_id] += bias
            return out

    model = EosBiasedLM(base.config)
    model.load_state_dict(base.state_dict())
    return model.to(base.dtype).eval()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.7)])
def test_behaviour_logprobs_equal_the_training_recomputation(task, backend, temperature, top_p):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()
    engine = make(backend, model, tok)
    ro = engine.generate(
        PROMPTS * 3, SamplingParams(max_new_tokens=14, temperature=temperature, top_p=top_p), 4
    )
    check_invariants(ro, len(PROMPTS) * 3, 14, tok)
    P = ro.prompt_ids.shape[1]
    logp, _ = passes.response_logprobs(
        model, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=temperature
    )
    m = ro.response_mask.bool()
    # behaviour log-probs are kept in float32 (sampling precision), the recomputation is float64
    torch.testing.assert_close(ro.logprobs[m].double(), logp[m], rtol=0, atol=1e-5)


def test_eos_and_truncation_flags(task, backend):
    tok = task.tokenizer
    base = tiny_model("llama", len(tok), tok)
    eager = make(backend, eos_biased(base, tok.eos_token_id, 8.0), tok)
    ro = eager.generate(PROMPTS * 2, SamplingParams(max_new_tokens=30), 0)
    check_invariants(ro, 8, 30, tok)
    assert bool(ro.terminated.all())
    never = make(backend, eos_biased(base, tok.eos_token_id, -50.0), tok)
    ro = never.generate(PROMPTS, SamplingParams(max_new_tokens=9), 0)
    check_invariants(ro, 4, 9, tok)
    assert bool(ro.truncated.all()) and ro.response_ids.shape[1] == 9


def test_every_eos_id_of_the_generation_config_ends_a_response(task, backend):
    """Qwen and Llama-3 instruct models list several EOS ids in their generation config (e.g.
    <|im_end|> and <|endoftext|>): a response ends at the first token that is ANY of them and counts
    as terminated, not truncated. The stop ids here are the tokens the model samples most often
    inside its responses, so the same seeds must give the one-EOS responses cut after their first."""
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()
    prompts, s = PROMPTS * 3, SamplingParams(max_new_tokens=16)
    seeds = [sample_seed(3, i) for i in range(len(prompts))]
    free = make(backend, model, tok).generate(prompts, s, seeds)  # the tokenizer's one EOS
    stop = set_extra_eos_ids(model, tok, free)
    ro = make(backend, model, tok).generate(prompts, s, seeds)
    assert (
        cut_at_stop_ids(ro, free, stop, tok.pad_token_id, atol=1e-9) >= 4
    )  # the extra ids did end responses early


def set_extra_eos_ids(model, tok, free) -> set:
    """The two tokens `free`'s responses sample most often inside them, added to the model's EOS ids;
    returns every stop id."""
    inner = [
        t
        for i in range(free.response_ids.shape[0])
        for t in free.response_ids[i, : int(free.lengths[i]) - 1].tolist()
    ]
    extra = [t for t, _ in collections.Counter(inner).most_common(2)]
    model.generation_config.eos_token_id = [tok.eos_token_id, *extra]
    return {tok.eos_token_id, *extra}


def cut_at_stop_ids(ro, free, stop: set, pad_id: int, atol: float) -> int:
    """Each response of `ro` is its `free` twin (the same seed, one EOS id) cut after its first id in
    `stop`, terminated exactly when that id ended it, padded after it, with the same log-probs (to
    `atol`); returns how many were cut short."""
    cut_short = 0
    for i in range(free.response_ids.shape[0]):
        full = free.response_ids[i, : int(free.lengths[i])].tolist()
        end = next((k + 1 for k, t in enumerate(full) if t in stop), len(full))
        L = int(ro.lengths[i])
        assert ro.response_ids[i, :L].tolist() == full[:end], i
        ended = full[end - 1] in stop
        assert bool(ro.terminated[i]) == ended and bool(ro.truncated[i]) == (not ended), i
        assert torch.all(ro.response_ids[i, L:] == pad_id) and ro.response_mask[i].sum() == L
        torch.testing.assert_close(ro.logprobs[i, :L], free.logprobs[i, :L], rtol=0, atol=atol)
        cut_short += end < len(full)
    return cut_short


def test_seeded_reproducibility(task, backend):
    tok = task.tokenizer
    check_seeded_reproducibility(make(backend, tiny_model("llama", len(tok), tok), tok))


def check_seeded_reproducibility(engine) -> None:
    """The same seed gives the same tokens and log-probs; another seed other tokens."""
    s = SamplingParams(max_new_tokens=16)
    a = engine.generate(PROMPTS * 4, s, 7)
    b = engine.generate(PROMPTS * 4, s, 7)
    c = engine.generate(PROMPTS * 4, s, 8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_a_response_does_not_depend_on_its_batch(task, backend):
    """Response i is a function of (weights, prompt i, seed i) alone: the same (prompt, seed) pairs
    in another order, or alone, give the same tokens and log-probs."""
    tok = task.tokenizer
    engine = make(backend, tiny_model("llama", len(tok), tok).double(), tok)
    prompts = PROMPTS * 3
    seeds = [sample_seed(5, i) for i in range(len(prompts))]
    s = SamplingParams(max_new_tokens=12)
    whole = engine.generate(prompts, s, seeds)
    order = [7, 2, 11, 0, 5, 9, 1, 4, 10, 3, 8, 6]
    shuffled = engine.generate([prompts[i] for i in order], s, [seeds[i] for i in order])
    for j, i in enumerate(order):
        L = int(whole.lengths[i])
        assert int(shuffled.lengths[j]) == L and whole.texts[i] == shuffled.texts[j]
        torch.testing.assert_close(whole.logprobs[i, :L], shuffled.logprobs[j, :L])
    for i in (0, 6, 11):
        one = engine.generate([prompts[i]], s, [seeds[i]])
        assert one.texts[0] == whole.texts[i]


def test_callers_rng_and_train_mode_are_left_alone(task, backend):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).train()
    engine = make(backend, model, tok)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=5), 0)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training and all(m.training for m in model.modules())


def test_weight_updates_visible_after_load_weights(task, backend):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok)
    engine = make(backend, model, tok)
    s = SamplingParams(max_new_tokens=6)
    before = engine.generate(PROMPTS, s, 0)
    with torch.no_grad():  # an "update" that makes every next-token distribution uniform
        model.lm_head.weight.zero_()
    engine.load_weights(model)
    after = engine.generate(PROMPTS, s, 0)
    m = after.response_mask.bool()
    uniform = -torch.log(torch.tensor(float(model.config.vocab_size)))
    assert not torch.allclose(before.logprobs[before.response_mask.bool()], uniform)
    torch.testing.assert_close(after.logprobs[m], uniform.expand(int(m.sum())))


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError, match="valid: hf"):
        make_engine("nope", None, None)


def test_config_engine_names_are_the_registry():
    """The registry is keyed by config.ROLLOUT_ENGINES, the one list of names that validate checks
    (the config does not import the engines to validate a name)."""
    from vapo_lit.config import ROLLOUT_ENGINES, merge, validate

    assert tuple(ENGINES) == ROLLOUT_ENGINES
    assert {f.name: f for f in dataclasses.fields(RunConfig)}["rollout_engine"].default in ENGINES
    for name in ENGINES:
        validate(merge(RunConfig(), {"rollout_engine": name}))
    with pytest.raises(
        ValueError, match=r"^rollout_engine='sglang' is not valid; choose one of: hf, cb, vllm$"
    ):
        validate(merge(RunConfig(), {"rollout_engine": "sglang"}))


# ---- the continuous-batching backend ("cb") -------------------------------------------------


@NEEDS_CB
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.7), (0.0, 1.0)])
def test_cb_draws_the_hf_engines_responses(task, temperature, top_p):
    """ "cb" draws token t of response i with the same counter-based uniform (rounded down to 32
    bits) and inverse CDF as "hf": on a float64 model the two engines give the same responses."""
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()
    s = SamplingParams(max_new_tokens=20, temperature=temperature, top_p=top_p)
    seeds = [sample_seed(11, i) for i in range(16)]
    a = make_engine("cb", model, tok).generate(PROMPTS * 4, s, seeds)
    b = make_engine("hf", model, tok).generate(PROMPTS * 4, s, seeds)
    assert a.texts == b.texts and torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.terminated, b.terminated) and torch.equal(a.prompt_ids, b.prompt_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-6)


@NEEDS_CB
def test_cb_pre_empted_requests_keep_their_streams(task):
    """With a KV cache too small for all requests at once, transformers pre-empts some and re-runs
    them with their tokens so far moved into the prompt: the sampler must still count their steps
    from the true prompt, so the responses are those of an unconstrained cache."""
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()

    class SmallCache(ContinuousBatchingEngine):
        page_size = 4

        def cache_pages(self, inputs, max_new_tokens):
            return (
                3 * (max(len(x) for x in inputs) + max_new_tokens) // self.page_size
            )  # room for ~3 requests

    s = SamplingParams(max_new_tokens=24)
    small = SmallCache(model, tok).generate(PROMPTS * 4, s, 2)
    full = make_engine("cb", model, tok).generate(PROMPTS * 4, s, 2)
    assert small.texts == full.texts
    torch.testing.assert_close(small.logprobs, full.logprobs)


def _tensor_fields(ro):
    return {
        f.name: getattr(ro, f.name)
        for f in dataclasses.fields(ro)
        if isinstance(getattr(ro, f.name), torch.Tensor)
    }


@NEEDS_CB
def test_cb_returns_its_rollout_with_the_hf_engines_devices_and_dtypes(task):
    """Every Rollout field of "cb" has the device and dtype of "hf"'s (the Rollout convention: on the
    sampling model's device), for a float32 and a float64 model."""
    tok = task.tokenizer
    for dtype in (torch.float32, torch.float64):
        model = tiny_model("llama", len(tok), tok).to(dtype)
        s = SamplingParams(max_new_tokens=6)
        a, b = (
            _tensor_fields(make_engine(name, model, tok).generate(PROMPTS, s, 1)) for name in ("cb", "hf")
        )
        assert a.keys() == b.keys()
        assert {k: (v.device, v.dtype) for k, v in a.items()} == {
            k: (v.device, v.dtype) for k, v in b.items()
        }


@NEEDS_CB
def test_cb_places_its_rollout_on_the_models_device(task, monkeypatch):
    """The cb engine's Rollout follows the model's device (here "meta", which a CPU can hold; on a
    GPU run it is cuda): prompt ids, masks, log-probs, lengths and flags alike, dtypes kept."""
    from vapo_lit.rollout import encode_prompts

    tok = task.tokenizer
    engine = ContinuousBatchingEngine(tiny_model("llama", len(tok), tok), tok)
    engine.model = torch.nn.Linear(1, 1, device="meta")  # where the rollout must land
    monkeypatch.setattr(
        engine, "_behaviour_logprobs", lambda ids, mask, resp, rmask, t: torch.zeros(resp.shape)
    )
    prompt_ids, prompt_mask = encode_prompts(tok, PROMPTS[:2])
    eos = tok.eos_token_id
    ro = engine._rollout(prompt_ids, prompt_mask, [[5, eos], [6]], [eos], SamplingParams(max_new_tokens=2))
    fields = _tensor_fields(ro)
    assert len(fields) == 8 and {v.device.type for v in fields.values()} == {"meta"}, {
        k: v.device for k, v in fields.items()
    }
    from vapo_lit.engines.continuous import on_device

    cpu = encode_prompts(tok, PROMPTS[:2])
    moved = on_device(
        ro.__class__(
            *cpu,
            torch.zeros(2, 1, dtype=torch.long),
            torch.ones(2, 1),
            torch.zeros(2, 1),
            torch.ones(2, dtype=torch.long),
            torch.ones(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool),
            ["a", "b"],
        ),
        torch.device("meta"),
    )
    assert (
        moved.texts == ["a", "b"]
        and moved.prompt_ids.dtype == torch.long
        and moved.terminated.dtype == torch.bool
    )
    assert {v.device.type for v in _tensor_fields(moved).values()} == {"meta"}


def test_cb_uniform_bits_round_down_the_stream():
    seeds = torch.tensor([sample_seed(1, i) for i in range(5000)])
    steps = torch.arange(5000) % 7
    got = bits_to_uniform(uniform_bits(seeds, steps))
    want = torch.cat([uniforms(seeds[i : i + 1], int(steps[i])) for i in range(0, 5000, 97)])
    got_rows = got[::97]
    assert bool((got_rows <= want).all()) and bool((want - got_rows < 2.0**-32).all())
    assert float(got.min()) >= 0 and float(got.max()) < 1 and got.dtype == torch.float64


def test_cb_config_page_size_is_found_by_its_field_name():
    """The tokens per KV-cache page go to whichever field the installed ContinuousBatchingConfig
    has: `block_size` (transformers 5.17), `page_size` (later, where block_size is a deprecated alias)."""
    from vapo_lit.engines.continuous import page_size_kwarg

    @dataclasses.dataclass
    class Older:
        block_size: int = 256
        num_blocks: int | None = None

    @dataclasses.dataclass
    class Newer:
        page_size: int = 256
        num_blocks: int | None = None
        block_size: int | None = None

    assert page_size_kwarg(Older, 32) == {"block_size": 32}
    assert page_size_kwarg(Newer, 32) == {"page_size": 32}
    Older(**page_size_kwarg(Older, 32))
    Newer(**page_size_kwarg(Newer, 32))


@NEEDS_CB
def test_cb_refuses_a_continuous_batching_config_without_the_fields_it_sets(monkeypatch):
    """A transformers whose ContinuousBatchingConfig lacks a field the engine sets: one line naming
    the version and the missing fields, before any model is touched."""
    import transformers.generation.configuration_utils as cu

    @dataclasses.dataclass
    class Bare:
        num_blocks: int | None = None
        seed: int | None = None

    monkeypatch.setattr(cu, "ContinuousBatchingConfig", Bare)
    with pytest.raises(
        ImportError,
        match=r"rollout engine 'cb' needs ContinuousBatchingConfig fields that "
        r"transformers \S+ lacks: page_size or block_size, max_batch_tokens, "
        r"max_requests_per_batch, use_async_batching, allow_block_sharing "
        r"\(use rollout_engine=hf\)",
    ):
        _import_cb()


@NEEDS_CB
def test_cb_refuses_a_machine_whose_memory_transformers_reads_as_zero(task, monkeypatch):
    """Where transformers' memory probe reports 0 (a CPU-only machine without psutil, under
    transformers 5.17), its continuous batching would refuse every request from a background
    thread: the engine says so in one line when it is made, before any sampling."""
    import importlib

    from vapo_lit.engines import continuous

    if torch.cuda.is_available():
        pytest.skip("transformers measures a CUDA machine's memory directly")
    for name in ("utils", "requests"):
        mod = importlib.import_module(f"transformers.generation.continuous_batching.{name}")
        monkeypatch.setattr(
            mod, "get_device_and_memory_breakdown", lambda: (torch.device("cpu"), 0, 0, 0), raising=False
        )
    continuous.memory_unmeasured.cache_clear()
    try:
        with pytest.raises(
            RuntimeError,
            match=r"^rollout engine 'cb': transformers \S+ reads this machine's cpu "
            r"memory as 0 \(it needs psutil for that\), so its continuous batching "
            r"would refuse every request; pip install psutil, or use "
            r"rollout_engine=hf$",
        ):
            make_engine("cb", tiny_model("llama", len(task.tokenizer), task.tokenizer), task.tokenizer)
    finally:
        continuous.memory_unmeasured.cache_clear()


@NEEDS_CB
def test_cb_needs_a_transformers_model(task):
    tok = task.tokenizer
    wrapped = torch.nn.Sequential(tiny_model("llama", len(tok), tok))
    with pytest.raises(TypeError, match="PreTrainedModel"):
        make_engine("cb", wrapped, tok).generate(PROMPTS, SamplingParams(max_new_tokens=4), 0)


@pytest.mark.slow
@NEEDS_CB
def test_cb_training_reproduces_the_golden_history(tmp_path, monkeypatch):
    """The full recipe trained with rollout_engine='cb' gives the metric history recorded with the
    default engine (tests/golden.py, float64 model): the same responses, so every rollout/,
    objective/ and eval/ column exactly; the rest within the golden tolerance (both engines keep the
    float64 model's log-probs in float64; they differ only in float64 summation order, KV-cached
    steps vs one forward pass)."""
    import golden

    monkeypatch.setitem(golden.CONFIG, "rollout_engine", "cb")
    want = golden.recorded("vapo")
    got = golden.comparable(golden.run(tmp_path, "vapo"))
    assert not golden.differences(got, want), golden.differences(got, want)[:5]
    for g, w in zip(got, want):
        for key in w:
            if key.startswith(("rollout/", "objective/", "eval/")):
                assert g[key] == w[key], (w["step"], key, g[key], w[key])


def test_vllm_auto_kv_cache_is_split_among_the_processes_of_a_machine(monkeypatch):
    """vllm_kv_cache_gib=None: room for the call's responses, capped at a quarter of the free memory,
    that quarter split among the processes sharing it; never below one full-length sequence."""
    from vapo_lit.engines import vllm as V

    monkeypatch.setattr(V, "available_memory_gib", lambda device_type: 16.0)
    per_token, max_len = 4096, 512
    assert 2000 * 1000 * per_token > 4 * 2**30  # more than a quarter of 16 GiB
    assert V.auto_kv_bytes(per_token, 2000, 1000, max_len, "cpu") == 4 * 2**30
    assert V.auto_kv_bytes(per_token, 2000, 1000, max_len, "cpu", share=2) == 2 * 2**30
    assert V.auto_kv_bytes(per_token, 500, 1000, max_len, "cpu", share=2) == 500 * 1000 * per_token
    assert V.auto_kv_bytes(per_token, 1, 10, max_len, "cpu", share=2) == max(
        V.one_sequence_bytes(max_len, per_token), V.MIN_KV_BYTES
    )
