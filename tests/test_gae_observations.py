"""GAE across observation spans (multi-turn trajectories): the three settings skip / step / zero of
`algos.decoupled_gae_observations` against plain float64 loops written from docs/algorithm.md's wording
("Multi-turn trajectories"), on random trajectories with interior observation spans, rows that end
on an observation, truncated rows with a bootstrap value, and both GAE backends."""

from __future__ import annotations

import pytest
import torch

from test_gae import backend  # noqa: F401  (the GAE backend fixture: native and torch)

from vapo_lit.algos import OBSERVATION_MODES, decoupled_gae_observations


def reference(rewards, values, action, obs, lam, gamma, bootstrap, mode):
    """float64 loops, one per setting, written independently of the project's sweep."""
    B, T = rewards.shape
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        r = [float(x) for x in rewards[b]]
        v = [float(x) for x in values[b]]
        acts = [t for t in range(T) if action[b, t] == 1]
        real = [t for t in range(T) if action[b, t] == 1 or obs[b, t] == 1]
        boot = float(bootstrap[b])
        lb = float(lam[b])
        if mode == "skip":
            # index the action tokens t_1 < t_2 < ...; delta_k = r_k + gamma V(s_{t_{k+1}}) - V(s_{t_k})
            a_next = 0.0
            for k in range(len(acts) - 1, -1, -1):
                t = acts[k]
                v_next = v[acts[k + 1]] if k + 1 < len(acts) else boot
                a_next = r[t] + gamma * v_next - v[t] + gamma * lb * a_next
                adv[b][t], ret[b][t] = a_next, a_next + v[t]
        else:
            vv = {t: (v[t] if (mode == "step" or action[b, t] == 1) else 0.0) for t in real}
            a_next = 0.0
            for i in range(len(real) - 1, -1, -1):
                t = real[i]
                v_next = vv[real[i + 1]] if i + 1 < len(real) else boot
                a_next = r[t] + gamma * v_next - vv[t] + gamma * lb * a_next
                if action[b, t] == 1:  # only action tokens carry an advantage / target
                    adv[b][t], ret[b][t] = a_next, a_next + vv[t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def random_trajectories(B, T, seed, end_on_obs_rows=(), dtype=torch.float64):
    """Alternating action / observation spans from column 0, right padding; the outcome reward
    on the last action token; a few rows end on an observation span."""
    g = torch.Generator().manual_seed(seed)
    action = torch.zeros(B, T, dtype=dtype)
    obs = torch.zeros(B, T, dtype=dtype)
    rewards = torch.zeros(B, T, dtype=dtype)
    for b in range(B):
        t, length = 0, int(torch.randint(T // 2, T + 1, (1,), generator=g))
        last_action = None
        while t < length:
            a = int(torch.randint(1, 6, (1,), generator=g))
            action[b, t : min(length, t + a)] = 1
            last_action = min(length, t + a) - 1
            t += a
            o = int(torch.randint(1, 5, (1,), generator=g))
            if t < length and (b in end_on_obs_rows or t + o < length):
                obs[b, t : min(length, t + o)] = 1
                t += o
        if b in end_on_obs_rows and obs[b, last_action + 1 :].sum() == 0 and last_action + 1 < T:
            action[b, last_action] = 0  # make room: the last real token is an observation
            obs[b, last_action] = 1
            last_action = int((action[b] * torch.arange(T, dtype=dtype)).argmax())
        rewards[b, last_action] = float(torch.randint(0, 2, (1,), generator=g))
        # a few intermediate rewards on action tokens (the recursion must carry them too)
        rewards[b] += (
            action[b]
            * (torch.rand(T, generator=g, dtype=dtype) < 0.05)
            * torch.randn(T, generator=g, dtype=dtype)
        )
    values = torch.randn(B, T, generator=g, dtype=dtype) * (action + obs)
    lam = torch.rand(B, generator=g, dtype=dtype)
    lam[0] = 0.0
    lam[1] = 1.0
    truncated = torch.rand(B, generator=g) < 0.5
    bootstrap = torch.randn(B, generator=g, dtype=dtype) * truncated
    return rewards, values, action, obs, lam, bootstrap


def ends_on_observation(action, obs, b):
    real = ((action[b] + obs[b]) > 0).nonzero()
    return bool(obs[b, int(real.max())] == 1)


@pytest.mark.parametrize("mode", OBSERVATION_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_float64_reference(backend, mode, seed, gamma, dtype):
    r, v, a, o, lam, boot = random_trajectories(12, 40, seed, end_on_obs_rows=(2, 5, 7))
    assert all(ends_on_observation(a, o, b) for b in (2, 5, 7))
    assert (o.sum(1) > 0).all() and ((o[:, 1:] - o[:, :-1]) == 1).sum() > 12  # interior spans exist
    lam_c = torch.rand(12, generator=torch.Generator().manual_seed(seed + 9), dtype=torch.float64)
    adv, ret = decoupled_gae_observations(
        r.to(dtype),
        v.to(dtype),
        a.to(dtype),
        o.to(dtype),
        lam.to(dtype),
        lam_c.to(dtype),
        gamma=gamma,
        bootstrap_values=boot.to(dtype),
        observations=mode,
    )
    ref_adv, _ = reference(r, v, a, o, lam, gamma, boot, mode)
    _, ref_ret = reference(r, v, a, o, lam_c, gamma, boot, mode)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert torch.allclose(adv.double(), ref_adv, atol=tol, rtol=0), (adv.double() - ref_adv).abs().max()
    assert torch.allclose(ret.double(), ref_ret, atol=tol, rtol=0), (ret.double() - ref_ret).abs().max()
    assert (adv[o > 0] == 0).all() and (ret[o > 0] == 0).all()  # observations carry nothing


@pytest.mark.parametrize("mode", OBSERVATION_MODES)
def test_lambda_one_gives_monte_carlo_returns(backend, mode):
    """gamma = lambda = 1: A + V = the reward-to-go (+ bootstrap) on every action token, whatever
    the observation treatment."""
    r, v, a, o, _, boot = random_trajectories(10, 32, 3, end_on_obs_rows=(1, 4))
    ones = torch.ones(10, dtype=torch.float64)
    _, ret = decoupled_gae_observations(
        r, v, a, o, ones, ones, gamma=1.0, bootstrap_values=boot, observations=mode
    )
    mc = (r.flip(1).cumsum(1).flip(1) + boot[:, None]) * a
    assert torch.allclose(ret, mc, atol=1e-12, rtol=0)


def test_skip_ignores_observation_values_and_adds_no_decay(backend):
    """skip: changing V on observation tokens changes nothing; an observation span adds no gamma*lambda
    decay (the same row with its observations cut out gives the same numbers)."""
    r, v, a, o, lam, boot = random_trajectories(8, 30, 4)
    adv, ret = decoupled_gae_observations(r, v, a, o, lam, 1.0, gamma=0.95, bootstrap_values=boot)
    v2 = v + 5.0 * o
    adv2, ret2 = decoupled_gae_observations(r, v2, a, o, lam, 1.0, gamma=0.95, bootstrap_values=boot)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    for b in range(8):
        keep = a[b] > 0
        ca, cr = decoupled_gae_observations(
            r[b : b + 1, keep],
            v[b : b + 1, keep],
            a[b : b + 1, keep],
            torch.zeros_like(a[b : b + 1, keep]),
            lam[b : b + 1],
            1.0,
            gamma=0.95,
            bootstrap_values=boot[b : b + 1],
        )
        assert torch.allclose(adv[b, keep], ca[0], atol=1e-12) and torch.allclose(
            ret[b, keep], cr[0], atol=1e-12
        )


def test_the_three_settings_differ_where_they_should(backend):
    """With gamma*lambda < 1 and nonzero values on observations the three settings give three
    different advantages (a mode silently falling back to another fails here)."""
    r, v, a, o, lam, boot = random_trajectories(8, 30, 5)
    lam = torch.full((8,), 0.9, dtype=torch.float64)
    outs = {
        m: decoupled_gae_observations(r, v, a, o, lam, 0.9, gamma=1.0, bootstrap_values=boot, observations=m)[
            0
        ]
        for m in OBSERVATION_MODES
    }
    assert not torch.allclose(outs["skip"], outs["step"])
    assert not torch.allclose(outs["step"], outs["zero"])
    assert not torch.allclose(outs["skip"], outs["zero"])


def test_without_observations_all_settings_equal_plain_gae(backend):
    r, v, a, o, lam, boot = random_trajectories(6, 20, 6)
    a = a + o  # every token an action
    o = torch.zeros_like(o)
    outs = [
        decoupled_gae_observations(r, v * a, a, o, lam, 1.0, bootstrap_values=boot, observations=m)
        for m in OBSERVATION_MODES
    ]
    for adv, ret in outs[1:]:
        assert torch.equal(adv, outs[0][0]) and torch.equal(ret, outs[0][1])


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (
            lambda kw: kw.update(observations="carry"),
            "observations='carry' is not valid; choose one of: skip, step, zero",
        ),
        (lambda kw: kw["obs_mask"].__setitem__((0, 0), 1.0), "both an action and an observation"),
        (lambda kw: kw.update(obs_mask=torch.zeros(2, 3)), "same (B, T) shape"),
        (lambda kw: kw["obs_mask"].__setitem__((1, 5), 0.5), "obs_mask must contain only 0 and 1"),
    ],
)
def test_bad_input(mutate, needle):
    action = torch.ones(2, 6)
    action[:, 3] = 0
    kw = dict(
        rewards=torch.zeros(2, 6),
        values=torch.zeros(2, 6),
        action_mask=action,
        obs_mask=(1 - action).clone(),
        lam_policy=0.9,
    )
    mutate(kw)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        decoupled_gae_observations(**kw)
