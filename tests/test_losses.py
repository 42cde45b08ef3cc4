"""Losses and statistics against independent float64 loops, plus the exactness properties the
module relies on (global token mean across micro-batches, empty positive set)."""

from __future__ import annotations

import math

import pytest
import torch

from vapo_lit.algos import (
    aggregate,
    entropy_from_logits,
    explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    positive_nll,
    token_logprobs,
    value_bias,
    value_loss,
)


def rand_case(B=6, T=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T)
    for b in range(B):
        n = int(torch.randint(1, T + 1, (1,), generator=g))
        mask[b, :n] = 1
    mask[0, 3] = 0  # an interior gap
    mask[0, 0] = 1
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    return logp, old, adv, mask.double()


def ref_policy_loss(logp, old, adv, mask, eps_low, eps_high, mode):
    per_seq, total, count = [], 0.0, 0
    for b in range(len(logp)):
        s, n = 0.0, 0
        for t in range(len(logp[b])):
            if mask[b][t] != 1:
                continue
            ratio = math.exp(logp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            j = min(ratio * adv[b][t], clipped * adv[b][t])
            s, n = s + j, n + 1
        total, count = total + s, count + n
        if n:
            per_seq.append(s / n)
    return -(total / count) if mode == "token" else -(sum(per_seq) / len(per_seq))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["token", "sample"])
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)])
def test_policy_loss_matches_reference(seed, mode, eps):
    logp, old, adv, mask = rand_case(seed=seed)
    loss, stats = policy_loss(logp, old, adv, mask, eps_low=eps[0], eps_high=eps[1], aggregation=mode)
    ref = ref_policy_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), *eps, mode)
    assert loss.item() == pytest.approx(ref, rel=1e-10)
    # clip fractions by side, by a loop
    low = high = n = 0
    for b in range(len(logp)):
        for t in range(logp.shape[1]):
            if mask[b, t] == 1:
                r = math.exp(logp[b, t] - old[b, t])
                low += adv[b, t] < 0 and r < 1 - eps[0]
                high += adv[b, t] > 0 and r > 1 + eps[1]
                n += 1
    assert stats.clipfrac_low.item() == pytest.approx(low / n)
    assert stats.clipfrac_high.item() == pytest.approx(high / n)
    assert stats.ratio_max.item() >= stats.ratio_mean.item() > 0
    assert stats.approx_kl.item() >= 0


def test_clip_higher_keeps_more_upside():
    """With A > 0 and ratio 1.25, eps_high 0.28 still passes gradient; symmetric 0.2 does not."""
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)
    old = torch.zeros(1, 1)
    adv = torch.ones(1, 1)
    mask = torch.ones(1, 1)
    for eps_high, expect_grad in ((0.2, 0.0), (0.28, -1.25)):
        logp.grad = None
        loss, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=eps_high)
        loss.backward()
        assert logp.grad.item() == pytest.approx(expect_grad, rel=1e-6)


@pytest.mark.parametrize("mode", ["token", "sample"])
def test_global_denominator_makes_micro_batches_exact(mode):
    """Summing micro-batch losses with the mini-batch denominator equals the whole-batch loss
    and gradient (gradient accumulation and data parallelism stay exact)."""
    logp, old, adv, mask = rand_case(B=8, T=15, seed=3)
    logp = logp.clone().requires_grad_(True)
    full, _ = policy_loss(logp, old, adv, mask, aggregation=mode)
    (g_full,) = torch.autograd.grad(full, logp)
    den = mask.sum() if mode == "token" else (mask.sum(1) > 0).sum()
    parts = [
        policy_loss(
            logp[i : i + 3],
            old[i : i + 3],
            adv[i : i + 3],
            mask[i : i + 3],
            aggregation=mode,
            denominator=den,
        )[0]
        for i in (0, 3, 6)
    ]
    total = sum(parts)
    (g_parts,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(g_parts, g_full)
    # and the naive per-micro-batch mean is NOT exact (the bug the denominator prevents)
    naive = (
        sum(
            policy_loss(logp[i : i + 3], old[i : i + 3], adv[i : i + 3], mask[i : i + 3], aggregation=mode)[0]
            for i in (0, 3, 6)
        )
        / 3
    )
    assert abs(naive.item() - full.item()) > 1e-6


def test_token_vs_sample_weights_long_responses():
    """Token-level weighs each token equally; sample-level gives a short response's tokens more."""
    x = torch.zeros(2, 10, dtype=torch.float64)
    mask = torch.zeros(2, 10, dtype=torch.float64)
    mask[0, :2] = 1
    mask[1, :] = 1
    x[0, :2] = 1.0  # the short response
    assert aggregate(x, mask, "token").item() == pytest.approx(2 / 12)
    assert aggregate(x, mask, "sample").item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        aggregate(x, mask, "seq")


def test_positive_nll():
    logp, _, _, mask = rand_case(B=5, T=12, seed=7)
    positive = torch.tensor([True, False, True, False, False])
    loss, n_resp, n_tok = positive_nll(logp, mask, positive)
    num = sum(logp[b, t].item() for b in (0, 2) for t in range(12) if mask[b, t] == 1)
    den = sum(1 for b in (0, 2) for t in range(12) if mask[b, t] == 1)
    assert loss.item() == pytest.approx(-num / den, rel=1e-12)
    assert n_resp.item() == 2 and n_tok.item() == den


def test_positive_nll_empty_set_is_exactly_zero():
    logp = torch.full((3, 4), -float("inf"))  # even pathological log-probs cannot leak in
    logp.requires_grad_(True)
    loss, n_resp, n_tok = positive_nll(logp, torch.ones(3, 4), torch.zeros(3, dtype=torch.bool))
    assert loss.item() == 0.0 and not math.isnan(loss.item())
    assert n_resp.item() == 0 and n_tok.item() == 0
    # a positive response that has no valid tokens is not a positive sample either
    loss, n_resp, _ = positive_nll(logp, torch.zeros(3, 4), torch.ones(3, dtype=torch.bool))
    assert loss.item() == 0.0 and n_resp.item() == 0


def test_positive_nll_bad_shape():
    with pytest.raises(ValueError, match=r"positive must have shape \(B,\) = \(3,\)"):
        positive_nll(torch.zeros(3, 4), torch.ones(3, 4), torch.ones(4, dtype=torch.bool))


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_reference(clip):
    g = torch.Generator().manual_seed(1)
    v = torch.randn(4, 9, generator=g, dtype=torch.float64)
    old = v + 0.3 * torch.randn(4, 9, generator=g, dtype=torch.float64)
    ret = torch.randn(4, 9, generator=g, dtype=torch.float64)
    _, _, _, mask = rand_case(B=4, T=9, seed=2)
    loss = value_loss(v, ret, mask, old_values=old, clip_range=clip)
    s = n = 0
    for b in range(4):
        for t in range(9):
            if mask[b, t] == 1:
                e = (v[b, t] - ret[b, t]).item() ** 2
                if clip is not None:
                    vc = old[b, t].item() + min(max(v[b, t].item() - old[b, t].item(), -clip), clip)
                    e = max(e, (vc - ret[b, t].item()) ** 2)
                s, n = s + e, n + 1
    assert loss.item() == pytest.approx(0.5 * s / n, rel=1e-12)
    with pytest.raises(ValueError, match="needs old_values"):
        value_loss(v, ret, mask, clip_range=0.2)


def test_entropy_and_token_logprobs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64) * 3
    ent = entropy_from_logits(logits)
    tokens = torch.randint(0, 7, (3, 5), generator=g)
    lp = token_logprobs(logits, tokens)
    for i in range(3):
        for j in range(5):
            z = logits[i, j].tolist()
            mx = max(z)
            Z = sum(math.exp(a - mx) for a in z)
            p = [math.exp(a - mx) / Z for a in z]
            assert ent[i, j].item() == pytest.approx(-sum(q * math.log(q) for q in p), rel=1e-5)
            assert lp[i, j].item() == pytest.approx(math.log(p[tokens[i, j]]), rel=1e-5)
    uniform = entropy_from_logits(torch.zeros(10))
    assert uniform.item() == pytest.approx(math.log(10), rel=1e-6)


def test_masked_stats_and_explained_variance():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 11, generator=g, dtype=torch.float64)
    _, _, _, mask = rand_case(B=5, T=11, seed=4)
    vals = [x[b, t].item() for b in range(5) for t in range(11) if mask[b, t] == 1]
    mean = sum(vals) / len(vals)
    var = sum((a - mean) ** 2 for a in vals) / (len(vals) - 1)
    assert masked_mean(x, mask).item() == pytest.approx(mean, rel=1e-12)
    assert masked_var(x, mask).item() == pytest.approx(var, rel=1e-12)
    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0, abs=1e-9)
    assert bool((w[mask == 0] == 0).all())
    # explained variance by hand: 1 - Var(R - V) / Var(R), population variances over valid tokens
    ret = x
    v = x + 0.5 * torch.randn(5, 11, generator=g, dtype=torch.float64)
    err = [ret[b, t].item() - v[b, t].item() for b in range(5) for t in range(11) if mask[b, t] == 1]
    me = sum(err) / len(err)
    ve = sum((e - me) ** 2 for e in err) / len(err)
    vr = sum((a - mean) ** 2 for a in vals) / len(vals)
    assert explained_variance(v, ret, mask).item() == pytest.approx(1 - ve / vr, rel=1e-10)
    assert explained_variance(ret, ret, mask).item() == pytest.approx(1.0)
    assert math.isnan(explained_variance(v, torch.ones_like(v), mask).item())  # Var(R) = 0
    # returns that are 0 up to rounding of V + A (every outcome 0): no variance to explain
    noisy = torch.zeros_like(v) + 1e-17 * torch.randn(5, 11, generator=g, dtype=torch.float64)
    assert math.isnan(explained_variance(v, noisy, mask).item())
    assert not math.isnan(explained_variance(v, 1e-6 * x, mask).item())  # small but real variance
    assert math.isnan(masked_mean(x, torch.zeros_like(mask)).item())


@pytest.mark.parametrize("by", ["position", "length"])
def test_value_bias_buckets(by):
    g = torch.Generator().manual_seed(9)
    v = torch.randn(6, 30, generator=g, dtype=torch.float64)
    ret = torch.randn(6, 30, generator=g, dtype=torch.float64)
    _, _, _, mask = rand_case(B=6, T=30, seed=6)
    edges = [1, 8, 16]
    bias, counts = value_bias(v, ret, mask, edges, by=by)
    sums, ns = [0.0] * 4, [0] * 4
    for b in range(6):
        k, length = 0, int(mask[b].sum())
        for t in range(30):
            if mask[b, t] != 1:
                continue
            key = k if by == "position" else length
            i = sum(1 for e in edges if key >= e)
            sums[i] += v[b, t].item() - ret[b, t].item()
            ns[i] += 1
            k += 1
    assert counts.tolist() == ns
    for i in range(4):
        if ns[i]:
            assert bias[i].item() == pytest.approx(sums[i] / ns[i], rel=1e-10)
        else:
            assert math.isnan(bias[i].item())
    if by == "position":  # bucket 0 is exactly the first response token of every row
        assert counts[0].item() == 6


def test_bad_eps():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match=r"eps_low must be in \[0, 1\)"):
        policy_loss(z, z, z, z, eps_low=1.0)
    with pytest.raises(ValueError, match="eps_high must be >= 0"):
        policy_loss(z, z, z, z, eps_high=-0.1)
    with pytest.raises(ValueError, match="advantages must have the shape of logprobs"):
        policy_loss(z, z, torch.zeros(2, 1), z)


def test_group_normalized_advantage_matches_loop():
    """DAPO's conventions (verl, TRL and DAPO's code): the unbiased group std; a group of equal
    rewards gets exactly 0, whatever their value (graded verifiers: 0.7, 0.3, 0.1)."""
    from vapo_lit.algos import group_normalized_advantage

    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float64, torch.float32):
        scores = (torch.rand(20, generator=g) < 0.4).to(dtype)
        scores[:4] = 1.0  # a group with no signal
        scores[4:8] = 0.7  # equal non-dyadic rewards: the float32 mean is not exactly 0.7
        scores[8:12] = torch.tensor([0.3, 0.1, 0.3, 0.3], dtype=dtype)
        mask = torch.ones(20, 5, dtype=dtype)
        mask[13, 2:] = 0
        adv = group_normalized_advantage(scores, mask, group_size=4)
        for b in range(20):
            grp = [float(x) for x in scores[(b // 4) * 4 : (b // 4) * 4 + 4].tolist()]
            mean = sum(grp) / 4
            std = math.sqrt(sum((x - mean) ** 2 for x in grp) / 3)  # Bessel's correction
            expect = 0.0 if max(grp) == min(grp) else (float(scores[b]) - mean) / (std + 1e-6)
            for t in range(5):
                tol = 1e-9 if dtype == torch.float64 else 1e-5
                assert adv[b, t].item() == pytest.approx(expect * mask[b, t].item(), abs=tol)
        assert bool((adv[:8] == 0).all())  # exactly zero, not a rounding residue
    with pytest.raises(ValueError, match="group_size must be >= 2 and divide N = 20"):
        group_normalized_advantage(scores, mask, group_size=3)


# ---- a sampler with its own kernels: truncated importance sampling and the sampler-trainer gap ----


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", ["token", "sample"])
@pytest.mark.parametrize("cap", [1.0, 2.0, 10.0])
def test_truncated_importance_sampling_matches_reference(seed, mode, cap):
    """The policy loss with TIS weights: each token's clipped surrogate times
    min(exp(old - sampler), cap), by a float64 loop; the gradient carries the weight as a constant."""
    from vapo_lit.algos import truncated_is_weights

    logp, old, adv, mask = rand_case(seed=seed)
    g = torch.Generator().manual_seed(100 + seed)
    sampler = old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.5
    w = truncated_is_weights(old, sampler, cap)
    for b in range(len(old)):
        for t in range(old.shape[1]):
            assert w[b, t].item() == pytest.approx(
                min(math.exp(old[b, t].item() - sampler[b, t].item()), cap), rel=1e-12
            )
    assert 0 < float(w.max()) <= cap and bool((w < cap).any())
    logp = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, aggregation=mode, is_weights=w)
    per_seq, total, count = [], 0.0, 0
    for b in range(len(logp)):
        s = n = 0
        for t in range(logp.shape[1]):
            if mask[b, t] != 1:
                continue
            r = math.exp(logp[b, t].item() - old[b, t].item())
            j = min(r * adv[b, t].item(), min(max(r, 0.8), 1.28) * adv[b, t].item())
            s, n = s + w[b, t].item() * j, n + 1
        total, count = total + s, count + n
        if n:
            per_seq.append(s / n)
    ref = -(total / count) if mode == "token" else -(sum(per_seq) / len(per_seq))
    assert loss.item() == pytest.approx(ref, rel=1e-10)
    loss.backward()
    unweighted = logp.detach().clone().requires_grad_(True)
    policy_loss(unweighted, old, adv, mask, eps_low=0.2, eps_high=0.28, aggregation=mode)[0].backward()
    torch.testing.assert_close(logp.grad, unweighted.grad * w, rtol=1e-12, atol=0)
    # weights of 1 are the plain loss
    one = policy_loss(logp.detach(), old, adv, mask, aggregation=mode, is_weights=torch.ones_like(old))[0]
    assert one.item() == policy_loss(logp.detach(), old, adv, mask, aggregation=mode)[0].item()


def test_truncated_importance_sampling_bad_input():
    from vapo_lit.algos import truncated_is_weights

    x = torch.zeros(2, 3)
    for cap in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="cap must be a finite number > 0"):
            truncated_is_weights(x, x, cap)
    with pytest.raises(ValueError, match="sampler_logprobs must have the shape"):
        truncated_is_weights(x, torch.zeros(2, 4), 2.0)
    with pytest.raises(ValueError, match="is_weights must have the shape"):
        policy_loss(x, x, x, x, is_weights=torch.ones(2, 4))


@pytest.mark.parametrize("seed", range(3))
def test_sampler_mismatch_matches_reference(seed):
    """mean and max |trainer - sampler| and the k3 KL estimate over valid tokens, by a float64 loop
    (float32 inputs: computed in float64)."""
    from vapo_lit.algos import sampler_mismatch

    _, old, _, mask = rand_case(seed=seed)
    g = torch.Generator().manual_seed(200 + seed)
    sampler = (old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 1e-3).float()
    trainer = old.float()
    sampler[mask == 0] = 5.0  # padding never counts
    st = sampler_mismatch(trainer, sampler, mask)
    diffs = [
        float(trainer[b, t].double() - sampler[b, t].double())
        for b in range(len(old))
        for t in range(old.shape[1])
        if mask[b, t] == 1
    ]
    assert st.mean_abs.item() == pytest.approx(sum(map(abs, diffs)) / len(diffs), rel=1e-12)
    assert st.max_abs.item() == pytest.approx(max(map(abs, diffs)), rel=1e-12)
    kl = sum(math.expm1(d) - d for d in diffs) / len(diffs)
    assert st.approx_kl.item() == pytest.approx(kl, rel=1e-9) and st.approx_kl.item() > 0
    assert st.mean_abs.dtype == torch.float64
    same = sampler_mismatch(trainer, trainer, mask)
    assert same.mean_abs.item() == same.max_abs.item() == same.approx_kl.item() == 0.0
    with pytest.raises(ValueError, match="share one shape"):
        sampler_mismatch(trainer, sampler[:, :3], mask)
