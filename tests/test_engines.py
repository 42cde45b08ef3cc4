"""The rollout-engine contract: every backend in vapo_lit.engines.ENGINES must pass these.

Left-padded prompts and right-padded responses, EOS vs truncation flags, behaviour log-probs equal
to a recomputation by the training actor (vapo_lit.passes, the update's own code path), seeded
reproducibility, and weight updates visible after load_weights."""
import pytest
import torch
from test_rollout import PROMPTS, EosBiased, check_invariants, tiny_model

from vapo_lit import passes
from vapo_lit.engines import ENGINES, RolloutEngine, SamplingParams, make_engine
from vapo_lit.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


@pytest.fixture(params=sorted(ENGINES))
def backend(request):
    return request.param


def make(backend, model, tok) -> RolloutEngine:
    engine = make_engine(backend, model, tok)
    assert isinstance(engine, RolloutEngine)
    return engine


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.7)])
def test_behaviour_logprobs_equal_the_training_recomputation(task, backend, temperature, top_p):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()
    engine = make(backend, model, tok)
    ro = engine.generate(PROMPTS * 3, SamplingParams(max_new_tokens=14, temperature=temperature, top_p=top_p), 4)
    check_invariants(ro, len(PROMPTS) * 3, 14, tok)
    P = ro.prompt_ids.shape[1]
    logp, _ = passes.response_logprobs(model, ro.input_ids, ro.attention_mask, P, ro.response_ids,
                                       temperature=temperature)
    m = ro.response_mask.bool()
    # behaviour log-probs are kept in float32 (sampling precision), the recomputation is float64
    torch.testing.assert_close(ro.logprobs[m].double(), logp[m], rtol=0, atol=1e-5)


def test_eos_and_truncation_flags(task, backend):
    tok = task.tokenizer
    base = tiny_model("llama", len(tok), tok)
    eager = make(backend, EosBiased(base, tok.eos_token_id, 8.0).eval(), tok)
    ro = eager.generate(PROMPTS * 2, SamplingParams(max_new_tokens=30), 0)
    check_invariants(ro, 8, 30, tok)
    assert bool(ro.terminated.all())
    never = make(backend, EosBiased(base, tok.eos_token_id, -50.0).eval(), tok)
    ro = never.generate(PROMPTS, SamplingParams(max_new_tokens=9), 0)
    check_invariants(ro, 4, 9, tok)
    assert bool(ro.truncated.all()) and ro.response_ids.shape[1] == 9


def test_seeded_reproducibility(task, backend):
    tok = task.tokenizer
    engine = make(backend, tiny_model("llama", len(tok), tok), tok)
    s = SamplingParams(max_new_tokens=16)
    a = engine.generate(PROMPTS * 4, s, 7)
    b = engine.generate(PROMPTS * 4, s, 7)
    c = engine.generate(PROMPTS * 4, s, 8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)


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
