"""The length diagnostics against independent float64 loops: each token's weight in the
policy loss (token- vs sample-level), the share of the policy-gradient weight by response length,
and the advantage's bias and variance against Monte-Carlo by length bucket."""

from __future__ import annotations

import math

import pytest
import torch

from vapo_lit.algos import advantage_error, aggregate, aggregation_weights, bucketize, weight_share


def rand_rows(B=9, T=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        mask[b, : int(torch.randint(1, T + 1, (1,), generator=g))] = 1
    mask[2] = 0  # a row without tokens
    a = torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = a + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64) + 0.3
    return a, ref, mask


def length_bucket(n, edges):
    return sum(1 for e in edges if n >= e)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["token", "sample"])
@pytest.mark.parametrize("den", [None, 17])
def test_aggregation_weights_are_the_loss_gradient(seed, mode, den):
    a, _, mask = rand_rows(seed=seed)
    x = a.clone().requires_grad_(True)
    aggregate(x, mask, mode, den).backward()
    assert torch.allclose(aggregation_weights(mask, mode, den), x.grad, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["token", "sample"])
def test_weight_share_matches_loop(seed, mode):
    a, _, mask = rand_rows(seed=seed)
    edges = (5, 12, 20)
    lengths = [int(r.sum()) for r in mask]
    group = bucketize(mask.sum(1).long(), edges)
    got = weight_share(aggregation_weights(mask, mode), a, group, len(edges) + 1)
    rows = [b for b in range(len(mask)) if lengths[b]]
    mass = [0.0] * (len(edges) + 1)
    for b in rows:
        for t in range(mask.shape[1]):
            if mask[b, t]:
                w = 1 / sum(lengths) if mode == "token" else 1 / (lengths[b] * len(rows))
                mass[length_bucket(lengths[b], edges)] += w * abs(float(a[b, t]))
    want = [m / sum(mass) for m in mass]
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert math.isclose(float(got.sum()), 1.0, rel_tol=1e-12)


def test_token_level_weight_grows_with_length_sample_level_does_not():
    """Equal |A| on every token: token-level gives each response a share proportional to its length,
    sample-level an equal share per response (VAPO section 4.2, Eq. 6 vs 7)."""
    mask = torch.zeros(2, 100, dtype=torch.float64)
    mask[0, :10], mask[1, :90] = 1, 1
    a, group = torch.ones_like(mask), torch.tensor([0, 1])
    assert weight_share(aggregation_weights(mask, "token"), a, group, 2).tolist() == pytest.approx([0.1, 0.9])
    assert weight_share(aggregation_weights(mask, "sample"), a, group, 2).tolist() == pytest.approx(
        [0.5, 0.5]
    )


def test_weight_share_without_weight_is_nan():
    mask = torch.ones(2, 3, dtype=torch.float64)
    share = weight_share(aggregation_weights(mask), torch.zeros_like(mask), torch.tensor([0, 1]), 2)
    assert all(math.isnan(s) for s in share.tolist())


@pytest.mark.parametrize("seed", range(4))
def test_advantage_error_matches_loop(seed):
    a, ref, mask = rand_rows(seed=seed)
    edges = (5, 12, 20)
    bias, var, var_ref, counts = advantage_error(a, ref, mask, edges)
    for k in range(len(edges) + 1):
        toks = [
            (float(a[b, t]), float(ref[b, t]))
            for b in range(len(mask))
            for t in range(mask.shape[1])
            if mask[b, t] and length_bucket(int(mask[b].sum()), edges) == k
        ]
        assert int(counts[k]) == len(toks)
        if not toks:
            assert math.isnan(bias[k]) and math.isnan(var[k]) and math.isnan(var_ref[k])
            continue
        n = len(toks)
        mean_a, mean_r = sum(x for x, _ in toks) / n, sum(r for _, r in toks) / n
        assert float(bias[k]) == pytest.approx(sum(x - r for x, r in toks) / n, rel=1e-12, abs=1e-14)
        assert float(var[k]) == pytest.approx(
            sum((x - mean_a) ** 2 for x, _ in toks) / n, rel=1e-9, abs=1e-12
        )
        assert float(var_ref[k]) == pytest.approx(
            sum((r - mean_r) ** 2 for _, r in toks) / n, rel=1e-9, abs=1e-12
        )


def test_advantage_error_of_the_reference_itself_is_zero():
    _, ref, mask = rand_rows(seed=5)
    bias, var, var_ref, counts = advantage_error(ref, ref, mask, (5, 12, 20))
    filled = counts > 0
    assert torch.equal(bias[filled], torch.zeros_like(bias[filled]))
    assert torch.allclose(var[filled], var_ref[filled])
