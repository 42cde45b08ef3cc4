"""Every component through a real `Trainer.fit` setup, and every stage as the module wires it.

Each run is a real `train()` of tiny random models (a fake verifier marks about half of the
responses correct); a probe records the Experience of every iteration, the weights at sampling
time and every optimizer step (tests/wiring.py). The tests check what a switch must change in the
data or the update, against plain recomputations: group sampling's prompt count and adjacency,
V(s_0) shared by the samples of one prompt, the values/bootstrap columns, the verdict on the last
token, the lambdas per response (length-adaptive) and per target (decoupled), value pretraining
(actor frozen, Monte-Carlo targets whatever decoupled GAE says, ending by its rule, a fresh critic
optimiser and warm-up afterwards).
The actor's and critic's gradients under each switch are in tests/test_updates.py.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from wiring import (
    N,
    adaptive_lambda,
    coin,
    positions,
    probe_run,
    ref_advantages,
    ref_logprobs,
    ref_values,
    whiten,
    with_weights,
    zero_value_head,
)

from vapo_lit.build import build_module
from vapo_lit.components import REGISTRY, Component, build_callbacks
from vapo_lit.config import ALL_COMPONENTS, COMPONENTS, ComponentValues, RunConfig, Switches, merge
from vapo_lit.experience import AdvantageSettings, LossSettings, fill_advantages, score
from vapo_lit.presets import PRESETS
from vapo_lit.pretrain import Plan

RUNS = {
    "plain": ([], {"ppo": {"lam": 0.9, "temperature": 0.8, "top_p": 0.9, "max_new_tokens": 20}}),
    "group": (
        ["group_sampling", "length_adaptive_gae"],
        {"vapo": {"samples_per_prompt": 4, "alpha": 0.1}, "truncation": "bootstrap"},
    ),
    "decoupled": (
        ["length_adaptive_gae", "decoupled_gae"],
        {"vapo": {"alpha": 0.1, "lambda_critic": 0.6}, "ppo": {"gamma": 0.9}},
    ),
    "decoupled_mc": (
        ["decoupled_gae"],
        {"vapo": {"lambda_critic": 1.0}, "ppo": {"whiten_advantages": False}},
    ),
    "pretrain": (
        ["value_pretraining"],
        {
            "vapo": {"value_pretrain_steps": 2, "value_pretrain_min_ev": 1.0},
            "steps": 2,
            "ppo": {"warmup_steps": 2},
            "prepare": zero_value_head,
        },
    ),
    # decoupled GAE asks for lambda_critic 0.5, and a warm-up longer than the phase (4 > 2 steps)
    "pretrain_decoupled": (
        ["value_pretraining", "decoupled_gae"],
        {
            "vapo": {"value_pretrain_steps": 2, "value_pretrain_min_ev": None, "lambda_critic": 0.5},
            "steps": 3,
            "ppo": {"warmup_steps": 4},
        },
    ),
    "all": (
        list(ALL_COMPONENTS),
        {
            "vapo": {
                "value_pretrain_steps": 1,
                "samples_per_prompt": 4,
                "alpha": 0.2,
                "lambda_critic": 0.9,
                "eps_high": 0.3,
                "mu": 0.2,
                "kl_coef": 0.1,
            }
        },
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(name, components=None, **delta):
        if name not in cache:
            comps, base = RUNS.get(name, (components, {}))
            cache[name] = probe_run(tmp_path_factory.mktemp(name), comps, name=name, **{**base, **delta})
        return cache[name]

    return get


def first(run):
    """The first iteration's Experience."""
    return run.probe.iterations[0].exp


# ----------------------------------------------------------------------------- group sampling
def test_group_sampling_prompt_count_and_adjacency(runs):
    g, plain = runs("group"), runs("plain")
    it, exp = g.probe.iterations[0], first(g)
    assert g.module.switches.group_sampling and g.module.switches.samples_per_prompt == 4
    assert len(it.problems) == N // 4 and exp.group_size == 4
    assert exp.problems == [p for p in it.problems for _ in range(4)]  # the samples of a prompt are adjacent
    assert len({p.prompt for p in it.problems}) > 1
    assert all(
        len(set(exp.texts[j : j + 4])) > 1 for j in range(0, N, 4)
    )  # four draws, not one draw four times
    assert g.row(1)["rollout/prompts"] == 4 and g.row(1)["rollout/samples_per_prompt"] == 4
    groups = exp.scores.view(-1, 4)
    mixed = float(((groups.max(1).values > 0) & (groups.min(1).values == 0)).float().mean())
    assert g.row(1)["rollout/mixed_groups_frac"] == pytest.approx(mixed)
    # off: one sample per prompt
    assert len(plain.probe.iterations[0].problems) == N and first(plain).group_size == 1
    assert first(plain).problems == plain.probe.iterations[0].problems
    assert plain.row(1)["rollout/prompts"] == N and "rollout/mixed_groups_frac" not in plain.row(1)


def test_samples_of_one_prompt_share_the_value_of_the_prompt_state(runs):
    exp = first(runs("group"))
    v0 = exp.values[:, 0].view(-1, 4)
    torch.testing.assert_close(v0, v0[:, :1].expand_as(v0), rtol=0, atol=1e-6)
    starts = exp.response_ids[:, 0].view(-1, 4)
    assert any(len(set(row.tolist())) > 1 for row in starts)  # (else a one-column shift could hide)


# ----------------------------------------------------------------------------- score and values
@pytest.mark.parametrize("name", ["plain", "group"])
def test_values_stage_reads_the_critic_at_sampling_time(runs, name):
    run = runs(name)
    it, exp = run.probe.iterations[0], first(run)
    with torch.no_grad():
        values, after = ref_values(with_weights(run.module.critic, it.critic), exp)
    torch.testing.assert_close(exp.values, values.to(exp.values.dtype) * exp.mask, rtol=1e-5, atol=1e-6)
    assert bool(exp.truncated.any()) and not bool(exp.truncated.all())
    if run.cfg.truncation == "bootstrap":  # V(s_l) for the rows the length limit cut, 0 for the rest
        want = torch.where(exp.truncated, after, torch.zeros_like(after)).to(exp.bootstrap.dtype)
        torch.testing.assert_close(exp.bootstrap, want, rtol=1e-5, atol=1e-6)
    else:
        assert not bool(exp.bootstrap.any())


def test_score_stage_puts_the_verdict_on_the_last_token(runs):
    run = runs("plain")
    exp = first(run)
    outcome = [coin(t) for t in exp.texts]
    assert exp.scores.tolist() == outcome and 0 < sum(outcome) < N
    want = torch.zeros_like(exp.mask)
    for i, length in enumerate(exp.lengths.tolist()):
        want[i, length - 1] = outcome[i]
    assert torch.equal(exp.rewards, want)
    assert torch.equal(exp.lengths, exp.mask.sum(1).long())
    assert run.row(1)["objective/score"] == pytest.approx(sum(outcome) / N)
    assert run.row(1)["rollout/positive_responses"] == sum(outcome)
    assert run.row(1)["rollout/positive_tokens"] == sum(l for l, o in zip(exp.lengths.tolist(), outcome) if o)


def test_sampling_settings_reach_the_engine(runs):
    """ppo.temperature, ppo.top_p and ppo.max_new_tokens: the behaviour log-probs are those of the
    tempered policy, every sampled token lies in its nucleus, no response outgrows the limit."""
    run = runs("plain")
    it, exp = run.probe.iterations[0], first(run)
    T, top_p, limit = run.cfg.ppo.temperature, run.cfg.ppo.top_p, run.cfg.ppo.max_new_tokens
    assert (T, top_p, limit) == (0.8, 0.9, 20)
    actor = with_weights(run.module.actor, it.actor)
    with torch.no_grad():
        want = ref_logprobs(actor, exp, T)
        logits = (
            actor(
                input_ids=exp.input_ids,
                attention_mask=exp.attention_mask,
                position_ids=positions(exp.attention_mask),
            ).logits[:, exp.prompt_width - 1 : -1]
            / T
        )
    torch.testing.assert_close(exp.behaviour_logprobs, want.float() * exp.mask, rtol=0, atol=2e-5)
    probs = torch.softmax(logits.double(), -1)
    chosen = probs.gather(-1, exp.response_ids[..., None]).squeeze(-1)
    mass_above = (probs * (probs > chosen[..., None])).sum(
        -1
    )  # of the tokens more likely than the chosen one
    assert bool((mass_above[exp.mask.bool()] < top_p + 1e-6).all())
    assert exp.mask.shape[1] <= limit and bool(exp.truncated.any())
    assert torch.equal(exp.lengths[exp.truncated], torch.full_like(exp.lengths[exp.truncated], limit))
    assert bool((exp.lengths[~exp.truncated] <= limit).all())


# ----------------------------------------------------------------------------- advantages
LAMBDAS = {  # run -> (the actor's lambda per response length l, the critic targets' lambda, gamma, whitened)
    "plain": (lambda l: 0.9, None, 1.0, True),
    "group": (lambda l: adaptive_lambda(l, 0.1), None, 1.0, True),
    "decoupled": (lambda l: adaptive_lambda(l, 0.1, 0.9), 0.6, 0.9, True),
    "decoupled_mc": (lambda l: 0.95, 1.0, 1.0, False),
}


@pytest.mark.parametrize("name", list(LAMBDAS))
def test_advantages_and_targets_use_the_switched_lambdas(runs, name):
    """ppo.lam, ppo.gamma, ppo.whiten_advantages and the two components' values all reach the
    advantages stage: every run differs from the paper defaults in one of them."""
    run = runs(name)
    exp = first(run)
    policy, critic, gamma, whitened = LAMBDAS[name]
    lam = [policy(int(l)) for l in exp.lengths.tolist()]
    assert exp.lam_policy.tolist() == pytest.approx(lam, abs=1e-6)
    if name in ("group", "decoupled"):
        assert len(set(round(x, 6) for x in lam)) > 3 and min(lam) == 0.0  # per response, some clamped
    actor = ref_advantages(exp, lam, gamma)
    actor = whiten(actor, exp.mask) if whitened else actor
    torch.testing.assert_close(exp.advantages.double(), actor, rtol=1e-4, atol=1e-4)
    lam_c = lam if critic is None else [critic] * N  # off: one lambda (the policy's) for both
    targets = exp.values.double() + ref_advantages(exp, lam_c, gamma)
    torch.testing.assert_close(exp.returns.double(), targets * exp.mask, rtol=1e-5, atol=1e-5)
    mc = exp.values.double() + ref_advantages(exp, [1.0] * N, gamma)
    torch.testing.assert_close(exp.mc_returns.double(), mc * exp.mask, rtol=1e-5, atol=1e-5)
    row = run.row(1)
    assert row["gae/lambda_policy_mean"] == pytest.approx(sum(lam) / N, abs=1e-6)
    assert (row["gae/lambda_policy_min"], row["gae/lambda_policy_max"]) == pytest.approx(
        (min(lam), max(lam)), abs=1e-6
    )
    raw = [(1 - 1 / (0.1 * l)) / gamma for l in exp.lengths.tolist()]
    clamped = sum(1 for r in raw if not 0 <= r <= 1) if name in ("group", "decoupled") else 0
    assert row["gae/lambda_policy_clamped"] == clamped


def test_monte_carlo_critic_targets_are_the_outcome(runs):
    """decoupled_gae with lambda_critic = 1, gamma = 1, terminal rows: every valid token's target is
    the outcome; the actor keeps its own lambda (0.95); with one lambda the targets differ."""
    exp = first(runs("decoupled_mc"))
    outcome = exp.scores[:, None] * exp.mask
    torch.testing.assert_close(exp.returns.float(), outcome, rtol=0, atol=1e-5)
    coupled = first(runs("plain"))
    assert not torch.allclose(coupled.returns.float(), coupled.scores[:, None] * coupled.mask, atol=1e-2)


# ----------------------------------------------------------------------------- value pretraining
def test_value_pretraining_trains_the_critic_alone_on_monte_carlo_targets(runs):
    run = runs("pretrain")
    its = run.probe.iterations
    assert [it.pretraining for it in its] == [True, True, False, False]
    for it in its[:2]:  # lambda = 1 although decoupled_gae is off (ppo.lam = 0.95)
        outcome = it.exp.scores[:, None] * it.exp.mask
        torch.testing.assert_close(it.exp.returns.float(), outcome, rtol=0, atol=1e-5)
    assert not torch.allclose(
        its[2].exp.returns.float(), its[2].exp.scores[:, None] * its[2].exp.mask, atol=1e-2
    )
    assert sorted({s.iteration for s in run.probe.of("actor")}) == [2, 3]  # no actor step while pretraining
    assert sorted(s.iteration for s in run.probe.of("critic")) == [0, 1, 2, 3]
    assert all(torch.equal(its[2].actor[n], its[0].actor[n]) for n in its[0].actor)  # bit-identical
    assert any(not torch.equal(its[2].critic[n], its[0].critic[n]) for n in its[0].critic)
    rows = [run.row(i) for i in (1, 2, 3, 4)]
    assert [r["train/value_pretraining"] for r in rows] == [1.0, 1.0, 0.0, 0.0]
    assert [r["train/ppo_update"] for r in rows] == [0, 0, 1, 2]
    assert (
        rows[2]["value_pretrain/steps"] == 2
        and rows[2]["value_pretrain/final_ev"] == rows[1]["value/explained_variance"]
    )
    assert run.module.pretrain.finished and not run.module.pretrain.active
    assert run.probe.weight_loads == [2, 3]  # the engine gets the actor after each actor update, only then
    assert (run.module.actor_steps, run.module.critic_steps) == (2, 4)


def test_after_value_pretraining_the_critic_optimiser_starts_afresh(runs):
    """Warm-up (2 steps) restarts and Adam's moments are cleared: the first PPO critic step is a
    first Adam step, -lr * g / (|g| + eps) for every weight."""
    run = runs("pretrain")
    lr_c, lr_a = run.cfg.ppo.critic_lr, run.cfg.ppo.actor_lr
    assert [s.lr for s in run.probe.of("critic")] == pytest.approx([lr_c / 2, lr_c, lr_c / 2, lr_c])
    assert [s.lr for s in run.probe.of("actor")] == pytest.approx([lr_a / 2, lr_a])
    (step,) = run.probe.of("critic", 2)
    after = run.probe.iterations[3].critic
    for n, g in step.grads.items():
        want = -step.lr * g / (g.abs() + 1e-8)
        torch.testing.assert_close(after[n] - step.weights[n], want, rtol=1e-3, atol=1e-7)


def test_value_pretraining_targets_are_monte_carlo_whatever_decoupled_gae_says(runs):
    """decoupled_gae on with lambda_critic 0.5: while the critic is pretrained its targets are the
    Monte-Carlo returns (lambda = 1, docs/algorithm.md); from the first PPO iteration on, V + A(0.5)."""
    run = runs("pretrain_decoupled")
    its = run.probe.iterations
    assert [it.pretraining for it in its] == [True, True, False, False, False]
    for k, it in enumerate(its):
        exp = it.exp
        mc = (exp.values.double() + ref_advantages(exp, [1.0] * N)) * exp.mask
        decoupled = (exp.values.double() + ref_advantages(exp, [0.5] * N)) * exp.mask
        assert (mc - decoupled).abs().max() > 1e-2  # the two targets differ: the check below can fail
        want = mc if it.pretraining else decoupled
        torch.testing.assert_close(exp.returns.double(), want, rtol=1e-5, atol=1e-5, msg=f"iteration {k}")
        torch.testing.assert_close(exp.mc_returns.double(), mc, rtol=1e-5, atol=1e-5)
    for i in (1, 2):  # logged: the critic against its own targets is the critic against MC returns
        assert run.row(i)["value/explained_variance_target"] == pytest.approx(
            run.row(i)["value/explained_variance"]
        )


def test_after_value_pretraining_a_long_warmup_starts_over(runs):
    """A warm-up of 4 steps and 2 pretraining steps: the critic's PPO phase restarts the schedule at
    1/4 of its learning rate and climbs again (a schedule carried on from the phase would jump to
    the full rate at the second PPO step; with a warm-up <= 2 steps both look the same); the actor's
    schedule starts with its first update; Adam's moments are cleared."""
    run = runs("pretrain_decoupled")
    lr_c, lr_a = run.cfg.ppo.critic_lr, run.cfg.ppo.actor_lr
    assert [s.lr for s in run.probe.of("critic")] == pytest.approx(
        [lr_c / 4, lr_c / 2, lr_c / 4, lr_c / 2, 3 * lr_c / 4]
    )
    assert [s.lr for s in run.probe.of("actor")] == pytest.approx([lr_a / 4, lr_a / 2, 3 * lr_a / 4])
    # logged after each iteration's updates (before the phase ends): the rate of the next critic step
    assert [run.row(i)["train/critic_lr"] for i in (1, 2, 3, 4, 5)] == pytest.approx(
        [lr_c / 2, 3 * lr_c / 4, lr_c / 2, 3 * lr_c / 4, lr_c]
    )
    (step,) = run.probe.of("critic", 2)
    after = run.probe.iterations[3].critic
    for n, g in step.grads.items():  # a first Adam step: -lr * g / (|g| + eps)
        torch.testing.assert_close(
            after[n] - step.weights[n], -step.lr * g / (g.abs() + 1e-8), rtol=1e-3, atol=1e-7
        )


def test_value_pretraining_ends_by_its_rule(runs):
    """Whichever comes first: the step budget (the 'pretrain' run: target 1.0 never reached, two of
    two steps) or the explained-variance target. The critic starts at V = 0, so the first batch's
    explained variance is exactly 0: with target 0 pretraining stops after one of four steps."""
    pre = runs("pretrain")
    assert pre.row(1)["value/explained_variance"] == 0.0
    assert max(pre.row(i)["value/explained_variance"] for i in (1, 2)) < 1.0
    assert [it.pretraining for it in pre.probe.iterations][:3] == [True, True, False]
    run = runs(
        "pretrain_ev",
        ["value_pretraining"],
        prepare=zero_value_head,
        vapo={"value_pretrain_steps": 4, "value_pretrain_min_ev": 0.0},
    )
    assert [it.pretraining for it in run.probe.iterations] == [True, False]
    assert run.row(2)["value_pretrain/steps"] == 1 and run.row(2)["value_pretrain/final_ev"] == 0.0


@pytest.mark.parametrize(
    "steps_done,ev,target,budget,end",
    [
        (1, 0.5, None, 2, False),
        (2, float("nan"), None, 2, True),
        (3, -5.0, 0.2, 4, False),
        (1, 0.2, 0.2, 4, True),
        (1, 0.1999, 0.2, 4, False),
        (1, float("nan"), 0.2, 4, False),
        (4, float("nan"), 0.2, 4, True),
    ],
)
def test_value_pretraining_stopping_rule(steps_done, ev, target, budget, end):
    rule = REGISTRY["value_pretraining"](value_pretrain_steps=budget, value_pretrain_min_ev=target)
    assert rule.should_end(steps_done, ev) is end


def test_value_pretraining_target_reads_the_median_of_the_last_window_iterations():
    """With a window of w, the target is checked against the median explained variance of the last w
    iterations that have one (NaN until w iterations have run): one lucky batch does not end it."""
    from vapo_lit.pretrain import PretrainPhase

    phase = PretrainPhase(active=True)
    for ev in (0.1, float("nan"), 0.5, 0.3):
        phase.record(ev)
    assert math.isnan(phase.recent_ev_median(5)) and phase.recent_ev_median(1) == 0.3
    phase.record(0.9)
    assert phase.last_ev == 0.9 and phase.recent_ev_median(5) == 0.4  # median of 0.1, 0.5, 0.3, 0.9
    assert phase.recent_ev_median(3) == 0.5
    restored = PretrainPhase()
    restored.load_state_dict(phase.state_dict())
    assert restored.recent_ev_median(5) == 0.4
    for _ in range(95):  # the whole history is kept: a long window is reachable
        phase.record(0.6)
    assert phase.recent_ev_median(100) == 0.6 and math.isnan(phase.recent_ev_median(101))
    rule = REGISTRY["value_pretraining"](
        value_pretrain_steps=50, value_pretrain_min_ev=0.35, value_pretrain_ev_window=5
    )

    class Module:
        pretrain = PretrainPhase(active=True, steps_done=5, recent_ev=[0.1, 0.2, 0.9, 0.3, 0.2])
        ended = False

        def end_value_pretraining(self):
            self.ended = True

    m = Module()
    rule.on_train_batch_end(None, m, None, None, 0)
    assert not m.ended  # one batch at 0.9, median 0.2
    m.pretrain.recent_ev = [0.4, 0.2, 0.9, 0.36, 0.5]
    rule.on_train_batch_end(None, m, None, None, 0)
    assert m.ended  # median 0.4


# ----------------------------------------------------------------------------- every switch, set by the trainer
def test_every_component_sets_its_switches_in_trainer_setup(runs):
    run = runs("all")
    sw, values = run.module.switches, run.cfg.vapo
    for name in COMPONENTS:
        assert getattr(sw, name) is True, name
    for key in (
        "value_pretrain_steps",
        "value_pretrain_min_ev",
        "lambda_critic",
        "alpha",
        "eps_high",
        "mu",
        "samples_per_prompt",
        "kl_coef",
    ):
        assert getattr(sw, key) == getattr(values, key), key
    assert sorted(c.name for c in run.module.components) == sorted(ALL_COMPONENTS)  # every one joined, once
    assert [it.pretraining for it in run.probe.iterations] == [True, False]
    assert run.probe.iterations[0].exp.extras == {}  # no iteration hooks while the critic is pretrained
    exp = run.probe.iterations[1].exp
    assert exp.group_size == 4 and "ref_logprobs" in exp.extras
    assert exp.lam_policy.tolist() == pytest.approx(
        [adaptive_lambda(int(l), 0.2) for l in exp.lengths.tolist()], abs=1e-6
    )
    assert "policy/kl_initial" in run.row(2) and run.row(2)["loss/nll"] > 0


def _trainer_setup(tmp_path, callback, **delta):
    cfg = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random", "out_dir": str(tmp_path), **delta})
    module = build_module(cfg)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=-1,
        logger=False,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)


def test_component_checks_run_in_trainer_setup(tmp_path):
    """The callbacks validate against the module's settings before any iteration."""
    with pytest.raises(ValueError, match=r"samples_per_prompt=3 must divide ppo.responses_per_step=16"):
        _trainer_setup(tmp_path, REGISTRY["group_sampling"](samples_per_prompt=3))
    with pytest.raises(ValueError, match=r"eps_high=0.25 is below eps_low=ppo.eps=0.3"):
        _trainer_setup(tmp_path, REGISTRY["clip_higher"](eps_high=0.25), ppo={"eps": 0.3})


def test_one_rule_one_place_config_and_callback_ask_the_same_check(tmp_path, monkeypatch):
    """config.validate and the callback's setup both ask config.COMPONENT_CHECKS: the same
    message from each, and a changed rule changes both (no second copy of eps_high >= eps)."""
    from vapo_lit import config

    cfg = merge(RunConfig(), {"components": ["clip_higher"], "ppo": {"eps": 0.3}, "vapo": {"eps_high": 0.25}})
    with pytest.raises(
        ValueError, match=r"^vapo\.eps_high=0.25 is below eps_low=ppo.eps=0.3; valid: eps_high >= eps_low$"
    ):
        config.validate(cfg)
    with pytest.raises(ValueError, match=r"^clip_higher\.eps_high=0.25 is below eps_low=ppo.eps=0.3; valid"):
        REGISTRY["clip_higher"](eps_high=0.25).check(
            build_module(
                merge(
                    merge(RunConfig(), PRESETS["smoke"]),
                    {"model": "random", "out_dir": str(tmp_path), "ppo": {"eps": 0.3}},
                )
            )
        )
    monkeypatch.setitem(config.COMPONENT_CHECKS, "clip_higher", lambda values, c: "eps_high=changed rule")
    ok = merge(RunConfig(), {"components": ["clip_higher"]})
    with pytest.raises(ValueError, match="vapo.eps_high=changed rule"):
        config.validate(ok)
    with pytest.raises(ValueError, match="clip_higher.eps_high=changed rule"):
        REGISTRY["clip_higher"]().check(
            build_module(
                merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random", "out_dir": str(tmp_path)})
            )
        )
    config.validate(
        merge(RunConfig(), {"components": [], "ppo": {"eps": 0.3}, "vapo": {"eps_high": 0.25}})
    )  # off: no rule


def test_a_component_joins_the_module_once(tmp_path):
    """Every component joins module.components in its setup (its hooks are called from then on),
    once however often Lightning runs the setup, and records itself in the switches."""
    cfg = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random", "out_dir": str(tmp_path)})
    module = build_module(cfg)
    assert module.components == [] and module.samples_per_prompt == 1
    kl, clip = REGISTRY["kl_penalty"](), REGISTRY["clip_higher"](eps_high=0.3)
    for _ in range(2):
        kl.setup(None, module, "fit")
        clip.setup(None, module, "fit")
    assert module.components == [kl, clip]
    assert module.loss_settings == LossSettings(eps_low=cfg.ppo.eps, eps_high=0.3)
    assert module.switches.clip_higher and module.switches.kl_coef == kl.values["kl_coef"]


# ----------------------------------------------------------------------------- each component holds its behaviour
HOOK_VALUES = ComponentValues(
    alpha=0.7,
    lambda_critic=0.9,
    eps_high=0.33,
    mu=0.3,
    samples_per_prompt=4,
    value_pretrain_steps=7,
    value_pretrain_min_ev=0.2,
    value_pretrain_ev_window=3,
    value_pretrain_critic_lr=1e-3,
    value_pretrain_critic_epochs=2,
    kl_coef=0.2,
    dynamic_max_rounds=5,
)
CHANGES = {  # component -> what its hooks change of vanilla PPO's settings, and the iteration hooks it has
    "value_pretraining": {"before_ppo": Plan(7, 0.2, 3, 1e-3, 2)},
    "decoupled_gae": {"advantage_settings": {"lam_critic": 0.9}},
    "length_adaptive_gae": {"advantage_settings": {"alpha": 0.7}},
    "token_level_loss": {"loss_settings": {"aggregation": "token"}},
    "clip_higher": {"loss_settings": {"eps_high": 0.33}},
    "positive_lm_loss": {"loss_settings": {"mu": 0.3}},
    "group_sampling": {"samples_per_prompt": 4},
    "kl_penalty": {"iteration": ["on_experience", "loss_term"]},
    "dynamic_sampling": {"iteration": ["on_rollout"]},
}


def _changes(c) -> dict:
    """What component `c`'s hooks change of vanilla PPO's settings (field -> value), and which
    iteration hooks it overrides."""

    def diff(new, old):
        return {
            f.name: getattr(new, f.name)
            for f in dataclasses.fields(old)
            if getattr(new, f.name) != getattr(old, f.name)
        }

    out = {
        "advantage_settings": diff(c.advantage_settings(AdvantageSettings()), AdvantageSettings()),
        "loss_settings": diff(c.loss_settings(LossSettings()), LossSettings()),
        "samples_per_prompt": c.samples_per_prompt(1),
        "before_ppo": c.before_ppo(None),
        "iteration": [
            h
            for h in ("on_rollout", "on_experience", "loss_term")
            if getattr(type(c), h) is not getattr(Component, h)
        ],
    }
    vanilla = {
        "advantage_settings": {},
        "loss_settings": {},
        "samples_per_prompt": 1,
        "before_ppo": None,
        "iteration": [],
    }
    return {k: v for k, v in out.items() if v != vanilla[k]}


@pytest.mark.parametrize("name", ALL_COMPONENTS)
def test_each_component_changes_what_its_hooks_declare_and_nothing_else(name):
    """Every registered component, through its own hooks only: a new one needs its line here."""
    (c,) = build_callbacks([name], HOOK_VALUES)
    assert _changes(c) == CHANGES[name]


def test_the_components_hooks_fold_in_any_order(tmp_path):
    """The module folds every component's hooks over vanilla PPO's settings; each touches its own
    fields, so the order of the callbacks does not matter."""
    cfg = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random", "out_dir": str(tmp_path)})
    module = build_module(cfg)
    settings = []
    for names in (ALL_COMPONENTS, ALL_COMPONENTS[::-1]):
        module.components = build_callbacks(names, HOOK_VALUES)
        settings.append(
            (
                module.samples_per_prompt,
                module.advantage_settings(False),
                module.advantage_settings(True),
                module.loss_settings,
                module.pretrain_plan,
                module.critic_schedule(True),
            )
        )
    assert settings[0] == settings[1]
    k, adv, warm, loss, plan, critic = settings[0]
    assert (k, adv.lam_critic, adv.alpha, warm.lam_critic, warm.alpha) == (4, 0.9, 0.7, 1.0, 0.7)
    assert loss == LossSettings(eps_low=cfg.ppo.eps, eps_high=0.33, aggregation="token", mu=0.3)
    assert plan == CHANGES["value_pretraining"]["before_ppo"] and critic == (1e-3, 2)


MODULE = Path(__file__).resolve().parents[1] / "vapo_lit" / "module.py"


def component_references(source: str) -> list[str]:
    """Where `source` names a component: a string equal to a component's name, or an attribute or
    name equal to one of the `Switches` booleans (each component's on/off switch), with its line."""
    switches = {f.name for f in dataclasses.fields(Switches) if f.type in (bool, "bool")}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ALL_COMPONENTS:
            found.append((node.lineno, node.col_offset, repr(node.value)))
        elif isinstance(node, ast.Attribute) and node.attr in switches:
            found.append((node.lineno, node.col_offset, f".{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in switches:
            found.append((node.lineno, node.col_offset, node.id))
    return [f"line {line}: {what}" for line, _, what in sorted(found)]


def test_the_module_never_asks_which_component_is_on():
    """module.py reads no component's switch and compares no component's name: what a component
    changes it says through its hooks (components/base.py), in its own file."""
    found = component_references(MODULE.read_text())
    assert not found, f"module.py asks which component is on (give the component a hook instead): {found}"


def test_the_module_check_sees_a_switch_or_a_name():
    """The check above can fail: what module.py did before the hooks (read a switch, compare a name)."""
    old = (
        "eps_high = sw.eps_high if sw.clip_higher else p.eps\n"
        'if "value_pretraining" in self.cfg.components and getattr(sw, "group_sampling"):\n    pass\n'
    )
    assert component_references(old) == [
        "line 1: .clip_higher",
        "line 2: 'value_pretraining'",
        "line 2: 'group_sampling'",
    ]


# ----------------------------------------------------------------------------- the docs' worked example
def test_the_docs_worked_example_is_one_file_and_runs_as_written(tmp_path, monkeypatch):
    """docs/guides/extending.md's component file and its test, written out and run: the test passes,
    the component joins a module like any other, and the iteration's advantages use lambda_policy = 1."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "extending.md").read_text()
    for name in ("mc_policy.py", "test_mc_policy.py"):
        start = text.index(f"```python\n# {name}\n") + len("```python\n")
        (tmp_path / name).write_text(text[start : text.index("```", start)])
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mc_policy", "test_mc_policy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("test_mc_policy").test_mc_policy_gives_the_actor_monte_carlo_advantages()
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]), {"model": "random", "out_dir": str(tmp_path), "components": []}
    )
    module = build_module(cfg)
    importlib.import_module("mc_policy").MCPolicy().setup(None, module, "fit")
    exp = module.rollout(module.task.train_problems(module.prompts_per_step, 0))
    score(exp, module.task.verify_batch(exp.problems, exp.texts))
    exp, _ = module.values(exp)
    fill_advantages(exp, module.advantage_settings(pretraining=False))
    assert exp.lam_policy.tolist() == [1.0] * exp.n and module.loss_settings == LossSettings(
        cfg.ppo.eps, cfg.ppo.eps
    )
