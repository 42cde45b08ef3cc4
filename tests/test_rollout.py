"""KV-cached sampling: behaviour log-probs, padding/positions, reproducibility, top-p."""

import pytest
import torch

from vapo_lit.engines.hf import generate
from vapo_lit.engines.sampling import sample_next, top_p_filter
from vapo_lit.passes import sequence_logprobs
from vapo_lit.rollout import Rollout, encode_prompts
from vapo_lit.rng import sample_seed, uniforms
from vapo_lit.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


def tiny_model(kind: str, vocab_size: int, tok):
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        return LlamaForCausalLM(cfg).eval()
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=vocab_size,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=128,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        return GPT2LMHeadModel(cfg).eval()
    if kind == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        return Qwen2ForCausalLM(cfg).eval()
    if kind == "mistral":
        from transformers import MistralConfig, MistralForCausalLM

        cfg = MistralConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            sliding_window=None,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        return MistralForCausalLM(cfg).eval()
    raise ValueError(kind)


PROMPTS = ["chain 1 from 7:", "chain 3 from 12: 12: 6 11: 0", "7:", "chain 9 from 4: => 5 5 5 5 5 5"]


class EosBiased(torch.nn.Module):
    """Wraps a causal LM and adds `bias` to the EOS logit (to exercise early stopping)."""

    def __init__(self, inner, eos_id, bias):
        super().__init__()
        self.inner, self.eos_id, self.bias = inner, eos_id, bias

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits[..., self.eos_id] += self.bias
        return out


def check_invariants(ro: Rollout, n: int, max_new: int, tok):
    assert ro.prompt_ids.shape[0] == n and ro.response_ids.shape[0] == n
    assert ro.response_ids.shape[1] <= max_new
    assert torch.equal(ro.terminated ^ ro.truncated, torch.ones(n, dtype=torch.bool))
    assert torch.equal(ro.response_mask.sum(1).long(), ro.lengths)
    assert ro.response_mask.dtype == torch.float32
    for i in range(n):
        L = int(ro.lengths[i])
        assert torch.all(ro.response_ids[i, L:] == tok.pad_token_id)
        assert torch.all(ro.logprobs[i, L:] == 0)
        assert torch.all(ro.logprobs[i, :L] <= 0)
        if ro.terminated[i]:
            assert int(ro.response_ids[i, L - 1]) == tok.eos_token_id
            assert tok.eos_token_id not in ro.response_ids[i, : L - 1].tolist()
        else:
            assert L == max_new and tok.eos_token_id not in ro.response_ids[i, :L].tolist()
        assert ro.texts[i] == tok.decode(ro.response_ids[i, :L].tolist(), skip_special_tokens=True)
    # left padding of the prompts
    assert torch.all(ro.prompt_mask[:, -1] == 1)
    assert torch.all(ro.prompt_ids[ro.prompt_mask == 0] == tok.pad_token_id)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_logprobs_match_full_forward(task, kind, temperature, top_p):
    tok = task.tokenizer
    model = tiny_model(kind, len(tok), tok)
    ro = generate(model, tok, PROMPTS, max_new_tokens=20, temperature=temperature, top_p=top_p, seeds=1)
    check_invariants(ro, len(PROMPTS), 20, tok)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        full = sequence_logprobs(model, ro.input_ids, ro.attention_mask, temperature=temperature)[:, P - 1 :]
    m = ro.response_mask
    assert torch.allclose(full * m, ro.logprobs, atol=1e-4)
    # and each row alone, without any padding, gives the same log-probs (positions are right)
    for i in range(len(PROMPTS)):
        keep = ro.attention_mask[i].bool()
        ids = ro.input_ids[i][keep][None]
        p_i = int(ro.prompt_mask[i].sum())
        with torch.no_grad():
            alone = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)[0, p_i - 1 :]
        L = int(ro.lengths[i])
        assert torch.allclose(alone[:L], ro.logprobs[i, :L], atol=1e-4)


def test_reproducible_with_seeded_generator(task):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok)
    a = generate(model, tok, PROMPTS * 4, max_new_tokens=16, seeds=7)
    b = generate(model, tok, PROMPTS * 4, max_new_tokens=16, seeds=7)
    c = generate(model, tok, PROMPTS * 4, max_new_tokens=16, seeds=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)


def test_stops_when_all_ended_and_truncation(task):
    tok = task.tokenizer
    base = tiny_model("llama", len(tok), tok)
    eager = EosBiased(base, tok.eos_token_id, 50.0)
    ro = generate(eager, tok, PROMPTS, max_new_tokens=30, seeds=0)
    assert ro.response_ids.shape[1] == 1 and bool(ro.terminated.all())
    assert ro.texts == [""] * len(PROMPTS) and torch.equal(
        ro.lengths, torch.ones(len(PROMPTS), dtype=torch.long)
    )
    never = EosBiased(base, tok.eos_token_id, -1e4)
    ro = generate(never, tok, PROMPTS, max_new_tokens=9, seeds=0)
    assert ro.response_ids.shape[1] == 9 and bool(ro.truncated.all())
    check_invariants(ro, len(PROMPTS), 9, tok)
    # mixed: some end early, the batch still runs to the longest
    mixed = EosBiased(base, tok.eos_token_id, 2.5)
    ro = generate(mixed, tok, PROMPTS * 8, max_new_tokens=40, seeds=3)
    check_invariants(ro, len(PROMPTS) * 8, 40, tok)
    assert ro.lengths.min() < ro.lengths.max()
    assert ro.response_ids.shape[1] == int(ro.lengths.max())


def test_greedy(task):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok)
    a = generate(model, tok, PROMPTS, max_new_tokens=8, temperature=0.0)
    b = generate(model, tok, PROMPTS, max_new_tokens=8, temperature=0.0, seeds=5)
    assert torch.equal(a.response_ids, b.response_ids)


def test_top_p_filter_hand_made():
    p = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    assert torch.allclose(top_p_filter(p, 0.7), torch.tensor([[0.0, 0.625, 0.0, 0.375]]))
    assert torch.allclose(top_p_filter(p, 0.5), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert torch.allclose(top_p_filter(p, 0.81), torch.tensor([[0.0, 0.5, 0.15, 0.3]]) / 0.95)
    assert torch.allclose(top_p_filter(p, 1.0), p)
    assert torch.allclose(top_p_filter(p, 1e-6), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    # the paper's setting: a 0.6 / 0.4 split survives top-p 0.7, a 0.75 / 0.25 one does not
    assert torch.allclose(top_p_filter(torch.tensor([0.6, 0.4]), 0.7), torch.tensor([0.6, 0.4]))
    assert torch.allclose(top_p_filter(torch.tensor([0.75, 0.25]), 0.7), torch.tensor([1.0, 0.0]))


def test_sample_next_top_p_and_logprobs():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log().expand(20000, 4).clone()
    u = uniforms(torch.arange(20000, dtype=torch.int64), 0)
    tok, lp = sample_next(logits, temperature=1.0, top_p=0.7, u=u)
    counts = torch.bincount(tok, minlength=4).float() / len(tok)
    assert counts[0] == 0 and counts[2] == 0
    assert abs(counts[1] - 0.625) < 0.02 and abs(counts[3] - 0.375) < 0.02
    # behaviour log-probs are recorded before the truncation
    assert torch.allclose(lp, probs.log()[tok], atol=1e-6)
    tok, lp = sample_next(logits[:5], temperature=2.0, top_p=1.0, u=u[:5])
    assert torch.allclose(lp, torch.log_softmax(probs.log() / 2.0, -1)[tok], atol=1e-6)


def test_encode_prompts_left_pads(task):
    tok = task.tokenizer
    ids, mask = encode_prompts(tok, ["7:", "chain 1 from 7:"])
    assert ids.shape == (2, 5) and mask[0].tolist() == [0, 0, 0, 1, 1]
    assert ids[0, :3].tolist() == [tok.pad_token_id] * 3 and ids[0, 3] == tok.bos_token_id


def test_bad_arguments(task):
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok)
    with pytest.raises(ValueError):
        generate(model, tok, PROMPTS, max_new_tokens=0)
    with pytest.raises(ValueError):
        generate(model, tok, PROMPTS, max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError):
        generate(model, tok, [], max_new_tokens=4)


def test_a_response_does_not_depend_on_its_batch(task):
    """Response i is a function of (model, prompt i, seed i) alone: the same (prompt, seed) pairs
    in another order, another batch size or split in chunks give the same tokens and log-probs."""
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()
    prompts = PROMPTS * 3
    seeds = [sample_seed(5, i) for i in range(len(prompts))]
    whole = generate(model, tok, prompts, max_new_tokens=12, seeds=seeds)
    order = [7, 2, 11, 0, 5, 9, 1, 4, 10, 3, 8, 6]
    shuffled = generate(
        model, tok, [prompts[i] for i in order], max_new_tokens=12, seeds=[seeds[i] for i in order]
    )
    for j, i in enumerate(order):
        L = int(whole.lengths[i])
        assert int(shuffled.lengths[j]) == L and whole.texts[i] == shuffled.texts[j]
        torch.testing.assert_close(whole.logprobs[i, :L], shuffled.logprobs[j, :L])
    for i in (0, 6, 11):  # alone
        one = generate(model, tok, [prompts[i]], max_new_tokens=12, seeds=[seeds[i]])
        assert one.texts[0] == whole.texts[i]


def test_counter_based_uniforms():
    seeds = torch.tensor([sample_seed(3, i) for i in range(100_000)])
    u = uniforms(seeds, 7)
    assert u.dtype == torch.float64 and float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    assert torch.equal(u, uniforms(seeds, 7)) and not torch.equal(u, uniforms(seeds, 8))
    assert torch.equal(uniforms(seeds[5:9], 7), u[5:9])  # a row's draw ignores the other rows
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / len(u)
    assert float((hist - 0.1).abs().max()) < 0.005
    # successive draws of one stream are uncorrelated
    v = uniforms(seeds, 8)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.01


def test_uniforms_per_row_steps_equal_each_rows_own_draw():
    """A tensor of steps (one per row, as the episode loop's ragged columns use) gives each row the
    draw of its own step, including steps large enough that step * golden ratio wraps int64."""
    seeds = torch.tensor([sample_seed(11, i) for i in range(64)])
    steps = torch.randint(0, 5000, (64,), generator=torch.Generator().manual_seed(0))
    steps[:4] = torch.tensor([0, 1, 2**40 + 3, 2**62 - 1])
    want = torch.cat([uniforms(seeds[i : i + 1], int(steps[i])) for i in range(64)])
    assert torch.equal(uniforms(seeds, steps), want)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("eos_bias", [0.0, 2.5])
def test_fast_decode_equals_transformers_forward(task, kind, eos_bias):
    """The static-cache loop (finished rows dropped) samples the same responses with the same
    behaviour log-probs as stepping transformers' own forward for every row."""
    from vapo_lit.engines.fast_decode import decode_supported

    tok = task.tokenizer
    model = tiny_model(kind, len(tok), tok).double()
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += eos_bias * model.lm_head.weight.std()  # some rows end early
    assert decode_supported(model)
    prompts = PROMPTS * 6
    seeds = [sample_seed(9, i) for i in range(len(prompts))]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.8)):
        fast = generate(
            model, tok, prompts, max_new_tokens=24, temperature=temperature, top_p=top_p, seeds=seeds
        )
        plain = generate(
            model,
            tok,
            prompts,
            max_new_tokens=24,
            temperature=temperature,
            top_p=top_p,
            seeds=seeds,
            fast=False,
        )
        assert fast.texts == plain.texts and torch.equal(fast.response_ids, plain.response_ids)
        assert torch.equal(fast.lengths, plain.lengths) and torch.equal(fast.truncated, plain.truncated)
        torch.testing.assert_close(fast.logprobs, plain.logprobs, rtol=0, atol=1e-6)
    if eos_bias:
        assert fast.lengths.min() < fast.lengths.max()  # rows were dropped on the way


class _ShiftedLinear(torch.nn.Linear):
    """A projection that is not a plain nn.Linear (an adapter stands in): its forward adds 0.5."""

    def forward(self, x):
        return super().forward(x) + 0.5


def test_fast_decode_calls_modules_it_cannot_fuse(task):
    """q/k/v and gate/up are fused into one matrix product only where the projections are plain
    nn.Linears: a subclassed projection (adapter, quantised layer) is called as the module, so the
    loop still samples what transformers' forward samples (a fused loop that read `.weight` would
    drop the +0.5 and differ)."""
    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok).double()
    for name in ("q_proj", "v_proj"):
        old = getattr(model.model.layers[0].self_attn, name)
        new = _ShiftedLinear(old.in_features, old.out_features, bias=False).double()
        new.weight = old.weight
        setattr(model.model.layers[0].self_attn, name, new)
    up = model.model.layers[1].mlp.up_proj
    shifted = _ShiftedLinear(up.in_features, up.out_features, bias=False).double()
    shifted.weight = up.weight
    model.model.layers[1].mlp.up_proj = shifted
    prompts, seeds = PROMPTS * 3, [sample_seed(4, i) for i in range(len(PROMPTS) * 3)]
    fast = generate(model, tok, prompts, max_new_tokens=16, seeds=seeds)
    plain = generate(model, tok, prompts, max_new_tokens=16, seeds=seeds, fast=False)
    assert torch.equal(fast.response_ids, plain.response_ids)
    torch.testing.assert_close(fast.logprobs, plain.logprobs, rtol=0, atol=1e-6)


def test_fast_decode_fuses_only_under_the_memory_cap(task, monkeypatch):
    """The concatenated q/k/v and gate/up copy is made only while it fits FUSE_MAX_BYTES; above
    the cap the loop calls the modules and samples the same responses."""
    import vapo_lit.engines.fast_decode as fd

    tok = task.tokenizer
    model = tiny_model("qwen2", len(tok), tok).double()  # q/k/v with biases
    calls = []
    real = fd._concat
    monkeypatch.setattr(fd, "_concat", lambda linears: calls.append(len(linears)) or real(linears))
    prompts, seeds = PROMPTS * 2, [sample_seed(5, i) for i in range(len(PROMPTS) * 2)]
    fused = generate(model, tok, prompts, max_new_tokens=12, seeds=seeds)
    assert calls == [3, 2] * len(model.model.layers)
    assert 0 < fd._fused_bytes(model.model.layers) <= fd.FUSE_MAX_BYTES
    calls.clear()
    monkeypatch.setattr(fd, "FUSE_MAX_BYTES", fd._fused_bytes(model.model.layers) - 1)
    unfused = generate(model, tok, prompts, max_new_tokens=12, seeds=seeds)
    assert calls == []
    assert torch.equal(fused.response_ids, unfused.response_ids)
    torch.testing.assert_close(fused.logprobs, unfused.logprobs, rtol=0, atol=1e-9)


def test_fast_decode_not_used_where_unsupported(task):
    from vapo_lit.engines.fast_decode import decode_supported

    tok = task.tokenizer
    assert not decode_supported(tiny_model("gpt2", len(tok), tok))
    assert not decode_supported(EosBiased(tiny_model("llama", len(tok), tok), tok.eos_token_id, 1.0))


def test_fast_decode_cache_in_the_compute_dtype_and_gqa_without_copies(task, monkeypatch):
    """Under bf16 autocast the K/V cache is bf16 (the dtype SDPA computes in; the float32 rotary
    tables would make it float32), grouped K/V are never copied per query head (SDPA's
    enable_gqa), and the loop still samples what transformers' forward samples under autocast."""
    from vapo_lit.engines.fast_decode import StaticDecoder

    tok = task.tokenizer
    model = tiny_model("llama", len(tok), tok)
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 2  # grouped-query
    made, copies = [], []
    real_init, real_repeat = StaticDecoder.__init__, torch.Tensor.repeat_interleave
    monkeypatch.setattr(StaticDecoder, "__init__", lambda self, *a: made.append(self) or real_init(self, *a))
    prompts, seeds = PROMPTS * 3, [sample_seed(6, i) for i in range(len(PROMPTS) * 3)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = generate(model, tok, prompts, max_new_tokens=16, seeds=seeds, fast=False)
        monkeypatch.setattr(
            torch.Tensor,
            "repeat_interleave",
            lambda t, *a, **k: copies.append(t.shape) or real_repeat(t, *a, **k),
        )
        fast = generate(model, tok, prompts, max_new_tokens=16, seeds=seeds)
    monkeypatch.undo()
    assert [t.dtype for t in made[0].k + made[0].v] == [torch.bfloat16] * 4
    assert copies == []
    assert torch.equal(fast.response_ids, plain.response_ids)
    torch.testing.assert_close(fast.logprobs, plain.logprobs, rtol=0, atol=1e-6)
    with torch.no_grad():  # without autocast: the weights' own dtype
        fp32 = StaticDecoder(
            model,
            model(input_ids=torch.ones((2, 3), dtype=torch.long), use_cache=True).past_key_values,
            torch.ones((2, 3)),
            8,
        )
    assert fp32.k[0].dtype == torch.float32


def test_fast_decode_keep_compacts_in_place(task):
    """keep() moves the kept rows to the front of each layer's own storage (no second cache), and
    the cache then holds exactly the kept rows' keys and values."""
    from vapo_lit.engines.fast_decode import StaticDecoder

    tok = task.tokenizer
    model = tiny_model("qwen2", len(tok), tok).double()
    n, P = 6, 4
    ids = torch.randint(3, len(tok), (n, P))
    with torch.no_grad():
        dec = StaticDecoder(
            model, model(input_ids=ids, use_cache=True).past_key_values, torch.ones((n, P)), 10
        )
        for t in range(2):
            dec.step(torch.randint(3, len(tok), (n,)), torch.full((n,), P + t))
    keep = torch.tensor([True, False, False, True, True, False])
    before = [(t.data_ptr(), t[keep].clone()) for t in dec.k + dec.v]
    dec.keep(keep)
    assert torch.equal(dec.rows, torch.tensor([0, 3, 4]))
    for t, (ptr, want) in zip(dec.k + dec.v, before):
        assert t.data_ptr() == ptr and torch.equal(t, want)
    with torch.no_grad():  # and decoding goes on from the compacted cache
        assert dec.step(torch.randint(3, len(tok), (3,)), torch.full((3,), P + 2)).shape == (3, len(tok))
