"""GAE and the length-adaptive lambda against an independent float64 loop, docs/algorithm.md numbers and
invariants. Every case runs on both backends (native C sweep and pure-torch scan)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vapo_lit.algos.advantage as adv_mod
from vapo_lit.algos import _native, decoupled_gae, gae, lambda_clamped, length_adaptive_lambda

TOL = 1e-5  # relative error <= 1e-5 against the float64 reference on every case


# ----------------------------------------------------------------------------- reference
def reference_gae(rewards, values, mask, lam, gamma=1.0, bootstrap=None):
    """Plain float64 loop: walk each row's valid tokens backwards; masked positions are cut out."""
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        lam_b = float(lam[b]) if isinstance(lam, (list, tuple, torch.Tensor)) else float(lam)
        valid = [t for t in range(T) if float(mask[b][t]) == 1.0]
        following_value = 0.0 if bootstrap is None else float(bootstrap[b])
        running = 0.0
        for t in reversed(valid):
            v_t = float(values[b][t])
            delta = float(rewards[b][t]) + gamma * following_value - v_t
            running = delta + gamma * lam_b * running
            adv[b][t] = running
            ret[b][t] = running + v_t
            following_value = v_t
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def rel_err(x: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """Normwise relative error max|x - ref| / max(max|ref|, scale).

    `scale` is the size of the inputs (max |V|, |r|): returns = A + V can cancel to an exact 0 in
    float64 whose float32 result is a rounding error of the size of V, not of the zero.
    """
    return (x.double() - ref).abs().max().item() / max(ref.abs().max().item(), scale, 1e-12)


def random_batch(B, T, seed, gaps=True, dtype=torch.float32):
    """Random lengths, left/right padding, interior gaps, terminal and truncated rows."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=dtype)
    for b in range(B):
        start = int(torch.randint(0, max(1, T // 4), (1,), generator=g))
        length = int(torch.randint(1, T - start + 1, (1,), generator=g))
        mask[b, start : start + length] = 1
        if gaps and length > 4:  # tool/environment observations inside the response
            for _ in range(int(torch.randint(0, 3, (1,), generator=g))):
                a = start + int(torch.randint(1, length - 1, (1,), generator=g))
                mask[b, a : a + int(torch.randint(1, 4, (1,), generator=g))] = 0
        mask[b, start + length - 1] = 1  # the last response token is the policy's own
    values = torch.randn(B, T, generator=g, dtype=dtype)
    rewards = torch.zeros(B, T, dtype=dtype)
    last = (mask * torch.arange(T, dtype=dtype)).argmax(1)
    rewards[torch.arange(B), last] = (torch.rand(B, generator=g) < 0.5).to(dtype)
    # a few dense rewards too (the functions must not assume sparsity)
    rewards += (
        mask
        * (torch.rand(B, T, generator=g, dtype=dtype) < 0.05)
        * torch.randn(B, T, generator=g, dtype=dtype)
    )
    lam = torch.rand(B, generator=g, dtype=dtype)
    lam[0] = 0.0
    if B > 1:
        lam[1] = 1.0
    truncated = torch.rand(B, generator=g) < 0.5
    bootstrap = torch.randn(B, generator=g, dtype=dtype) * truncated
    return rewards, values, mask, lam, bootstrap


@pytest.fixture(params=["native", "torch"])
def backend(request, monkeypatch):
    monkeypatch.setenv("VAPO_LIT_GAE_BACKEND", request.param)
    if request.param == "native" and _native.load() is None:
        pytest.fail(f"native GAE kernel did not build: {_native.failure()}")
    return request.param


# ----------------------------------------------------------------------------- lambda schedule
def test_lambda_spec_numbers():
    lam = length_adaptive_lambda(torch.tensor([20, 100]), alpha=0.05)
    assert lam[0].item() == 0.0  # formula value exactly 0 at l = 1/alpha
    assert lam[1].item() == pytest.approx(0.8, abs=1e-7)
    assert 1 / (1 - lam[1].item()) == pytest.approx(5.0, rel=1e-6)  # window alpha*l
    assert 0.95**100 == pytest.approx(0.0059205, rel=1e-4)  # what the fixed lambda decays to


def test_lambda_against_formula_and_clamp():
    lengths = torch.arange(1, 3001)
    for alpha in (0.05, 0.3, 1.0):
        for gamma in (1.0, 0.99):
            lam = length_adaptive_lambda(lengths, alpha, gamma).double()
            expect = [min(1.0, max(0.0, (1 - 1 / (alpha * l)) / gamma)) for l in range(1, 3001)]
            assert rel_err(lam, torch.tensor(expect, dtype=torch.float64)) <= TOL
            n_clamped = sum(1 for l in range(1, 3001) if not 0 <= (1 - 1 / (alpha * l)) / gamma <= 1)
            assert lambda_clamped(lengths, alpha, gamma) == n_clamped
    assert lambda_clamped(torch.tensor([5, 19, 20, 21]), 0.05) == 2  # 20 gives exactly 0: not clamped


def test_lambda_grows_with_length():
    lam = length_adaptive_lambda(torch.tensor([10, 20, 50, 200, 1000, 8000]))
    assert bool((lam[1:] >= lam[:-1]).all()) and lam[-1] < 1


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(lengths=torch.tensor([10, 0])), "lengths must all be > 0"),
        (dict(lengths=torch.tensor([10, -3])), "got -3"),
        (dict(lengths=torch.tensor([10]), alpha=0.0), "alpha must be a finite number > 0"),
        (dict(lengths=torch.tensor([10]), alpha=-1), "got -1"),
        (dict(lengths=torch.tensor([10]), alpha=float("nan")), "alpha"),
        (dict(lengths=torch.tensor([10]), gamma=0.0), "gamma must be in (0, 1]"),
        (dict(lengths=torch.tensor([[10]])), "lengths must be a 1-D tensor"),
    ],
)
def test_lambda_bad_input(kwargs, needle):
    with pytest.raises(ValueError, match=None) as e:
        length_adaptive_lambda(**kwargs)
    assert needle in str(e.value)


# ----------------------------------------------------------------------------- gae vs reference
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (16, 64), (9, 300)])
def test_gae_matches_reference(backend, seed, shape):
    r, v, m, lam, boot = random_batch(*shape, seed=seed)
    for lam_arg in (lam, 0.95, 1.0, 0.0):
        for gamma in (1.0, 0.9):
            for b in (boot, None):
                adv, ret = gae(r, v, m, lam_arg, gamma=gamma, bootstrap_values=b)
                ref_adv, ref_ret = reference_gae(
                    r.tolist(),
                    v.tolist(),
                    m.tolist(),
                    lam_arg.tolist() if torch.is_tensor(lam_arg) else lam_arg,
                    gamma,
                    None if b is None else b.tolist(),
                )
                assert adv.dtype == torch.float32 and adv.shape == r.shape
                scale = max(v.abs().max().item(), r.abs().max().item())
                assert rel_err(adv, ref_adv, scale) <= TOL, (lam_arg, gamma, b is None)
                assert rel_err(ret, ref_ret, scale) <= TOL
                assert bool((adv[m == 0] == 0).all()) and bool((ret[m == 0] == 0).all())


def test_gae_long_rows_float32(backend):
    """Long rows accumulate in float32 without drifting past the tolerance."""
    r, v, m, lam, boot = random_batch(4, 4096, seed=11, gaps=True)
    adv, ret = gae(r, v, m, lam, bootstrap_values=boot)
    ref_adv, ref_ret = reference_gae(r.tolist(), v.tolist(), m.tolist(), lam.tolist(), 1.0, boot.tolist())
    assert rel_err(adv, ref_adv) <= TOL and rel_err(ret, ref_ret) <= TOL


def test_gae_float64_inputs(backend):
    r, v, m, lam, boot = random_batch(5, 40, seed=3, dtype=torch.float64)
    adv, ret = gae(r, v, m, lam, bootstrap_values=boot)
    ref_adv, ref_ret = reference_gae(r.tolist(), v.tolist(), m.tolist(), lam.tolist(), 1.0, boot.tolist())
    assert adv.dtype == torch.float64
    assert (adv - ref_adv).abs().max() < 1e-12 and (ret - ref_ret).abs().max() < 1e-12


def test_backends_agree():
    r, v, m, lam, boot = random_batch(32, 500, seed=5)
    lib = _native.load()
    assert lib is not None, _native.failure()
    args = (r, v, m, boot, lam, torch.ones_like(lam) * 0.7, 1.0)
    a1, r1, _ = adv_mod._sweep_native(lib, *args)
    a2, r2 = adv_mod._sweep_torch(*args)
    assert torch.allclose(a1, a2, atol=1e-5) and torch.allclose(r1, r2, atol=1e-5)


def test_native_threads_split_rows_exactly(monkeypatch):
    """The multi-threaded row split gives bit-identical results to one thread."""
    r, v, m, lam, boot = random_batch(64, 2048, seed=9)
    lib = _native.load()
    assert lib is not None
    many = adv_mod._sweep_native(lib, r, v, m, boot, lam, None, 1.0)
    monkeypatch.setattr(adv_mod, "_MIN_ROWS_PER_THREAD_ELEMS", 1 << 40)
    one = adv_mod._sweep_native(lib, r, v, m, boot, lam, None, 1.0)
    assert all(torch.equal(x, y) for x, y in zip(many, one))


# ----------------------------------------------------------------------------- seed and docs/algorithm.md cases
def test_seed_minimal_example(backend):
    """Seed 000's minimal example: two terminal responses of 32 and 64 tokens, reward 1 at the end."""
    reward = torch.zeros(2, 64)
    reward[0, 31] = 1.0
    reward[1, 63] = 1.0
    value = torch.zeros_like(reward)
    mask = torch.zeros_like(reward)
    mask[0, :32] = 1
    mask[1, :] = 1
    length = mask.sum(1)
    policy_lam = length_adaptive_lambda(length)
    actor_adv, _ = gae(reward, value, mask, policy_lam)
    critic_adv, critic_ret = gae(reward, value, mask, torch.ones(2))
    assert policy_lam[1] > policy_lam[0]
    assert actor_adv[1, 0] > actor_adv[0, 0]
    torch.testing.assert_close(critic_adv[0, :32], torch.ones(32))
    torch.testing.assert_close(critic_adv[0, 32:], torch.zeros(32))
    torch.testing.assert_close(critic_ret, critic_adv)  # V = 0
    # with lambda = 1 - 1/(0.05*32) = 0.375 the first token sees the reward as 0.375^31
    assert actor_adv[0, 0].item() == pytest.approx(0.375**31, rel=1e-5)


def test_fixed_lambda_decay_spec_number(backend):
    """With V = 0 and lambda 0.95 the terminal reward reaches 100 tokens back as 0.95^100."""
    T = 101
    r = torch.zeros(1, T)
    r[0, -1] = 1
    adv, _ = gae(r, torch.zeros(1, T), torch.ones(1, T), 0.95)
    assert adv[0, 0].item() == pytest.approx(0.0059205, rel=1e-4)


def test_terminal_vs_truncated(backend):
    """Terminal: no value after the last token. Truncated: the bootstrap value is added."""
    r = torch.zeros(2, 4)
    v = torch.tensor([[0.5, 0.5, 0.5, 0.5]] * 2)
    m = torch.ones(2, 4)
    adv, ret = gae(r, v, m, 1.0, bootstrap_values=torch.tensor([0.0, 0.8]))
    torch.testing.assert_close(ret[0], torch.zeros(4))  # MC return of a terminal 0 reward
    torch.testing.assert_close(ret[1], torch.full((4,), 0.8))
    torch.testing.assert_close(adv[1, -1], torch.tensor(0.3))


def test_gap_values_never_leak(backend):
    """A huge value or reward-free observation inside a gap changes nothing on valid tokens."""
    r, v, m, lam, boot = random_batch(8, 60, seed=2)
    adv, ret = gae(r, v, m, lam, bootstrap_values=boot)
    v2 = torch.where(m == 0, torch.full_like(v, 1e6), v)
    adv2, ret2 = gae(r, v2, m, lam, bootstrap_values=boot)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


# ----------------------------------------------------------------------------- decoupled
def test_decoupled_equals_two_single_calls(backend):
    r, v, m, lam, boot = random_batch(12, 80, seed=4)
    v.requires_grad_(True)
    a, ret = decoupled_gae(r, v, m, lam, 1.0, bootstrap_values=boot)
    a_ref, _ = gae(r, v, m, lam, bootstrap_values=boot)
    _, ret_ref = gae(r, v, m, 1.0, bootstrap_values=boot)
    torch.testing.assert_close(a, a_ref)
    torch.testing.assert_close(ret, ret_ref)
    assert not a.requires_grad and not ret.requires_grad
    assert a.data_ptr() != ret.data_ptr()


def test_decoupled_critic_target_is_monte_carlo(backend):
    """lambda_critic = 1, gamma = 1, terminal: every valid token's target is the final reward."""
    r, v, m, lam, _ = random_batch(10, 50, seed=8)
    r = r * 0
    last = (m * torch.arange(50.0)).argmax(1)
    outcome = (torch.arange(10) % 2).float()
    r[torch.arange(10), last] = outcome
    _, ret = decoupled_gae(r, v, m, lam, 1.0)
    expect = outcome[:, None].expand_as(m) * m
    torch.testing.assert_close(ret, expect, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda a: a.update(values=torch.zeros(3, 5)), "same (B, T) shape"),
        (lambda a: a.update(mask=torch.ones(4)), "mask must have shape (B, T)"),
        (lambda a: a.update(lam=1.5), "lam must be in [0, 1]; got 1.5"),
        (lambda a: a.update(lam=-0.1), "lam must be in [0, 1]"),
        (lambda a: a.update(lam=torch.tensor([0.5, 2.0, 0.5, 0.5])), "got 2.0"),
        (lambda a: a.update(lam=torch.ones(3)), "(B,) = (4,) tensor"),
        (lambda a: a.update(bootstrap_values=torch.ones(5)), "bootstrap_values must have shape (B,) = (4,)"),
        (lambda a: a.update(gamma=1.2), "gamma must be in [0, 1]"),
        (lambda a: a.update(rewards=torch.zeros(4, 6, dtype=torch.long)), "floating point"),
        (lambda a: a["mask"].__setitem__((1, 2), 0.5), "mask must contain only 0 and 1; got 0.5 at [1, 2]"),
        (lambda a: a["rewards"].__setitem__((2, 5), 1.0), "rewards must be 0 where mask is 0"),
    ],
)
def test_gae_bad_input(backend, mutate, needle):
    args = dict(rewards=torch.zeros(4, 6), values=torch.zeros(4, 6), mask=torch.ones(4, 6), lam=0.9)
    args["mask"][:, 5] = 0
    mutate(args)
    with pytest.raises(ValueError) as e:
        gae(**args)
    assert needle in str(e.value)


# ----------------------------------------------------------------------------- properties
@st.composite
def batches(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 24))
    seed = draw(st.integers(0, 10_000))
    return random_batch(B, T, seed)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), pad_at=st.data())
def test_padding_never_changes_valid_results(batch, pad_at):
    """Inserting masked columns anywhere (left, right, inside) leaves every valid result unchanged."""
    r, v, m, lam, boot = batch
    B, T = r.shape
    where = pad_at.draw(st.integers(0, T))
    width = pad_at.draw(st.integers(1, 5))
    junk_v = torch.randn(B, width) * 100
    ins = lambda x, fill: torch.cat([x[:, :where], fill, x[:, where:]], 1)  # noqa: E731
    r2, v2, m2 = ins(r, torch.zeros(B, width)), ins(v, junk_v), ins(m, torch.zeros(B, width))
    for backend in ("native", "torch"):
        import os

        os.environ["VAPO_LIT_GAE_BACKEND"] = backend
        try:
            a, ret = gae(r, v, m, lam, bootstrap_values=boot)
            a2, ret2 = gae(r2, v2, m2, lam, bootstrap_values=boot)
        finally:
            del os.environ["VAPO_LIT_GAE_BACKEND"]
        keep = torch.ones(T + width, dtype=torch.bool)
        keep[where : where + width] = False
        torch.testing.assert_close(a2[:, keep], a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret2[:, keep], ret, atol=1e-5, rtol=1e-5)
        assert bool((a2[:, ~keep] == 0).all())


@settings(max_examples=40, deadline=None)
@given(batch=batches())
def test_lambda_one_returns_are_reward_to_go(batch):
    """gamma = lambda = 1: returns are reward-to-go (+ bootstrap), whatever V is."""
    r, v, m, lam, boot = batch
    _, ret = gae(r, v, m, 1.0, bootstrap_values=boot)
    togo = (r * m).flip(1).cumsum(1).flip(1) + boot[:, None]
    torch.testing.assert_close(ret, togo * m, atol=1e-4, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(batch=batches())
def test_lambda_zero_is_one_step_td(batch):
    r, v, m, _, boot = batch
    adv, _ = gae(r, v, m, 0.0, bootstrap_values=boot)
    ref, _ = reference_gae(r.tolist(), v.tolist(), m.tolist(), 0.0, 1.0, boot.tolist())
    assert rel_err(adv, ref) <= TOL if ref.abs().max() > 0 else bool((adv == 0).all())


def test_empty_rows_and_all_masked():
    r = torch.zeros(3, 5)
    m = torch.zeros(3, 5)
    adv, ret = gae(r, torch.randn(3, 5), m, 0.5)
    assert not adv.any() and not ret.any()
    assert not math.isnan(adv.sum().item())
