"""The draw of one token per row: vapo-lit's sampler, shared by every engine.

Inverse-CDF sampling with per-sample counter-based uniforms (vapo_lit.rng), so a response depends on
its own seed only; the behaviour log-prob is log softmax(logits / T) of the drawn token, before the
top-p cut (see vapo_lit.rollout for the conventions).
"""

from __future__ import annotations

import torch

from vapo_lit.algos.losses import at_least_float32


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


def sample_next(
    logits: torch.Tensor, *, temperature: float, top_p: float, u: torch.Tensor | None
) -> tuple[torch.LongTensor, torch.Tensor]:
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
