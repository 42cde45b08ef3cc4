"""Masked statistics and critic diagnostics (torch only).

Every function takes a `mask` of the same shape as the data (1 = counted, 0 = ignored).
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "explained_variance",
    "valid_positions",
    "bucketize",
    "bucketed_mean",
    "value_bias",
    "mean_by",
    "length_key",
    "advantage_error",
]


def _check_same_shape(x: torch.Tensor, mask: torch.Tensor, name: str = "x") -> None:
    if x.shape != mask.shape:
        raise ValueError(
            f"{name} and mask must have the same shape; got {tuple(x.shape)} and {tuple(mask.shape)}"
        )


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    _check_same_shape(x, mask)
    # where() rather than x * mask: masked positions may hold inf/nan (e.g. -inf log-probs of padding).
    z = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return z.sum() if dim is None else z.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean over mask==1 entries; nan when there are none (an empty mean is undefined, not 0)."""
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all mask==1 entries (Bessel-corrected by default)."""
    mean = masked_mean(x, mask)
    n = mask.sum().to(x.dtype)
    ss = masked_sum((x - mean) ** 2, mask)
    if unbiased:
        return ss / (n - 1) if n > 1 else torch.full_like(mean, float("nan"))
    return ss / n


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x - mean) / std over mask==1 entries; masked entries are returned as 0."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=False)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask.bool(), out, torch.zeros((), dtype=x.dtype, device=x.device))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over valid tokens (docs/algorithm.md). nan when there are no tokens or Var(R)
    is zero, counting a variance at rounding level of the values' scale as zero (returns computed
    as V + A carry rounding noise where every outcome is 0; dividing by it gives nonsense).

    1 = perfect value prediction, 0 = no better than a constant, < 0 = worse than a constant.
    """
    _check_same_shape(values, returns, "values/returns")
    var_r = masked_var(returns, mask, unbiased=False)
    var_err = masked_var(returns - values, mask, unbiased=False)
    m = mask.bool()
    scale = torch.cat([returns[m].abs(), values[m].abs(), returns.new_zeros(1)]).max()
    noise = 16 * torch.finfo(returns.dtype).eps * scale
    if not bool(var_r > noise * noise):
        return torch.full_like(var_r, float("nan"))
    return 1 - var_err / var_r


def valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: index of each valid token among its row's valid tokens (0-based); -1 elsewhere."""
    m = mask.bool()
    return torch.where(m, m.long().cumsum(-1) - 1, torch.full_like(m, -1, dtype=torch.long))


def bucketize(x: torch.Tensor, edges) -> torch.Tensor:
    """Bucket index of each x for ascending `edges` [e1, e2, ...]: x < e1 -> 0, e1 <= x < e2 -> 1, ..."""
    edges = torch.as_tensor(edges, dtype=x.dtype if x.is_floating_point() else torch.long, device=x.device)
    if edges.numel() > 1 and not bool((edges[1:] > edges[:-1]).all()):
        raise ValueError(f"bucket edges must be strictly increasing; got {edges.tolist()}")
    return torch.bucketize(x, edges, right=True)


def bucketed_mean(x: torch.Tensor, mask: torch.Tensor, bucket: torch.Tensor, n_buckets: int):
    """Per-bucket (mean, count) of x over mask==1 entries; mean is nan for an empty bucket."""
    _check_same_shape(x, mask)
    _check_same_shape(bucket, mask, "bucket")
    m = mask.bool()
    idx = bucket[m].long()
    vals = x[m].to(torch.float64)
    sums = torch.zeros(n_buckets, dtype=torch.float64, device=x.device).index_add_(0, idx, vals)
    counts = torch.zeros(n_buckets, dtype=torch.float64, device=x.device).index_add_(
        0, idx, torch.ones_like(vals)
    )
    return sums / counts, counts.long()


def value_bias(values, returns, mask, edges, by: str = "position"):
    """Mean of V - R per bucket, with token counts (VAPO's value-bias audit).

    by="position": bucket of each token's index within its response (0 = first response token);
    by="length": bucket of the response's length (number of valid tokens) the token belongs to.
    Buckets follow `bucketize(x, edges)`: len(edges) + 1 buckets. Returns (bias, counts).
    """
    return mean_by(values - returns, mask, edges, by)


def mean_by(x, mask, edges, by: str = "position"):
    """Per bucket of token position (by="position") or of response length (by="length"), as in
    `value_bias`: the mean of x over valid tokens, with token counts (nan where a bucket is empty)."""
    if by == "position":
        key = valid_positions(mask)
    elif by == "length":
        key = length_key(mask)
    else:
        raise ValueError(f"by must be 'position' or 'length'; got {by!r}")
    return bucketed_mean(x, mask, bucketize(key, edges), len(edges) + 1)


def length_key(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: the length (valid tokens) of the response each position belongs to."""
    return mask.sum(-1, keepdim=True).long().expand_as(mask).contiguous()


def advantage_error(advantages, reference, mask, edges):
    """Per response-length bucket (`bucketize(length, edges)`): the advantage estimator's bias
    against a reference (mean of A - A_ref over valid tokens), Var(A) and Var(A_ref) (population
    variances over the bucket's tokens), and token counts; nan where a bucket has no token.
    Float64. The reference is the Monte-Carlo advantage
    G_t - V(s_t) (lambda = 1): unbiased for the advantage against the same critic, so A - A_ref
    is the bias that bootstrapping with lambda < 1 takes on from an imperfect critic."""
    _check_same_shape(advantages, mask, "advantages")
    _check_same_shape(reference, mask, "reference")
    bucket = bucketize(length_key(mask), edges)
    n = len(edges) + 1
    a, r = advantages.to(torch.float64), reference.to(torch.float64)
    bias, counts = bucketed_mean(a - r, mask, bucket, n)

    def var(x):
        mean = bucketed_mean(x, mask, bucket, n)[0]
        return bucketed_mean(x * x, mask, bucket, n)[0] - mean * mean

    return bias, var(a), var(r), counts
