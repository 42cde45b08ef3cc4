"""`HFEngine`: KV-cached sampling with any transformers causal LM, with behaviour log-probs.

Llama-family models decode through the static-cache loop (vapo_lit.engines.fast_decode); other
models step transformers' own forward with its cache. Both give the same responses (tested).
"""
from __future__ import annotations

import inspect
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
        return generate(self.model, self.tokenizer, prompts, max_new_tokens=sampling.max_new_tokens,
                        temperature=sampling.temperature, top_p=sampling.top_p, seeds=seeds)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, seeds=0, fast: bool = True) -> Rollout:
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
    was_training = model.training
    model.eval()
    try:
        pf = prefill(model, tokenizer, prompts, seeds, max_new_tokens=max_new_tokens, fast=fast)
        device, ids, prompt_mask, mask, n, row_seeds = pf.device, pf.ids, pf.prompt_mask, pf.mask, pf.n, pf.row_seeds
        pad, past, logits, next_pos, static, cache_kw = pf.pad, pf.past, pf.logits, pf.next_pos, pf.static, pf.cache_kw
        eos = torch.tensor(eos_ids_of(model, tokenizer), device=device)

        tokens = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)
        logps = None  # (n, max_new_tokens), in the sampler's dtype (at least float32), made at the first token
        done = torch.zeros(n, dtype=torch.bool, device=device)
        lengths = torch.zeros(n, dtype=torch.long, device=device)
        active = torch.arange(n, device=device)  # rows whose logits we hold (all rows on the plain path)
        steps = 0
        for step in range(max_new_tokens):
            tok, lp = sample_next(logits, temperature=temperature, top_p=top_p, u=uniforms(row_seeds[active], step))
            if logps is None:
                logps = torch.zeros((n, max_new_tokens), dtype=lp.dtype, device=device)
            live = ~done[active]
            rows = active[live]
            tokens[rows, step] = tok[live]
            logps[rows, step] = lp[live]
            lengths[rows] += 1
            done[rows] |= torch.isin(tok[live], eos)
            steps = step + 1
            if step == max_new_tokens - 1:
                break
            if static is not None:
                finished = done[static.rows]
                ended = int(finished.sum())  # the loop's one host sync per token
                if ended == len(finished):  # every row has ended (the dropped ones before)
                    break
                if 4 * ended >= len(finished):  # compact now and then
                    static.keep(~finished)
                active = static.rows
                logits = static.step(tokens[active, step], next_pos[active])
            else:
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
                out = model(input_ids=tokens[:, step:step + 1], attention_mask=mask, position_ids=next_pos[:, None],
                            use_cache=True, **{cache_kw: past})
                past = _cache_of(out)
                logits = out.logits[:, -1, :]
            next_pos = next_pos + 1

        response_ids, logprobs = tokens[:, :steps], logps[:, :steps]
        terminated = done
        response_mask = (torch.arange(steps, device=device)[None, :] < lengths[:, None]).float()
        cpu_ids, cpu_len = response_ids.cpu(), lengths.cpu()
        texts = tokenizer.batch_decode([cpu_ids[i, : int(cpu_len[i])].tolist() for i in range(n)],
                                       skip_special_tokens=True)
        return Rollout(prompt_ids=ids, prompt_mask=prompt_mask.to(device), response_ids=response_ids,
                       response_mask=response_mask, logprobs=logprobs * response_mask, lengths=lengths,
                       terminated=terminated, truncated=~terminated, texts=list(texts))
    finally:
        model.train(was_training)


@dataclass
class Prefill:
    """The state a token loop starts from: the encoded prompts (left-padded) on the model's
    device, each row's seed, the prefill's cache and next-token logits, each row's next position,
    and the static-cache decoder (Llama family, `fast`) or else the name of the cache argument of
    transformers' forward."""

    device: torch.device
    ids: torch.Tensor
    prompt_mask: torch.Tensor
    mask: torch.Tensor
    n: int
    row_seeds: torch.Tensor
    pad: int
    past: object
    logits: torch.Tensor
    next_pos: torch.Tensor
    static: StaticDecoder | None
    cache_kw: str | None


def prefill(model, tokenizer, prompts: list[str], seeds, *, max_new_tokens: int, fast: bool) -> Prefill:
    """Encode `prompts` and run the model's regular forward over them once (shared by the
    single-turn loop here and the multi-turn one in vapo_lit.engines.episodes)."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    n = prompt_ids.shape[0]
    ids, mask = prompt_ids.to(device), prompt_mask.to(device)
    pos = position_ids_from_mask(mask)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    past = _cache_of(out)
    static = StaticDecoder(model, past, mask, ids.shape[1] + max_new_tokens) if fast and decode_supported(model) else None
    return Prefill(device=device, ids=ids, prompt_mask=prompt_mask, mask=mask, n=n, row_seeds=as_seeds(seeds, n).to(device),
                   pad=pad_id_of(tokenizer), past=past, logits=out.logits[:, -1, :], next_pos=pos[:, -1] + 1,
                   static=static, cache_kw=None if static is not None else _cache_kwarg(model))


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
