"""KV-cached sampling of responses from any HF causal LM, with behaviour log-probs.

Conventions (the PPO code relies on them):

* prompts are LEFT-padded, responses RIGHT-padded, both with the pad id (the tokenizer's pad
  token, else its EOS);
* positions are counted over real tokens only: ``position_ids = cumsum(attention_mask) - 1``
  (see :func:`position_ids_from_mask`), so a left-padded prompt gets the same positions as an
  unpadded one. Any later forward pass over (prompt, response) must use the same positions to
  reproduce the log-probs recorded here; :func:`sequence_logprobs` does that.
* ``Rollout.logprobs`` = ``log_softmax(logits / temperature)`` of the sampled token, recorded at
  sampling time, BEFORE top-p truncation (the truncation is treated as part of the sampler, not
  of the policy; with top_p = 1 the two coincide). With ``temperature == 0`` the sampler is greedy
  and logprobs are those of ``log_softmax(logits)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vapo_lit.algos.losses import at_least_float32
from vapo_lit.rng import sample_seed, uniforms


@dataclass
class Rollout:
    """One response per prompt; every tensor on the sampling model's device."""

    prompt_ids: torch.LongTensor
    """(N, P) LEFT-padded with the pad id."""
    prompt_mask: torch.Tensor
    """(N, P) 1 on real prompt tokens, 0 on padding (long)."""
    response_ids: torch.LongTensor
    """(N, R) RIGHT-padded with the pad id; includes the EOS token when emitted."""
    response_mask: torch.Tensor
    """(N, R) float 1.0 on response tokens (EOS included), 0.0 on padding."""
    logprobs: torch.Tensor
    """(N, R) behaviour log-prob of each sampled token (temperature-scaled, pre top-p), 0 on padding."""
    lengths: torch.LongTensor
    """(N,) response tokens including EOS."""
    terminated: torch.BoolTensor
    """(N,) ended with EOS."""
    truncated: torch.BoolTensor
    """(N,) hit max_new_tokens without EOS (exactly one of terminated/truncated is True)."""
    texts: list[str]
    """Decoded responses, special tokens stripped."""

    @property
    def input_ids(self) -> torch.LongTensor:
        """(N, P + R) prompt and response concatenated."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(N, P + R) long mask of real tokens."""
        return torch.cat([self.prompt_mask.long(), self.response_mask.long()], dim=1)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One Rollout from chunks: prompts re-padded on the left, responses on the right."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.prompt_ids.shape[1] for p in parts)
    R = max(p.response_ids.shape[1] for p in parts)

    def left(t, width, value):
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

    def right(t, width, value):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return Rollout(
        prompt_ids=torch.cat([left(p.prompt_ids, P, pad_id) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, P, 0) for p in parts]),
        response_ids=torch.cat([right(p.response_ids, R, pad_id) for p in parts]),
        response_mask=torch.cat([right(p.response_mask, R, 0.0) for p in parts]),
        logprobs=torch.cat([right(p.logprobs, R, 0.0) for p in parts]),
        lengths=torch.cat([p.lengths for p in parts]),
        terminated=torch.cat([p.terminated for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        texts=[t for p in parts for t in p.texts],
    )


def pad_id_of(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    raise ValueError("tokenizer has neither a pad nor an eos token")


def eos_ids_of(model, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's plus the model's generation_config ones (may be a list)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("no EOS token id: set tokenizer.eos_token_id")
    return sorted(ids)


def _cache_kwarg(model) -> str:
    """Name of the KV-cache argument: `cache` (transformers >= 5.2x) or `past_key_values`."""
    import inspect

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


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.LongTensor:
    """Positions over real tokens only (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Tokenise (with the tokenizer's own special tokens) and LEFT-pad."""
    if not prompts:
        raise ValueError("no prompts")
    bos = getattr(tokenizer, "bos_token", None)
    # A chat template usually writes the BOS token itself: do not add a second one.
    enc = [tokenizer(p, add_special_tokens=not (bos and p.startswith(bos)))["input_ids"] for p in prompts]
    if any(len(e) == 0 for e in enc):
        raise ValueError("a prompt encodes to zero tokens")
    width = max(len(e) for e in enc)
    pad = pad_id_of(tokenizer)
    ids = torch.full((len(enc), width), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, width - len(e):] = torch.tensor(e, dtype=torch.long)
        mask[i, width - len(e):] = 1
    return ids, mask


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Renormalised nucleus of `probs` (..., V): the smallest set of most likely tokens whose
    mass reaches `top_p` (the most likely token is always kept)."""
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    out = probs * keep
    return out / out.sum(-1, keepdim=True)


def sample_next(logits: torch.Tensor, *, temperature: float, top_p: float,
                u: torch.Tensor | None) -> tuple[torch.LongTensor, torch.Tensor]:
    """One token per row of `logits` (N, V) by inverse-CDF sampling with the uniforms `u` (N,)
    (see vapo_lit.rng); returns (tokens, behaviour log-probs). Greedy when temperature is 0.
    Computed in at least float32 (a float64 model samples and records in float64, so its samples and
    log-probs carry no float32 rounding, whose last bits differ between CPU instruction sets)."""
    logits = at_least_float32(logits)
    if temperature <= 0:
        logp = torch.log_softmax(logits, -1)
        tok = logits.argmax(-1)
    else:
        logp = torch.log_softmax(logits / temperature, -1)
        probs = top_p_filter(logp.exp(), top_p)
        cdf = probs.double().cumsum(-1)
        target = (u.to(cdf.device, torch.float64) * cdf[:, -1]).unsqueeze(-1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def as_seeds(seeds, n: int) -> torch.LongTensor:
    """(n,) int64 seeds, one per response; an int is expanded to `sample_seed(seed, i)`."""
    if isinstance(seeds, int):
        seeds = [sample_seed(seeds, i) for i in range(n)]
    t = torch.as_tensor(seeds, dtype=torch.int64)
    if t.shape != (n,):
        raise ValueError(f"need one seed per prompt: {n} prompts, seeds of shape {tuple(t.shape)}")
    return t


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
    from vapo_lit.engines.fast_decode import StaticDecoder, decode_supported

    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
        n = prompt_ids.shape[0]
        row_seeds = as_seeds(seeds, n).to(device)
        pad = pad_id_of(tokenizer)
        eos = torch.tensor(eos_ids_of(model, tokenizer), device=device)

        ids = prompt_ids.to(device)
        mask = prompt_mask.to(device)
        pos = position_ids_from_mask(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        past = _cache_of(out)
        logits = out.logits[:, -1, :]  # of the rows in `active`
        next_pos = pos[:, -1] + 1  # (n,)
        static = StaticDecoder(model, past, mask, ids.shape[1] + max_new_tokens) \
            if fast and decode_supported(model) else None
        cache_kw = None if static is not None else _cache_kwarg(model)

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
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            if static is not None:
                finished = done[static.rows]
                if bool(finished.any()) and float(finished.float().mean()) >= 0.25:  # compact now and then
                    static.keep(~finished)
                active = static.rows
                logits = static.step(tokens[active, step], next_pos[active])
            else:
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


def next_token_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      temperature: float = 1.0) -> torch.Tensor:
    """(N, L-1, V) logits / T (at least float32) predicting token t+1 from tokens <= t, with the same positions
    as :func:`generate` (``cumsum(mask) - 1``). Gradients flow (no no_grad). The PPO update reads
    its log-probs and entropy from these, so the ratio compares like with like."""
    pos = position_ids_from_mask(attention_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
    logits = at_least_float32(logits[:, :-1])
    return logits / temperature if temperature > 0 else logits


def sequence_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      temperature: float = 1.0) -> torch.Tensor:
    """(N, L-1) log-prob of token t+1 given tokens <= t under ``log_softmax(logits / T)``.

    For a :class:`Rollout` ``ro``: ``sequence_logprobs(model, ro.input_ids, ro.attention_mask)[:,
    P - 1:]`` lines up with ``ro.logprobs`` (P = prompt width).
    """
    logp = torch.log_softmax(next_token_logits(model, input_ids, attention_mask, temperature=temperature), -1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
