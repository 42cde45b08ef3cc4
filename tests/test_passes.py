"""The update's forward passes without an attention mask (vapo_lit.passes.left_aligned): rows
moved left by their prompt padding and run causally give the values, log-probs, entropies and
gradients of the masked passes they replace (float64, Llama, Qwen2 and Mistral shapes, left-padded
prompts of several lengths, ragged responses), and SDPA is never handed a mask."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_rollout import PROMPTS, tiny_model

from vapo_lit import passes
from vapo_lit.models.value import ValueModel
from vapo_lit.rollout import encode_prompts, pad_id_of
from vapo_lit.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("chain")


def sampled(model, tok):
    """[prompt | response] rows as the update sees them: left-padded prompts of 4 lengths, random
    response tokens of random lengths (one row full-length), right-padded."""
    prompt_ids, prompt_mask = encode_prompts(tok, PROMPTS * 3)
    g = torch.Generator().manual_seed(5)
    n, R = len(prompt_ids), 14
    lengths = torch.randint(1, R + 1, (n,), generator=g)
    lengths[0] = R
    mask = (torch.arange(R)[None, :] < lengths[:, None]).long()
    response = torch.where(mask.bool(), torch.randint(3, len(tok), (n, R), generator=g), pad_id_of(tok))
    assert not bool(prompt_mask.all()) and lengths.min() < lengths.max()  # both paddings are there
    return SimpleNamespace(
        prompt_ids=prompt_ids,
        response_ids=response,
        response_mask=mask,
        lengths=lengths,
        input_ids=torch.cat([prompt_ids, response], 1),
        attention_mask=torch.cat([prompt_mask.long(), mask], 1),
    )


def masked_logprobs(model, ro, temperature):
    """The masked reference: the whole padded row, positions cumsum(mask) - 1, columns P - 1 .. P + R - 2."""
    P = ro.prompt_ids.shape[1]
    logits = (
        model(
            input_ids=ro.input_ids,
            attention_mask=ro.attention_mask,
            position_ids=passes.position_ids_from_mask(ro.attention_mask),
        ).logits[:, P - 1 : -1]
        / temperature
    )
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ro.response_ids[..., None]).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_mask_free_logprobs_and_gradients_equal_the_masked_pass(task, kind, chunk):
    tok = task.tokenizer
    model = tiny_model(kind, len(tok), tok).double()
    ro = sampled(model, tok)
    m, P = ro.response_mask.double(), ro.prompt_ids.shape[1]
    got, ent = passes.response_logprobs(
        model, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=0.7, entropy=True, chunk=chunk
    )
    grads = torch.autograd.grad((got * m).sum(), list(model.parameters()))
    want, want_ent = masked_logprobs(model, ro, 0.7)
    want_grads = torch.autograd.grad((want * m).sum(), list(model.parameters()))
    torch.testing.assert_close(got * m, want * m, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent * m, want_ent.detach() * m, rtol=0, atol=1e-12)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_mask_free_values_and_gradients_equal_the_masked_pass(task, kind):
    tok = task.tokenizer
    policy = tiny_model(kind, len(tok), tok).double()
    ro = sampled(policy, tok)
    critic = ValueModel.from_causal_lm(policy).double()
    P, R = ro.prompt_ids.shape[1], ro.response_ids.shape[1]
    states = (
        torch.arange(R + 1)[None, :] <= ro.lengths[:, None]
    ).double()  # V(s_0) .. V(s_l): the states a row has
    got = passes.state_values(critic, ro.input_ids, ro.attention_mask, P)
    grads = torch.autograd.grad((got * states).sum(), list(critic.parameters()))
    want = critic(ro.input_ids, ro.attention_mask)[:, P - 1 :]
    want_grads = torch.autograd.grad((want * states).sum(), list(critic.parameters()))
    assert got.shape == (len(ro.lengths), R + 1)
    torch.testing.assert_close(got * states, want * states, rtol=0, atol=1e-12)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_sdpa_gets_no_mask_and_runs_causally(task, monkeypatch):
    """The point of the layout: transformers hands SDPA no (n, 1, L, L) mask, so its fused causal
    kernel applies (with the masked pass it gets one: the check can fail)."""
    import torch.nn.functional as F

    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok)
    ro = sampled(model, tok)
    P = ro.prompt_ids.shape[1]
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append((k.get("attn_mask"), k.get("is_causal")))
        return real(*a, **k)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        passes.response_logprobs(model, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=1.0)
        passes.state_values(ValueModel.from_causal_lm(model), ro.input_ids, ro.attention_mask, P)
    assert calls and all(mask is None and causal for mask, causal in calls), calls[:2]
    calls.clear()
    with torch.no_grad():
        masked_logprobs(model, ro, 1.0)
    assert calls and all(mask is not None for mask, _ in calls)


def test_left_aligned_moves_each_row_by_its_prompt_padding():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [0, 4, 5, 6, 7, 0, 0], [3, 4, 5, 6, 7, 8, 9]])
    mask = (ids != 0).long()
    out, pos, states = passes.left_aligned(ids, mask, prompt_width=4)
    assert out[:, :5].tolist() == [[5, 6, 7, 8, 0], [4, 5, 6, 7, 0], [3, 4, 5, 6, 7]]
    assert torch.equal(pos, torch.arange(7).expand(3, 7))
    # state columns P - 1 .. P + R - 1 = 3 .. 6 of each row as given, in the moved row
    assert states.tolist() == [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]
    for i in range(3):
        for j, c in enumerate(range(3, 7)):
            assert int(out[i, states[i, j]]) == int(ids[i, c]) or int(ids[i, c]) == 0
