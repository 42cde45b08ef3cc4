"""Paths of vapo_lit/algos that the main math tests do not take (found by `make mutate`): the
native GAE sweep split over several threads, float64 batches with a float or float32 lambda, the
paper defaults of the lambda schedule, and input checks of the critic-free baseline."""

from __future__ import annotations

import pytest
import torch

import vapo_lit.algos.advantage as adv_mod
from vapo_lit.algos import (
    _native,
    decoupled_gae,
    gae,
    group_normalized_advantage,
    lambda_clamped,
    length_adaptive_lambda,
)


def batch(B: int, T: int, seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    values = torch.randn(B, T, generator=g, dtype=dtype) * mask
    rewards = torch.zeros(B, T, dtype=dtype)
    rewards[torch.arange(B), lengths - 1] = (torch.rand(B, generator=g) < 0.5).to(dtype)
    boot = torch.randn(B, generator=g, dtype=dtype) * (torch.rand(B, generator=g) < 0.5)
    lam = torch.rand(B, generator=g, dtype=dtype)
    return rewards, values, mask, lam, boot


def loop_gae(rewards, values, mask, lam, gamma, boot):
    """Plain float64 backward loop over each row's valid (prefix) tokens."""
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        n, running, after = int(mask[b].sum()), 0.0, float(boot[b])
        lam_b = float(lam[b]) if isinstance(lam, torch.Tensor) else float(lam)
        for t in reversed(range(n)):
            v_next = float(values[b, t + 1]) if t + 1 < n else after
            running = float(rewards[b, t]) + gamma * v_next - float(values[b, t]) + gamma * lam_b * running
            adv[b, t] = running
    return adv


@pytest.fixture
def native():
    lib = _native.load()
    if lib is None:
        pytest.skip("the native GAE kernel does not build here")
    return lib


def test_native_sweep_split_over_threads_is_exact(native, monkeypatch):
    """Rows split over 3 threads (B not divisible by 3) give the single-thread result bit for bit,
    for both carries and the bootstrap, and the pool is created once and reused."""
    r, v, m, lam, boot = batch(67, 4096, seed=1)
    lam_c = torch.full((67,), 0.5)
    monkeypatch.setattr(adv_mod, "_MIN_ROWS_PER_THREAD_ELEMS", 1 << 40)
    one = adv_mod._sweep_native(native, r, v, m, boot, lam, lam_c, 0.9)
    monkeypatch.setattr(adv_mod, "_MIN_ROWS_PER_THREAD_ELEMS", 1 << 16)
    monkeypatch.setattr(adv_mod.torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(adv_mod, "_POOL", None)
    many = adv_mod._sweep_native(native, r, v, m, boot, lam, lam_c, 0.9)
    pool = adv_mod._POOL
    assert pool is not None and pool._max_workers == 3  # the split really happened
    assert all(torch.equal(x, y) for x, y in zip(many, one))
    adv_mod._sweep_native(native, r, v, m, boot, lam, lam_c, 0.9)
    assert adv_mod._POOL is pool
    rows = [0, 30, 66]  # one row from each thread's share, against the loop
    want = loop_gae(r[rows], v[rows], m[rows], lam[rows], 0.9, boot[rows])
    torch.testing.assert_close(many[0][rows].double(), want, rtol=1e-4, atol=1e-4)


def test_native_threads_report_a_bad_row_in_a_later_share(native, monkeypatch):
    r, v, m, lam, boot = batch(67, 4096, seed=2)
    r[50, -1], m[50, -1] = 1.0, 0.0  # a reward on a masked position in the third thread's rows
    monkeypatch.setattr(adv_mod.torch, "get_num_threads", lambda: 3)
    with pytest.raises(ValueError, match=r"rewards must be 0 where mask is 0.*at \[50, 4095\]"):
        gae(r, v, m, lam, bootstrap_values=boot)


@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("lam_kind", ["float", "float32 tensor"])
def test_float64_batch_with_a_float_or_float32_lambda(backend, lam_kind, monkeypatch):
    monkeypatch.setenv("VAPO_LIT_GAE_BACKEND", backend)
    if backend == "native" and _native.load() is None:
        pytest.skip("the native GAE kernel does not build here")
    r, v, m, lam, boot = batch(9, 40, seed=3, dtype=torch.float64)
    lam_p = 0.7 if lam_kind == "float" else lam.float()
    lam_c = 0.4 if lam_kind == "float" else torch.full((9,), 0.4, dtype=torch.float32)
    adv, ret = decoupled_gae(r, v, m, lam_p, lam_c, gamma=0.9, bootstrap_values=boot)
    assert adv.dtype == torch.float64
    want_a = loop_gae(r, v, m, lam_p if lam_kind == "float" else lam.float().double(), 0.9, boot)
    want_c = loop_gae(r, v, m, 0.4, 0.9, boot)
    torch.testing.assert_close(adv, want_a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret, (want_c + v) * m, rtol=1e-6, atol=1e-6)


def test_lambda_schedule_defaults_are_the_papers():
    """alpha = 0.05, gamma = 1 when not given (docs/algorithm.md: l = 20 -> 0, l = 100 -> 0.8)."""
    lam = length_adaptive_lambda(torch.tensor([20, 100, 10]))
    assert lam.dtype == torch.float32 and lam.tolist() == pytest.approx([0.0, 0.8, 0.0])
    assert length_adaptive_lambda(torch.tensor([100.0], dtype=torch.float64)).dtype == torch.float64
    assert lambda_clamped(torch.tensor([20, 100, 10])) == 1  # l = 10: 1 - 1/0.5 = -1


def test_group_baseline_checks_its_scores():
    mask = torch.ones(4, 3)
    with pytest.raises(ValueError, match=r"scores must have shape \(N,\) = \(4,\)"):
        group_normalized_advantage(torch.zeros(4, 1), mask, 2)
    with pytest.raises(ValueError, match=r"scores must have shape \(N,\) = \(4,\)"):
        group_normalized_advantage(torch.zeros(3), mask, 2)
    with pytest.raises(ValueError, match="group_size must be >= 2 and divide N = 4; got 3"):
        group_normalized_advantage(torch.zeros(4), mask, 3)
    with pytest.raises(ValueError, match="group_size must be >= 2 and divide N = 4; got 1"):
        group_normalized_advantage(torch.zeros(4), mask, 1)  # one sample: no unbiased std
