"""PPO losses for VAPO (torch only). Shapes: (B, T) per-token tensors with a (B, T) `mask`.

Aggregation ("token" vs "sample", docs/algorithm.md):
  * token:  L = sum(m * x) / N_tok, N_tok = valid tokens in the *whole* mini-batch (DAPO/VAPO Eq. 7)
  * sample: L = sum_i mean_t(x_i) / N_seq (mean within each response, then over responses; Eq. 6)
Pass `denominator` (N_tok or N_seq of the whole mini-batch, summed over gradient-accumulation
micro-batches and data-parallel ranks) so that the sum of micro-batch losses equals the loss of the
whole mini-batch exactly; left as None it is this call's own count.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from vapo_lit.algos.stats import masked_mean, masked_sum

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "aggregation_weights",
    "weight_share",
    "clipped_surrogate",
    "clip_fractions",
    "policy_loss",
    "PolicyLossStats",
    "positive_nll",
    "value_loss",
    "entropy_from_logits",
    "token_logprobs",
    "at_least_float32",
    "truncated_is_weights",
    "SamplerMismatch",
    "sampler_mismatch",
]

AGGREGATIONS = ("token", "sample")


def _check_eps(eps_low: float, eps_high: float) -> None:
    if not (0.0 <= eps_low < 1.0):
        raise ValueError(f"eps_low must be in [0, 1) (paper: 0.2); got {eps_low!r}")
    if not (eps_high >= 0.0):
        raise ValueError(
            f"eps_high must be >= 0 (paper: 0.28 with clip_higher, 0.2 without); got {eps_high!r}"
        )


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str = "token", denominator=None) -> torch.Tensor:
    """Reduce per-token x (B, T) to a scalar: "token" (global token mean) or "sample" (see module)."""
    if mode == "token":
        den = mask.sum() if denominator is None else denominator
        return masked_sum(x, mask) / torch.as_tensor(den, dtype=x.dtype, device=x.device).clamp(min=1)
    if mode == "sample":
        per_seq_tokens = mask.sum(-1)
        per_seq = masked_sum(x, mask, dim=-1) / per_seq_tokens.clamp(min=1).to(x.dtype)
        den = (per_seq_tokens > 0).sum() if denominator is None else denominator
        return per_seq.sum() / torch.as_tensor(den, dtype=x.dtype, device=x.device).clamp(min=1)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}; got {mode!r}")


def aggregation_weights(mask: torch.Tensor, mode: str = "token", denominator=None) -> torch.Tensor:
    """(B, T) each token's weight in `aggregate(x, mask, mode, denominator)`, i.e. its gradient with
    respect to x: 1/N_tok ("token") or 1/(|y_i| N_seq) ("sample"); 0 on masked positions."""
    m = mask.to(torch.float64)
    if mode == "token":
        den = m.sum() if denominator is None else torch.as_tensor(denominator, dtype=torch.float64)
        return m / den.clamp(min=1)
    if mode == "sample":
        per_seq_tokens = m.sum(-1, keepdim=True)
        den = (
            (per_seq_tokens > 0).sum()
            if denominator is None
            else torch.as_tensor(denominator, dtype=torch.float64)
        )
        return m / per_seq_tokens.clamp(min=1) / den.clamp(min=1)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}; got {mode!r}")


def weight_share(
    weights: torch.Tensor, advantages: torch.Tensor, group: torch.Tensor, n_groups: int
) -> torch.Tensor:
    """(n_groups,) float64: the share of sum_t w_t |A_t| (the policy gradient's coefficient on each
    token's log-prob, at ratio 1) carried by each group of rows; `group` (B,) long in [0, n_groups).
    All nan when every coefficient is 0. With token-level weights a long response carries in
    proportion to its tokens; with sample-level ones each response carries alike (DAPO, VAPO Eq. 7)."""
    if weights.shape != advantages.shape:
        raise ValueError(
            f"weights and advantages must have the same shape; got {tuple(weights.shape)} and "
            f"{tuple(advantages.shape)}"
        )
    per_row = (weights.to(torch.float64) * advantages.detach().to(torch.float64).abs()).sum(-1)  # (B,)
    per_group = torch.zeros(n_groups, dtype=torch.float64, device=per_row.device).index_add_(
        0, group.long(), per_row
    )
    return per_group / per_group.sum()


def clipped_surrogate(logprobs, old_logprobs, advantages, eps_low: float = 0.2, eps_high: float = 0.2):
    """Per-token `j = min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)` and the ratio."""
    _check_eps(eps_low, eps_high)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.minimum(ratio * advantages, clipped * advantages), ratio


def clip_fractions(ratio, advantages, mask, eps_low: float, eps_high: float):
    """Fractions of valid tokens whose gradient the clip removes, split by side.

    low:  A < 0 and ratio < 1 - eps_low  (the policy already pushed the token down enough)
    high: A > 0 and ratio > 1 + eps_high (already pushed up enough; Clip-Higher widens this side)
    """
    low = ((advantages < 0) & (ratio < 1.0 - eps_low)).to(ratio.dtype)
    high = ((advantages > 0) & (ratio > 1.0 + eps_high)).to(ratio.dtype)
    return masked_mean(low, mask), masked_mean(high, mask)


class PolicyLossStats(NamedTuple):
    clipfrac_low: torch.Tensor
    clipfrac_high: torch.Tensor
    approx_kl: torch.Tensor
    """k3 estimator E[(r - 1) - log r] of KL(behaviour || current) over valid tokens."""
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor


def policy_loss(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    aggregation: str = "token",
    denominator=None,
    is_weights=None,
):
    """Clipped PPO policy loss -aggregate(w * j) and detached diagnostics. `is_weights` (B, T): a
    per-token importance weight on the surrogate (truncated importance sampling, see
    :func:`truncated_is_weights`; detached); None: 1."""
    checked = [("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)]
    for name, t in checked + ([("is_weights", is_weights)] if is_weights is not None else []):
        if t.shape != logprobs.shape:
            raise ValueError(
                f"{name} must have the shape of logprobs {tuple(logprobs.shape)}; got {tuple(t.shape)}"
            )
    old_logprobs = old_logprobs.detach()
    advantages = advantages.detach()
    j, ratio = clipped_surrogate(logprobs, old_logprobs, advantages, eps_low, eps_high)
    if is_weights is not None:
        j = j * is_weights.detach().to(j.dtype)
    loss = -aggregate(j, mask, aggregation, denominator)
    with torch.no_grad():
        low, high = clip_fractions(ratio, advantages, mask, eps_low, eps_high)
        log_ratio = logprobs.detach() - old_logprobs
        kl = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
        r = ratio.detach()
        ratio_max = torch.where(mask.bool(), r, torch.zeros_like(r)).max()
        stats = PolicyLossStats(low, high, kl, masked_mean(r, mask), ratio_max)
    return loss, stats


def truncated_is_weights(old_logprobs, sampler_logprobs, cap: float):
    """Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training", adopted by verl and OpenRLHF): per token
    min(pi_old(y_t) / pi_sampler(y_t), cap), where pi_old is the trainer's own recomputation of the
    behaviour policy and pi_sampler the probability the sampling engine (its own kernels) drew the
    token with. It corrects the policy gradient for the gap between the two, bounded by `cap` so
    that a token the sampler found far less likely than the trainer cannot dominate. Detached."""
    if not (cap > 0 and math.isfinite(cap)):
        raise ValueError(f"cap must be a finite number > 0 (verl's default: 2); got {cap!r}")
    if old_logprobs.shape != sampler_logprobs.shape:
        raise ValueError(
            f"sampler_logprobs must have the shape of old_logprobs {tuple(old_logprobs.shape)}; "
            f"got {tuple(sampler_logprobs.shape)}"
        )
    log_w = old_logprobs.detach() - sampler_logprobs.detach().to(old_logprobs.dtype)
    return torch.exp(log_w).clamp(max=cap)


class SamplerMismatch(NamedTuple):
    """How far the sampler's log-probs of its sampled tokens are from the trainer's (valid tokens only)."""

    mean_abs: torch.Tensor
    """mean |log pi_trainer - log pi_sampler|."""
    max_abs: torch.Tensor
    """max |log pi_trainer - log pi_sampler| (0 without a valid token)."""
    approx_kl: torch.Tensor
    """k3 estimator E[(r - 1) - log r], r = pi_trainer / pi_sampler, of KL(sampler || trainer)
    (the tokens are the sampler's draws)."""


def sampler_mismatch(trainer_logprobs, sampler_logprobs, mask) -> SamplerMismatch:
    """The sampler-trainer gap on the sampled tokens, in float64 (see :class:`SamplerMismatch`)."""
    if trainer_logprobs.shape != sampler_logprobs.shape or mask.shape != trainer_logprobs.shape:
        raise ValueError(
            f"trainer_logprobs, sampler_logprobs and mask must share one shape; got "
            f"{tuple(trainer_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    d = trainer_logprobs.detach().double() - sampler_logprobs.detach().double()
    m = mask.double()
    valid = m > 0
    abs_d = d.abs()
    max_abs = abs_d[valid].max() if bool(valid.any()) else abs_d.new_zeros(())
    return SamplerMismatch(masked_mean(abs_d, m), max_abs, masked_mean(torch.expm1(d) - d, m))


def positive_nll(logprobs, mask, positive, denominator=None):
    """VAPO's positive-example LM loss (Eq. 9): -sum_{i in T+} sum_t log pi / sum_{i in T+} |y_i|.

    `positive` (B,) bool marks the correct responses. Returns (loss, n_positive_responses,
    n_positive_tokens); the loss is exactly 0 (no division by zero, no gradient) when the set of
    positive tokens is empty. `denominator` = positive tokens in the whole mini-batch.
    """
    positive = torch.as_tensor(positive, device=logprobs.device).bool()
    if positive.shape != logprobs.shape[:1]:
        raise ValueError(
            f"positive must have shape (B,) = ({logprobs.shape[0]},); got {tuple(positive.shape)}"
        )
    pos_mask = mask * positive[:, None].to(mask.dtype)
    n_tokens = pos_mask.sum()
    n_resp = (positive & (mask.sum(-1) > 0)).sum()
    if not bool(n_tokens > 0):
        return logprobs.new_zeros(()), n_resp, n_tokens.long()
    den = n_tokens if denominator is None else torch.as_tensor(denominator, dtype=logprobs.dtype)
    return -masked_sum(logprobs, pos_mask) / den, n_resp, n_tokens.long()


def value_loss(
    values, returns, mask, *, old_values=None, clip_range=None, aggregation="token", denominator=None
):
    """0.5 * (V - R)^2 aggregated; with clip_range, PPO's pessimistic clipped form around old_values."""
    returns = returns.detach()
    err = (values - returns) ** 2
    if clip_range is not None:
        if old_values is None:
            raise ValueError("value_loss with clip_range needs old_values (the values at rollout time)")
        if clip_range <= 0:
            raise ValueError(f"clip_range must be > 0 or None; got {clip_range!r}")
        old_values = old_values.detach()
        v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
        err = torch.maximum(err, (v_clip - returns) ** 2)
    return 0.5 * aggregate(err, mask, aggregation, denominator)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """x in float32 if it is in a lower precision, else unchanged (float64 stays float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum(p * z) (half precision is
    upcast to float32; float32/float64 are kept)."""
    logits = at_least_float32(logits)
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[tokens] without materialising the full log-softmax twice."""
    logits = at_least_float32(logits)
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
