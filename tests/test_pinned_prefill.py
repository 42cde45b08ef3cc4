"""One-pass observation prefill pinned where tests/test_obs_prefill.py does not look:

* `obs_chunk` caps the tokens a row feeds in one forward pass, through EpisodeEngine (static
  cache) and generate_episodes on transformers' forward. The episodes come out the same however
  the observations are fed, so equality of episodes cannot see the cap: the per-row widths of
  every pass are recorded here.
* The static decoder near the token budget: a row's short block ending at (or one column before)
  its budget in the same pass as another row's long block, rows dropped as they reach the budget
  (`keep`, as TokenLoop.feed does), the others going on to it; every logit equals a full forward
  over the row's own tokens, with the token step's attention by batched matrix products (the CPU
  path) and by SDPA with the ragged rows' mask (the GPU / bf16 path, forced here on the CPU).

Float64 tiny Llamas, as in tests/test_obs_prefill.py."""

from __future__ import annotations

import pytest
import torch
from test_obs_prefill import WORDS, VariedReplies, random_llama

from vapo_lit.engines import SamplingParams
from vapo_lit.engines.episodes import EpisodeEngine, generate_episodes
from vapo_lit.engines.fast_decode import StaticDecoder
from vapo_lit.rng import sample_seed
from vapo_lit.tasks.chain import build_tokenizer

BUDGET = 120
CHUNK = 6


@pytest.fixture(scope="module")
def env():
    return VariedReplies(budget=BUDGET)


def fed_widths(monkeypatch, model, fast: bool) -> list[list[int]]:
    """Records, for every forward pass after the prompts' prefill, the tokens each row feeds: on
    the static-cache path the counts StaticDecoder.extend is given (a `step` feeds 1 per row); on
    transformers' path the real (unmasked) columns of each row's block passed to model.forward."""
    passes: list[list[int]] = []
    if fast:
        extend, step = StaticDecoder.extend, StaticDecoder.step

        def recording_extend(self, tokens, counts, positions):
            passes.append(counts.tolist())
            return extend(self, tokens, counts, positions)

        def recording_step(self, tokens, positions):
            passes.append([1] * len(tokens))
            return step(self, tokens, positions)

        monkeypatch.setattr(StaticDecoder, "extend", recording_extend)
        monkeypatch.setattr(StaticDecoder, "step", recording_step)
    else:
        forward, calls = model.forward, [0]

        def recording_forward(*args, **kw):
            calls[0] += 1
            if calls[0] > 1:  # the first call is the prompts' prefill
                width = kw["input_ids"].shape[1]
                passes.append(kw["attention_mask"][:, -width:].sum(1).tolist())
            return forward(*args, **kw)

        monkeypatch.setattr(model, "forward", recording_forward)
    return passes


def run_episodes(env, model, *, fast: bool, obs_chunk):
    """The static-cache path through the engine (EpisodeEngine hands obs_chunk on); transformers'
    path through generate_episodes(fast=False)."""
    prompts = [p.prompt for p in env.train_problems(8, 0)]
    seeds = [sample_seed(11, i) for i in range(len(prompts))]
    if fast:
        engine = EpisodeEngine(model, env.tokenizer, env, obs_chunk=obs_chunk)
        return engine.generate(prompts, SamplingParams(max_new_tokens=BUDGET), seeds)
    return generate_episodes(
        model,
        env.tokenizer,
        env,
        prompts,
        max_new_tokens=BUDGET,
        seeds=seeds,
        fast=False,
        obs_chunk=obs_chunk,
    )


@pytest.mark.parametrize("fast", [True, False], ids=["static-cache", "transformers-forward"])
def test_obs_chunk_caps_the_tokens_a_row_feeds_per_pass(env, fast, monkeypatch):
    model = random_llama(env.tokenizer)
    with monkeypatch.context() as mp:  # uncapped: the observations are longer than the chunk
        whole = fed_widths(mp, model, fast)
        free = run_episodes(env, model, fast=fast, obs_chunk=None)
    assert max(max(p) for p in whole) > 2 * CHUNK, (
        "the observations are not longer than the chunk: a weak test"
    )
    capped = fed_widths(monkeypatch, model, fast)
    ro = run_episodes(env, model, fast=fast, obs_chunk=CHUNK)
    widest = max(max(p) for p in capped)
    assert widest <= CHUNK, f"a row fed {widest} tokens in one pass with obs_chunk={CHUNK}"
    assert widest == CHUNK and sum(p.count(CHUNK) for p in capped) >= 5  # the cap binds, again and again
    # the same episodes, in more passes: the observations took several
    assert torch.equal(ro.response_ids, free.response_ids) and torch.equal(ro.lengths, free.lengths)
    assert len(capped) > len(whole)


# ----------------------------------------------------------------------------- near the budget
LENGTHS = [5, 2, 4, 3]  # left-padded prompts
B = 12  # each row's token budget: capacity = P + B
PLAN = [  # (rows held, tokens each feeds); columns fed per row after each pass in the comment
    ([0, 1, 2, 3], [1, 1, 1, 1]),  # 1 1 1 1
    ([0, 1, 2, 3], [8, 1, 3, 5]),  # 9 2 4 6
    ([0, 1, 2, 3], [1, 1, 1, 1]),  # 10 3 5 7   (rows at different columns: a ragged step)
    ([0, 1, 2, 3], [2, 8, 1, 4]),  # 12 11 6 11: row 0's short block ends AT the budget beside row 1's 8
    ([1, 2, 3], [1, 3, 1]),  # row 0 dropped; -- 12 9 12: rows 1 and 3 reach it beside row 2's 3
    ([2], [1]),  # rows 1 and 3 dropped (the longest rows: the cache's live prefix
    ([2], [1]),  # shrinks to row 2's); row 2 steps on alone to the budget
    ([2], [1]),
]
PLAN_BEFORE = [  # short blocks ending one column BEFORE the budget beside long ones, then steps to it
    ([0, 1, 2, 3], [1, 1, 1, 1]),  # 1 1 1 1
    ([0, 1, 2, 3], [7, 1, 3, 5]),  # 8 2 4 6
    ([0, 1, 2, 3], [1, 1, 1, 1]),  # 9 3 5 7    (a ragged step)
    ([0, 1, 2, 3], [2, 6, 1, 1]),  # 11 9 6 8: row 0's 2 end one short of the budget beside row 1's 6
    ([0, 1, 2, 3], [1, 2, 5, 1]),  # 12 11 11 9: row 0 to the budget; row 1's 2 end one short beside row 2's 5
    ([1, 2, 3], [1, 1, 1]),  # row 0 dropped; 12 12 10 (a ragged step to the budget)
    ([3], [2]),  # rows 1, 2 dropped; row 3's last block reaches it
]


@pytest.mark.parametrize("attention", ["bmm", "sdpa"])
@pytest.mark.parametrize("plan", [PLAN, PLAN_BEFORE], ids=["block-at-budget", "block-before-budget"])
def test_blocks_near_the_budget_equal_a_full_forward(plan, attention):
    """`attention`: the token step's attention as on the CPU in float32/64 (two batched matrix
    products) or as everywhere else (SDPA with the ragged rows' mask: on a GPU, or in bf16; forced
    here on the CPU in float64, where no other test reaches it)."""
    tok = build_tokenizer(WORDS)
    model = random_llama(tok)
    g = torch.Generator().manual_seed(5)
    n, P = len(LENGTHS), max(LENGTHS)
    ids = torch.full((n, P), tok.pad_token_id)
    mask = torch.zeros((n, P), dtype=torch.long)
    for r, k in enumerate(LENGTHS):
        ids[r, P - k :] = torch.randint(6, len(tok), (k,), generator=g)
        mask[r, P - k :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    assert all(sum(c[held.index(r)] for held, c in plan if r in held) == B for r in range(n))  # all reach B
    dec = StaticDecoder(model, out.past_key_values, mask, capacity=P + B)
    assert dec.by_bmm
    dec.by_bmm = attention == "bmm"
    rows = [ids[r, P - k :].tolist() for r, k in enumerate(LENGTHS)]
    next_pos = torch.tensor(LENGTHS)
    for p, (held, counts) in enumerate(plan):
        if dec.rows.tolist() != held:  # drop the rows that reached the budget, as TokenLoop.feed does
            dec.keep(torch.tensor([r in held for r in dec.rows.tolist()]))
        assert dec.rows.tolist() == held
        c = torch.tensor(counts)
        block = torch.randint(6, len(tok), (len(held), max(counts)), generator=g)
        logits = (
            dec.step(block[:, 0], next_pos[held])
            if max(counts) == 1
            else dec.extend(block, c, next_pos[held])
        )
        for i, r in enumerate(held):
            rows[r] += block[i, : counts[i]].tolist()
            next_pos[r] += counts[i]
            with torch.no_grad():
                want = model(input_ids=torch.tensor([rows[r]])).logits[0, -1]
            torch.testing.assert_close(
                logits[i], want, rtol=0, atol=1e-10, msg=lambda m, p=p, r=r: f"pass {p}, row {r}: {m}"
            )
    assert [len(x) - k for x, k in zip(rows, LENGTHS)] == [B] * n
