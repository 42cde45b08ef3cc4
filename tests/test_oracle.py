"""The oracle critic: true state values where one target sequence wins (vapo_lit/algos/oracle.py),
the chain task's targets and kinds, the Experience stage, GAE on oracle values and the critic's
quality against them. Each formula against a float64 loop written from its definition."""

from __future__ import annotations

import math
import random

import pytest
import torch

from vapo_lit import algos
from vapo_lit.config import RunConfig, merge, validate
from vapo_lit.experience import (
    AdvantageSettings,
    Experience,
    fill_advantages,
    fill_oracle_values,
    score,
    value_stats,
)
from vapo_lit.tasks import get_task


def random_case(rng: random.Random, n=12, vocab=4, n_kinds=3):
    """Targets, kinds and responses that follow their target for a while, then leave it or stop."""
    targets, kinds, responses = [], [], []
    for _ in range(n):
        L = rng.randint(1, 9)
        t = [rng.randrange(vocab) for _ in range(L)]
        k = [rng.randrange(n_kinds) for _ in range(L)]
        mode = rng.choice(["exact", "leave", "short", "long"])
        if mode == "exact":
            r = list(t)
        elif mode == "leave":
            j = rng.randrange(L)
            r = t[:j] + [(t[j] + 1) % vocab] + [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
        elif mode == "short":
            r = t[: rng.randrange(L)] or [(t[0] + 1) % vocab]
        else:
            r = t + [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
        targets.append(t), kinds.append(k), responses.append(r)
    return targets, kinds, responses


def padded(rows, fill):
    width = max(len(r) for r in rows)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long)


def as_tensors(targets, kinds, responses):
    return (
        padded(responses, 0),
        torch.tensor([len(r) for r in responses]),
        padded(targets, 0),
        torch.tensor([len(t) for t in targets]),
        padded(kinds, 0),
    )


def first_mismatch_loop(r, t):
    j = 0
    while j < len(r) and j < len(t) and r[j] == t[j]:
        j += 1
    return j


@pytest.mark.parametrize("seed", range(5))
def test_first_mismatch_against_a_loop(seed):
    targets, kinds, responses = random_case(random.Random(seed))
    ids, lengths, target, tlen, _ = as_tensors(targets, kinds, responses)
    got = algos.first_mismatch(ids, lengths, target, tlen).tolist()
    assert got == [first_mismatch_loop(r, t) for r, t in zip(responses, targets)]


def rates_loop(targets, kinds, responses, n_kinds, m):
    trials, errors = [0.0] * n_kinds, [0.0] * n_kinds
    for t, k, r in zip(targets, kinds, responses):
        f = first_mismatch_loop(r, t)
        for j in range(len(t)):
            if j > f or j >= len(r):
                break
            trials[k[j]] += 1
            if j == f:
                errors[k[j]] += 1
    pooled = sum(errors) / max(sum(trials), 1)
    return (
        [(e + m * pooled) / (tr + m) if tr + m > 0 else pooled for e, tr in zip(errors, trials)],
        trials,
        errors,
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("strength", [0.0, 1.0, 7.5])
def test_kind_error_rates_against_a_loop(seed, strength):
    targets, kinds, responses = random_case(random.Random(100 + seed), n=20)
    ids, lengths, target, tlen, kind = as_tensors(targets, kinds, responses)
    first = algos.first_mismatch(ids, lengths, target, tlen)
    rates, trials, errors = algos.kind_error_rates(first, lengths, kind, tlen, 3, prior_strength=strength)
    want, want_trials, want_errors = rates_loop(targets, kinds, responses, 3, strength)
    assert trials.tolist() == want_trials and errors.tolist() == want_errors
    for g, w in zip(rates.tolist(), want):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_target_success_values_against_a_loop(seed):
    rng = random.Random(200 + seed)
    targets, kinds, responses = random_case(rng, n=15)
    ids, lengths, target, tlen, kind = as_tensors(targets, kinds, responses)
    first = algos.first_mismatch(ids, lengths, target, tlen)
    rates = torch.tensor([rng.uniform(0.0, 0.5) for _ in range(3)], dtype=torch.float64)
    got = algos.target_success_values(first, lengths, kind, tlen, rates, ids.shape[1])
    assert got.dtype == torch.float64 and got.shape == ids.shape
    for i, (t, k, r) in enumerate(zip(targets, kinds, responses)):
        f = first_mismatch_loop(r, t)
        for c in range(ids.shape[1]):
            if c >= len(r) or c > f or c >= len(t):
                want = 0.0
            else:
                want = 1.0
                for j in range(c, len(t)):
                    want *= 1.0 - float(rates[k[j]])
            assert float(got[i, c]) == pytest.approx(want, rel=1e-12, abs=1e-300), (i, c)


def test_the_oracle_value_is_the_success_probability_of_a_simulated_policy():
    """A policy that leaves the target at a position of kind k with probability p_k: its measured
    rates approach p, and V*(s_0) computed from them matches how often it wins (binomial bounds,
    fixed seed, 5 sigma)."""
    g = torch.Generator().manual_seed(0)
    n, L = 40_000, 12
    kinds = torch.tensor([0, 1, 2] * 4)[None, :].expand(n, L)
    p = torch.tensor([0.02, 0.10, 0.05], dtype=torch.float64)
    target = torch.arange(L)[None, :].expand(n, L) % 5
    leave = torch.rand(n, L, generator=g, dtype=torch.float64) < p[kinds]
    first = torch.where(leave.any(1), leave.int().argmax(1), torch.full((n,), L))
    ids = torch.where(
        torch.arange(L)[None, :] == first[:, None], (target + 1) % 5, target
    )  # off-target at `first`
    lengths = torch.full((n,), L)
    tlen = torch.full((n,), L)
    got_first = algos.first_mismatch(ids, lengths, target, tlen)
    assert torch.equal(got_first, first)
    rates, trials, _ = algos.kind_error_rates(got_first, lengths, kinds, tlen, 3)
    for k in range(3):
        sd = math.sqrt(float(p[k] * (1 - p[k]) / trials[k]))
        assert abs(float(rates[k] - p[k])) < 5 * sd
    v0 = algos.target_success_values(got_first, lengths, kinds, tlen, rates, L)[:, 0]
    wins = float((first == L).double().mean())
    truth = float(torch.prod(1 - p[kinds[0]]))
    assert abs(wins - truth) < 5 * math.sqrt(truth * (1 - truth) / n)
    assert float(v0[0]) == pytest.approx(truth, abs=0.01)  # the estimate from measured rates


def test_bad_arguments_are_refused():
    first, lengths = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long)
    with pytest.raises(ValueError, match="rows"):
        algos.kind_error_rates(first, lengths, torch.zeros(3, 2, dtype=torch.long), lengths, 2)
    with pytest.raises(ValueError, match="prior_strength"):
        algos.kind_error_rates(
            first, lengths, torch.zeros(2, 2, dtype=torch.long), lengths, 2, prior_strength=-1.0
        )
    with pytest.raises(ValueError, match="targets"):
        algos.first_mismatch(
            torch.zeros(2, 3, dtype=torch.long),
            lengths,
            torch.zeros(3, 3, dtype=torch.long),
            torch.ones(3, dtype=torch.long),
        )


# ----------------------------------------------------------------------------- the chain task
@pytest.fixture(scope="module")
def longchain():
    return get_task("longchain", max_n=40)


def encode_response(task, text: str) -> list[int]:
    return task.tokenizer(text, add_special_tokens=False)["input_ids"] + [task.tokenizer.eos_token_id]


def test_chain_targets_are_the_tokenized_solution_and_its_kinds(longchain):
    problems = longchain.train_problems(6, seed=3)
    target, kinds, tlen = longchain.oracle_targets(problems)
    for i, p in enumerate(problems):
        want = encode_response(longchain, longchain.solution(p))
        assert target[i, : tlen[i]].tolist() == want and bool((target[i, tlen[i] :] == -1).all())
        n = int(p.meta["n"])
        names = [longchain.ORACLE_KINDS[k] for k in kinds[i, : tlen[i]].tolist()]
        want_names = [x for k in range(n, 0, -1) for x in ("counter", f"digit{k % 10}")] + [
            "arrow",
            "answer",
            "eos",
        ]
        assert names == want_names


def test_chain_oracle_values_follow_the_responses(longchain):
    problems = longchain.train_problems(3, seed=5)
    rows = [encode_response(longchain, longchain.solution(p)) for p in problems]
    rows[1][7] = (
        rows[1][7] + 1 if rows[1][7] + 1 < len(longchain.vocab()) else 4
    )  # a wrong token at position 7
    ids = padded(rows, longchain.tokenizer.pad_token_id)
    lengths = torch.tensor([len(r) for r in rows])
    values, rates = longchain.oracle_values(problems, ids, lengths)
    assert values[1, 8:].abs().sum() == 0 and bool((values[1, :8] > 0).all())
    assert values[0, lengths[0] :].abs().sum() == 0  # padding
    # every measured kind's rate is in (0, 1); positions before the end value their suffix
    assert all(0 < r < 1 for r in rates.values()) and set(rates) <= set(longchain.ORACLE_KINDS)
    assert bool(
        (values[0, 1 : lengths[0]] >= values[0, : lengths[0] - 1] - 1e-15).all()
    )  # fewer steps left: no lower


def test_only_the_chain_reward_has_an_oracle():
    assert get_task("longchain").has_oracle
    assert not get_task("chain").has_oracle
    assert get_task("chain", reward="chain").has_oracle
    with pytest.raises(ValueError, match="reward='chain'"):
        get_task("chain").oracle_values(
            [], torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        )


# ----------------------------------------------------------------------------- the stages
def experience_for(task, problems, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = padded(rows, task.tokenizer.pad_token_id)
    n, R = ids.shape
    lengths = torch.tensor([len(r) for r in rows])
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    exp = Experience(
        problems=problems,
        group_size=1,
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        response_ids=ids,
        mask=mask,
        behaviour_logprobs=torch.zeros(n, R),
        lengths=lengths,
        truncated=torch.zeros(n, dtype=torch.bool),
        texts=[task.tokenizer.decode(r[:-1]) for r in rows],
    )
    score(exp, task.verify_batch(problems, exp.texts))
    exp.values = torch.rand(n, R, generator=g) * mask
    exp.bootstrap = torch.zeros(n)
    return exp


def sampled_rows(task, problems, seed):
    """Solutions with a few random wrong tokens (some responses right, some wrong early or late)."""
    rng = random.Random(seed)
    rows = []
    for p in problems:
        r = encode_response(task, task.solution(p))
        if rng.random() < 0.6:
            j = rng.randrange(len(r) - 1)
            r = (
                r[:j]
                + [task.tokenizer.convert_tokens_to_ids(str(rng.randrange(10)))] * 3
                + [task.tokenizer.eos_token_id]
            )
        rows.append(r)
    return rows


def test_gae_on_oracle_values_uses_them_and_only_them(longchain):
    problems = longchain.train_problems(10, seed=9)
    exp = experience_for(longchain, problems, sampled_rows(longchain, problems, 1))
    fill_oracle_values(exp, longchain.oracle_values)
    settings = AdvantageSettings(alpha=0.5, lam_critic=1.0, whiten=False, values="oracle")
    critic_values = exp.values.clone()
    fill_advantages(exp, settings)
    lam = algos.length_adaptive_lambda(exp.mask.sum(1), 0.5, 1.0)
    want_adv, want_ret = algos.decoupled_gae(
        exp.rewards.double(),
        exp.oracle_values.double(),
        exp.mask.double(),
        lam,
        1.0,
        gamma=1.0,
        bootstrap_values=torch.zeros(exp.n, dtype=torch.float64),
    )
    torch.testing.assert_close(exp.advantages.double(), want_adv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(exp.returns.double(), want_ret, rtol=1e-5, atol=1e-6)
    assert torch.equal(
        exp.values, critic_values
    )  # the critic's own values stay (its loss and statistics read them)
    # the critic's row computes something else from the same batch
    other = experience_for(longchain, problems, sampled_rows(longchain, problems, 1))
    other.values = critic_values.clone()
    fill_advantages(other, AdvantageSettings(alpha=0.5, lam_critic=1.0, whiten=False))
    assert not torch.allclose(other.advantages, exp.advantages)


def test_oracle_advantages_without_the_stage_are_refused(longchain):
    problems = longchain.train_problems(2, seed=9)
    exp = experience_for(longchain, problems, sampled_rows(longchain, problems, 2))
    with pytest.raises(ValueError, match="oracle stage"):
        fill_advantages(exp, AdvantageSettings(values="oracle"))


def test_critic_quality_against_the_oracle(longchain):
    problems = longchain.train_problems(12, seed=11)
    exp = experience_for(longchain, problems, sampled_rows(longchain, problems, 3))
    fill_oracle_values(exp, longchain.oracle_values)
    fill_advantages(exp, AdvantageSettings(alpha=0.5, lam_critic=1.0))
    stats = value_stats(exp, reference="mc")
    v, true, g, m = (
        exp.values.double(),
        exp.oracle_values.double(),
        exp.mc_returns.double(),
        exp.mask.double(),
    )

    def ev(pred, ref):
        sel = m.bool()
        return 1 - float((ref - pred)[sel].var(unbiased=False) / ref[sel].var(unbiased=False))

    assert stats.oracle.explained_variance == pytest.approx(ev(v, true), rel=1e-5)
    assert stats.oracle.ceiling == pytest.approx(ev(true, g), rel=1e-5)
    assert stats.oracle.value_mean == pytest.approx(float(true[m.bool()].mean()), rel=1e-6)
    first = [(float(v[i, 0]) - float(true[i, 0])) ** 2 for i in range(exp.n)]
    assert stats.oracle.mse_by_position["first"] == pytest.approx(sum(first) / len(first), rel=1e-5)
    sq = [
        (float(v[i, c]) - float(g[i, c])) ** 2
        for i in range(exp.n)
        for c in range(int(exp.lengths[i]))
        if 1 <= c < 8
    ]
    assert stats.mse_by_position["1-7"] == pytest.approx(sum(sq) / len(sq), rel=1e-5)
    logged = stats.log()
    assert logged["value/explained_variance_oracle"] == stats.oracle.explained_variance
    assert any(k.startswith("oracle/error_rate_") for k in logged)


def test_settings_refuse_an_oracle_without_a_critic_or_a_task_without_one(tmp_path):
    with pytest.raises(ValueError, match="gae_values=oracle"):
        validate(
            merge(
                RunConfig(),
                {"advantage_estimator": "grpo", "components": ["group_sampling"], "gae_values": "oracle"},
            )
        )
    with pytest.raises(ValueError, match="choose one of"):
        validate(merge(RunConfig(), {"gae_values": "perfect"}))
    from vapo_lit.preflight import preflight

    with pytest.raises(ValueError, match="true state values"):
        preflight(merge(RunConfig(), {"gae_values": "oracle", "out_dir": str(tmp_path)}))
    preflight(merge(RunConfig(), {"gae_values": "oracle", "out_dir": str(tmp_path), "task": "longchain"}))


def test_the_module_hands_the_oracle_setting_to_gae_after_value_pretraining():
    from vapo_lit.build import random_tiny_policy
    from vapo_lit.models.value import ValueModel
    from vapo_lit.module import VapoModule

    for values in ("oracle", "critic"):
        cfg = merge(
            RunConfig(),
            {"task": "chain", "task_options": {"reward": "chain", "max_n": 8}, "gae_values": values},
        )
        task = get_task("chain", reward="chain", max_n=8)
        actor, tok = random_tiny_policy(task, 0)
        module = VapoModule(cfg, task, actor, tok, ValueModel.from_causal_lm(actor))
        assert module.advantage_settings(pretraining=False).values == values
        assert (
            module.advantage_settings(pretraining=True).values == "critic"
        )  # the critic pretrains on its own values
        assert module.oracle is not None  # measured in both rows: the critic's quality against the truth
    critic_free = VapoModule(cfg, task, actor, tok, None)
    assert critic_free.oracle is None
