"""`HFEngine`: KV-cached sampling with any transformers causal LM, with behaviour log-probs.

Llama-family models decode through the static-cache loop (vapo_lit.engines.fast_decode); other
models step transformers' own forward with its cache. Both give the same responses (tested).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from vapo_lit.engines.fast_decode import StaticDecoder, decode_supported
from vapo_lit.engines.sampling import sample_next
from vapo_lit.passes import position_ids_from_mask
from vapo_lit.rng import uniforms
from vapo_lit.rollout import Rollout, as_seeds, encode_prompts, eos_ids_of, pad_id_of


class HFEngine:
    """Samples with the actor module itself, so its weights are always the trainer's current ones."""

    name = "hf"

    def __init__(self, actor, tokenizer):
        self.model, self.tokenizer = actor, tokenizer

    def load_weights(self, actor) -> None:
        # The engine shares the actor's parameters: an update is visible at once. A different
        # module means the caller rebuilt the actor (e.g. a strategy wrapped it): follow it.
        self.model = actor

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        return generate(
            self.model,
            self.tokenizer,
            prompts,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seeds=seeds,
        )


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds=0,
    fast: bool = True,
) -> Rollout:
    """Sample one response per prompt with a KV cache, one token at a time.

    Stops as soon as every sequence has emitted EOS, or after `max_new_tokens`. `seeds`: one
    int per prompt (or one int for all, expanded per row): response i's token t is drawn with
    `vapo_lit.rng.uniforms(seeds, t)[i]`, so it depends on its own seed and the model only, not
    on the rest of the batch.

    `fast`: Llama-family models decode with a preallocated KV cache and drop finished rows
    (vapo_lit.engines.fast_decode); other models, or fast=False, step transformers' forward with
    its own cache for every row until the last one ends. Both give the same responses.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    with eval_mode(model):
        loop = prefill(
            model,
            tokenizer,
            prompts,
            seeds,
            max_new_tokens=max_new_tokens,
            fast=fast,
            temperature=temperature,
            top_p=top_p,
        )
        n, device = loop.n, loop.device
        eos = torch.tensor(eos_ids_of(model, tokenizer), device=device)
        tokens = torch.full((n, max_new_tokens), loop.pad, dtype=torch.long, device=device)
        logps = torch.zeros((n, max_new_tokens), dtype=loop.logp_dtype, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        lengths = torch.zeros(n, dtype=torch.long, device=device)
        for step in range(max_new_tokens):
            tok, lp = loop.sample(step)
            live = ~done[loop.active]
            rows = loop.active[live]
            tokens[rows, step] = tok[live]
            logps[rows, step] = lp[live]
            lengths[rows] += 1
            done[rows] |= torch.isin(tok[live], eos)
            if step == max_new_tokens - 1 or not loop.feed(tokens[loop.active, step], done, lazy=True):
                break
        steps = step + 1
        return loop.rollout(tokenizer, tokens[:, :steps], logps[:, :steps], lengths, truncated=~done)


@contextmanager
def eval_mode(model):
    """`model` in eval mode inside, its own mode restored after (sampling must not run dropout)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@dataclass(eq=False)
class TokenLoop:
    """A batched token loop over one KV cache, from the prompts' prefill on: `sample` draws the next
    token of each held row from the logits it holds, `feed` pushes one token per held row through
    the cache and holds the next logits. Llama-family models (`fast`) step the static cache of
    vapo_lit.engines.fast_decode, which drops ended rows (`active`: the rows held, in cache order);
    other models step transformers' forward with its own cache, every row until the last ends.

    Single-turn sampling (`generate`) and multi-turn episodes (vapo_lit.engines.episodes) both
    drive it. The cache, its attention mask and the positions advance in `feed` only: one token per
    held row, or a block of up to K per row in one forward pass (a multi-turn row's action and the
    observation it brought back), after which rows stand at different positions."""

    model: torch.nn.Module
    ids: torch.Tensor
    """(n, P) the encoded prompts, left-padded, on the model's device."""
    prompt_mask: torch.Tensor
    """(n, P) their mask as encoded (on the CPU)."""
    mask: torch.Tensor
    """The attention mask of the plain path's cache (prompt mask, then 1 per fed column), on the device."""
    row_seeds: torch.Tensor
    """(n,) each row's seed (vapo_lit.rng)."""
    past: object
    """The plain path's transformers cache (the prefill's, which the static cache starts from)."""
    logits: torch.Tensor
    """(len(active), V) the next-token logits of the held rows."""
    next_pos: torch.Tensor
    """(n,) each row's position of the next token fed."""
    static: StaticDecoder | None
    """The static-cache decoder, or None: the plain path."""
    pad: int
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self):
        self.active = torch.arange(self.n, device=self.device)
        self.cache_kw = None if self.static is not None else _cache_kwarg(self.model)

    @property
    def n(self) -> int:
        return self.ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def logp_dtype(self) -> torch.dtype:
        """The sampler's dtype (vapo_lit.engines.sampling: at least float32, float64 kept)."""
        return torch.float64 if self.logits.dtype == torch.float64 else torch.float32

    def sample(self, column: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, behaviour log-probs) of the held rows for response column `column` (one for every
        row, or a tensor with each held row's own)."""
        return sample_next(
            self.logits,
            temperature=self.temperature,
            top_p=self.top_p,
            u=uniforms(self.row_seeds[self.active], column),
        )

    def feed(
        self,
        tokens: torch.Tensor,
        done: torch.Tensor,
        *,
        lazy: bool = False,
        counts: torch.Tensor | None = None,
    ) -> bool:
        """Push `tokens` through the cache and hold the next logits: one per held row (in `active`
        order), or with `counts` a block (held, K) of which row i feeds its first counts[i], in one
        forward pass. `done` (n,): rows that have ended, dropped from the static cache (`lazy`: only
        once a quarter of its rows have ended, so that the copy is rare). False, nothing fed, when
        every row is done."""
        if self.static is not None:
            finished = done[self.static.rows]
            ended = int(finished.sum())  # the loop's one host sync per token
            if ended == len(finished):  # every row has ended (the dropped ones before)
                return False
            if ended and (not lazy or 4 * ended >= len(finished)):
                self.static.keep(~finished)
                tokens, counts = tokens[~finished], None if counts is None else counts[~finished]
            self.active = self.static.rows
            pos = self.next_pos[self.active]
            self.logits = (
                self.static.step(tokens, pos) if counts is None else self.static.extend(tokens, counts, pos)
            )
        else:
            if bool(done.all()):
                return False
            self._forward(tokens[:, None] if counts is None else tokens, counts)
        self.next_pos = (
            self.next_pos + 1 if counts is None else self.next_pos.index_add(0, self.active, counts)
        )
        return True

    def _forward(self, block: torch.Tensor, counts: torch.Tensor) -> None:
        """The plain path's feed: every row's block (n, K) through transformers' forward and cache,
        a row's columns past its count masked (as left padding is); counts None: all K of every row."""
        offsets = torch.arange(block.shape[1], device=self.device)
        real = (
            torch.ones_like(block, dtype=self.mask.dtype)
            if counts is None
            else offsets[None] < counts[:, None]
        )
        self.mask = torch.cat([self.mask, real.to(self.mask.dtype)], 1)
        out = self.model(
            input_ids=block,
            attention_mask=self.mask,
            position_ids=self.next_pos[:, None] + offsets[None],
            use_cache=True,
            **{self.cache_kw: self.past},
        )
        self.past = _cache_of(out)
        self.logits = out.logits[:, -1, :] if counts is None else out.logits[torch.arange(self.n), counts - 1]

    def rollout(
        self, tokenizer, response_ids, logprobs, lengths, *, truncated, action=None, turns=None
    ) -> Rollout:
        """The Rollout of responses (n, R) with their `lengths` (the response mask) and unmasked
        behaviour log-probs, kept on action tokens only when an `action` mask is given (multi-turn),
        every tensor moved to the model's device."""
        device, steps = self.device, response_ids.shape[1]
        response_mask = (torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]).float()
        action_mask = None if action is None else action * response_mask
        logprobs = logprobs * (response_mask if action_mask is None else action_mask)
        cpu_ids, cpu_len = response_ids.cpu(), lengths.cpu()
        texts = tokenizer.batch_decode(
            [cpu_ids[i, : int(cpu_len[i])].tolist() for i in range(self.n)], skip_special_tokens=True
        )
        return Rollout(
            prompt_ids=self.ids,
            prompt_mask=self.prompt_mask.to(device),
            response_ids=response_ids.to(device),
            response_mask=response_mask.to(device),
            logprobs=logprobs.to(device=device, dtype=self.logp_dtype),
            lengths=lengths.to(device),
            terminated=(~truncated).to(device),
            truncated=truncated.to(device),
            texts=list(texts),
            action_mask=None if action_mask is None else action_mask.to(device),
            turns=turns,
        )


def prefill(
    model,
    tokenizer,
    prompts: list[str],
    seeds,
    *,
    max_new_tokens: int,
    fast: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> TokenLoop:
    """Encode `prompts`, run the model's regular forward over them once, and return the token loop
    that samples on from there (with room for `max_new_tokens` more in a static cache)."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    ids, mask = prompt_ids.to(device), prompt_mask.to(device)
    pos = position_ids_from_mask(mask)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    past = _cache_of(out)
    static = (
        StaticDecoder(model, past, mask, ids.shape[1] + max_new_tokens)
        if fast and decode_supported(model)
        else None
    )
    return TokenLoop(
        model,
        ids,
        prompt_mask,
        mask,
        row_seeds=as_seeds(seeds, ids.shape[0]).to(device),
        past=past,
        logits=out.logits[:, -1, :],
        next_pos=pos[:, -1] + 1,
        static=static,
        pad=pad_id_of(tokenizer),
        temperature=temperature,
        top_p=top_p,
    )


def _cache_kwarg(model) -> str:
    """Name of the KV-cache argument: `cache` (transformers >= 5.2x) or `past_key_values`."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def _cache_of(out):
    for name in ("cache", "past_key_values"):
        value = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
        if value is not None:
            return value
    raise RuntimeError("the model returned no KV cache (use_cache=True was ignored)")
