"""Observations prefilled in one forward pass per turn: the hf episode loop that feeds a row's action
and the whole observation it brought back as one block gives the same episodes (tokens, action
masks, behaviour log-probs) as feeding the observation one token per step, on the static-cache path
and on transformers' forward, and the static decoder's block step equals a full forward."""

from __future__ import annotations

import pytest
import torch

from vapo_lit.engines.episodes import generate_episodes
from vapo_lit.engines.fast_decode import StaticDecoder
from vapo_lit.rng import sample_seed
from vapo_lit.tasks.base import Problem, Verdict
from vapo_lit.tasks.chain import build_tokenizer
from vapo_lit.tasks.env import EnvStep, Environment

WORDS = (
    ["<pad>", "<bos>", "<eos>", "<unk>", "task", "?"]
    + [f"w{i}" for i in range(20)]
    + [str(d) for d in range(10)]
)


class VariedReplies(Environment):
    """Answers every turn (ending at "?" or EOS) with a reply whose length (3-40 tokens) depends on
    the turn, so the rows of a batch receive observations of different lengths at different steps;
    six turns end an episode (unless the token budget does first)."""

    name, version, max_turns = "varied-replies", "1", 100
    stop_sequences = ("?",)
    tools = {}

    def __init__(self, budget: int):
        self.max_new_tokens = budget
        self._tok = build_tokenizer(WORDS)

    @property
    def tokenizer(self):
        return self._tok

    def respond(self, problem, transcript, turn, *, turns_done, final):
        if turns_done >= 6:  # an EOS ends a turn too, not the episode
            return EnvStep(reward=0.0, done=True)
        k = 3 + (len(turn.split()) * 7 + turns_done * 5) % 38
        return EnvStep(observation=" ".join(str((turns_done + i) % 10) for i in range(k)))

    def problem_from_prompt(self, prompt):
        return Problem(prompt, "0", {})

    def train_problems(self, n, seed):
        return [
            Problem(" ".join(["task"] + [f"w{(seed + i + j) % 20}" for j in range(1 + i % 4)]), "0", {})
            for i in range(n)
        ]

    def eval_problems(self):
        return self.train_problems(4, 0)

    def verify(self, problem, response):
        return Verdict(0.0)


def random_llama(tok, dtype=torch.float64, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = (
        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(tok),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=1024,
                bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        )
        .to(dtype)
        .eval()
    )
    with torch.no_grad():  # flat next-token distributions: turns of a few to a few dozen tokens
        model.lm_head.weight.mul_(0.05)
    return model


@pytest.fixture(scope="module")
def env():
    return VariedReplies(budget=300)


def episodes(env, model, *, fast, obs_chunk):
    prompts = [p.prompt for p in env.train_problems(8, 0)]  # different prompt lengths: left padding
    seeds = [sample_seed(7, i) for i in range(len(prompts))]
    return generate_episodes(
        model,
        env.tokenizer,
        env,
        prompts,
        max_new_tokens=env.max_new_tokens,
        seeds=seeds,
        fast=fast,
        obs_chunk=obs_chunk,
    )


@pytest.mark.parametrize("fast", [True, False], ids=["static-cache", "transformers-forward"])
def test_one_pass_observations_equal_the_one_token_loop(env, fast):
    model = random_llama(env.tokenizer)
    one_token = episodes(env, model, fast=fast, obs_chunk=1)
    assert int(one_token.turns.min()) >= 3, "the batch must hold several observations per row"
    assert len(set(one_token.lengths.tolist())) > 1
    for chunk in (None, 9):
        ro = episodes(env, model, fast=fast, obs_chunk=chunk)
        assert torch.equal(ro.lengths, one_token.lengths) and torch.equal(ro.turns, one_token.turns)
        assert torch.equal(ro.response_ids, one_token.response_ids)
        assert torch.equal(ro.action_mask, one_token.action_mask)
        assert torch.equal(ro.truncated, one_token.truncated)
        torch.testing.assert_close(ro.logprobs, one_token.logprobs, rtol=0, atol=1e-10)
        assert ro.texts == one_token.texts


def test_behaviour_logprobs_of_one_pass_episodes_equal_a_full_forward(env):
    """The trainer's view: each episode's action tokens scored by one forward over prompt + response
    give the sampler's log-probs (no row sees another's columns, nor a block's unused ones)."""
    model = random_llama(env.tokenizer)
    ro = episodes(env, model, fast=True, obs_chunk=None)
    for i in range(ro.response_ids.shape[0]):
        prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
        resp = ro.response_ids[i, : int(ro.lengths[i])]
        ids = torch.cat([prompt, resp])[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1], -1)
        want = logp.gather(1, resp[:, None])[:, 0] * ro.action_mask[i, : len(resp)]
        torch.testing.assert_close(ro.logprobs[i, : len(resp)], want, rtol=0, atol=1e-10)


def test_static_decoder_blocks_equal_a_full_forward():
    """Blocks of different counts per row, then single steps with the rows at different columns, up
    to the longest row's budget: every logit equals one forward over each row's own tokens."""
    tok = build_tokenizer(WORDS)
    model = random_llama(tok)
    g = torch.Generator().manual_seed(3)
    lengths = [5, 2, 4]  # left-padded prompts
    P = max(lengths)
    ids = torch.full((3, P), tok.pad_token_id)
    mask = torch.zeros((3, P), dtype=torch.long)
    for r, n in enumerate(lengths):
        ids[r, P - n :] = torch.randint(6, len(tok), (n,), generator=g)
        mask[r, P - n :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    plan = [[1, 1, 1], [4, 1, 2], [1, 1, 1], [1, 7, 3], [2, 2, 2], [1, 1, 1]]
    budget = max(sum(c[r] for c in plan) for r in range(3))  # 13 tokens for the longest row
    dec = StaticDecoder(model, out.past_key_values, mask, capacity=P + budget)
    rows = [ids[r, P - n :].tolist() for r, n in enumerate(lengths)]
    next_pos = torch.tensor(lengths)
    for counts in plan:
        block = torch.randint(6, len(tok), (3, max(counts)), generator=g)
        c = torch.tensor(counts)
        logits = dec.step(block[:, 0], next_pos) if max(counts) == 1 else dec.extend(block, c, next_pos)
        next_pos = next_pos + c
        for r in range(3):
            rows[r] += block[r, : counts[r]].tolist()
            with torch.no_grad():
                want = model(input_ids=torch.tensor([rows[r]])).logits[0, -1]
            torch.testing.assert_close(logits[r], want, rtol=0, atol=1e-10)
    assert dec.length == P + budget  # the longest row filled the cache exactly
