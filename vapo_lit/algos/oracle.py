"""True state values where success means writing one known target sequence (torch only).

Some tasks are won by exactly one response: the long chain task with ``reward="chain"`` pays 1
only for the response that writes every step right. There the value of a state is computable
from the policy's error rates. Give each target position a *kind* (for the chain task: counter,
digit by step, end tokens) and let p_k be the chance that the policy, having written a correct
prefix, does not write the target's token at a position of kind k. Then the success probability
from the state before response position t, the value a perfect critic would predict, is::

    V*(s_t) = prod_{j = t}^{L - 1} (1 - p_{kind_j})    if tokens 0 .. t-1 equal the target,
    V*(s_t) = 0                                        once any of them differs,

with L the target's length (its terminating token, e.g. EOS, included). `kind_error_rates`
measures p_k on samples: the positions a response reached with a correct prefix are its trials,
the first position where it left the target is its error. Assumed: errors at different positions
are independent given the kind (what the measured rates can say; a policy whose error rate
drifts with position within a kind is approximated by the kind's average).

Shapes: N responses, R response columns (right-padded), L target columns (right-padded).
"""

from __future__ import annotations

import torch

__all__ = ["first_mismatch", "kind_error_rates", "target_success_values"]


def first_mismatch(
    response_ids: torch.Tensor, lengths: torch.Tensor, target_ids: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """(N,) long: how many leading tokens each response shares with its target, i.e. the index of
    the first position where they differ or where one of them ends. A response equal to its target
    gives the target's length."""
    if response_ids.shape[0] != target_ids.shape[0]:
        raise ValueError(f"{response_ids.shape[0]} responses for {target_ids.shape[0]} targets")
    n, width = response_ids.shape[0], max(response_ids.shape[1], target_ids.shape[1]) + 1
    cols = torch.arange(width, device=response_ids.device)
    resp = torch.full((n, width), -1, dtype=torch.long, device=response_ids.device)
    targ = torch.full((n, width), -2, dtype=torch.long, device=response_ids.device)
    resp[:, : response_ids.shape[1]] = response_ids
    targ[:, : target_ids.shape[1]] = target_ids.to(response_ids.device)
    resp = torch.where(cols < lengths[:, None], resp, torch.full_like(resp, -1))
    targ = torch.where(cols < target_lengths.to(cols.device)[:, None], targ, torch.full_like(targ, -2))
    return (resp != targ).int().argmax(1)  # the extra column always differs: argmax finds the first


def _attempts(first: torch.Tensor, lengths: torch.Tensor, target_lengths: torch.Tensor, width: int):
    """(trial, error) masks (N, width): positions reached with a correct prefix, and the one where the
    response left its target. A response that stopped while still on its target (cut by a length
    limit) attempted nothing at `first`."""
    cols = torch.arange(width, device=first.device)[None, :]
    in_target = cols < target_lengths[:, None]
    written = cols < lengths[:, None]
    trial = (cols <= first[:, None]) & in_target & written
    error = (cols == first[:, None]) & in_target & written
    return trial, error


def kind_error_rates(
    first: torch.Tensor,
    lengths: torch.Tensor,
    kinds: torch.Tensor,
    target_lengths: torch.Tensor,
    n_kinds: int,
    prior_strength: float = 1.0,
):
    """Per kind: the error rate (errors + m * p_all) / (trials + m), shrunk toward the rate p_all
    pooled over every kind by `prior_strength` m pseudo-trials (a kind seldom reached, such as the
    end of a long target, gets about the pooled rate; a kind with many trials its own frequency),
    and the trial and error counts. `kinds`: (N, L) long kind of each target position (any value
    beyond a row's target length). Float64."""
    if kinds.shape[0] != first.shape[0]:
        raise ValueError(f"kinds has {kinds.shape[0]} rows for {first.shape[0]} responses")
    if not prior_strength >= 0:
        raise ValueError(f"prior_strength must be >= 0; got {prior_strength}")
    trial, error = _attempts(first, lengths.to(first.device), target_lengths.to(first.device), kinds.shape[1])
    k = kinds.clamp(0, n_kinds - 1)

    def count(where):
        return torch.zeros(n_kinds, dtype=torch.float64, device=first.device).index_add_(
            0, k[where], torch.ones(int(where.sum()), dtype=torch.float64, device=first.device)
        )

    trials, errors = count(trial), count(error)
    pooled = errors.sum() / trials.sum().clamp(min=1)
    rates = (errors + prior_strength * pooled) / (trials + prior_strength)
    return torch.where(trials + prior_strength > 0, rates, pooled.expand_as(rates)), trials, errors


def target_success_values(
    first: torch.Tensor,
    lengths: torch.Tensor,
    kinds: torch.Tensor,
    target_lengths: torch.Tensor,
    rates: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """(N, width) float64: V*(s_t) of the module docstring for response positions t < length, 0 on
    padding. `rates`: (n_kinds,) error rate of each kind."""
    device = first.device
    L = kinds.shape[1]
    cols = torch.arange(L, device=device)[None, :]
    log_keep = torch.log1p(-rates.to(torch.float64).to(device))[kinds.clamp(0, rates.numel() - 1)]  # (N, L)
    log_keep = torch.where(cols < target_lengths.to(device)[:, None], log_keep, torch.zeros_like(log_keep))
    suffix = log_keep.flip(1).cumsum(1).flip(1)  # (N, L): sum over j >= t of log(1 - p_kind_j)
    out = torch.zeros(first.shape[0], width, dtype=torch.float64, device=device)
    keep = min(L, width)
    out[:, :keep] = suffix[:, :keep].exp()
    t = torch.arange(width, device=device)[None, :]
    on_target = (t <= first[:, None]) & (t < target_lengths.to(device)[:, None])
    return torch.where(on_target & (t < lengths.to(device)[:, None]), out, torch.zeros_like(out))
