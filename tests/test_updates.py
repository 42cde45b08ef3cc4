"""The critic and actor updates of a real run are the gradients of the losses the switches select.

Each run below is a real `train()` (Lightning Trainer, component callbacks set up by the trainer)
of tiny random models with a fake verifier that marks about half of the responses correct. Its
settings make the clip bind: three PPO epochs over one mini-batch (four micro-batches) with a large
actor learning rate, so epochs 2 and 3 see ratios far from 1. Two runs also take the memory paths
(sampling in chunks of 5 responses, the log-prob pass over chunks of response positions); others
clip gradients (ppo.grad_clip 0.4), clip the critic's values (ppo.value_clip) over two critic
epochs, or recompute the behaviour log-probs with the training pass (one at T = 0.7 through the
chunked pass); one splits the rollout into two mini-batches. For every optimizer step the probe
records the weights and the (clipped) gradients; a plain reference recomputes the loss from the
recorded `Experience` at those weights, with the loss the switches ask for, and its gradient must
match. Every test also checks that the reference with the switch flipped does NOT match, so a
switch that is silently a no-op (e.g. Clip-Higher's eps_high left at eps) fails.
"""

from __future__ import annotations

import pytest
import torch
from wiring import clip_coef, probe_run, ref_logprobs, ref_values, with_weights

LOUD = {"ppo": {"ppo_epochs": 3, "actor_lr": 3e-2}}
RUNS = {
    "vanilla": ([], {}),
    "clip_higher": (["clip_higher"], {}),
    "token_level_loss": (
        ["token_level_loss"],
        {"ppo": {"logits_chunk": 5, "rollout_batch_size": 5, "grad_clip": 0.4}},
    ),
    "positive_lm_loss": (["positive_lm_loss"], {"vapo": {"mu": 0.5}, "ppo": {"recompute_logprobs": True}}),
    "positive_lm_loss_none": (["positive_lm_loss"], {"vapo": {"mu": 0.5}, "verifier": lambda text: 0.0}),
    # the no-grad chunked pass (reference and recomputed behaviour log-probs) at a temperature != 1
    "kl_penalty": (
        ["kl_penalty"],
        {
            "vapo": {"kl_coef": 0.5},
            "ppo": {"logits_chunk": 7, "temperature": 0.7, "recompute_logprobs": True},
        },
    ),
    "critic_clip": ([], {"ppo": {"critic_epochs": 2, "critic_lr": 3e-2, "value_clip": 0.05}}),
}
OTHER_RUNS = {  # runs with another number of actor steps than RUNS' three
    # two mini-batches of 8 per epoch: the batch and the mini-batch no longer coincide
    "two_minibatches": (
        ["positive_lm_loss", "token_level_loss"],
        {"vapo": {"mu": 0.5}, "ppo": {"mini_batch_size": 8}},
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            comps, delta = {**RUNS, **OTHER_RUNS}[name]
            delta = dict(delta)
            kw = {"verifier": delta.pop("verifier")} if "verifier" in delta else {}
            merged = {**LOUD, **delta, "ppo": {**LOUD["ppo"], **delta.get("ppo", {})}}
            cache[name] = probe_run(tmp_path_factory.mktemp(name), comps, name=name, **kw, **merged)
        return cache[name]

    return get


# ----------------------------------------------------------------------------- references
def actor_reference(
    run,
    step,
    *,
    eps_high: float,
    token_level: bool,
    mu: float,
    kl_coef: float = 0.0,
    grad_clip: float | None = None,
    rows: list | None = None,
    nll_over_batch: bool = False,
) -> dict:
    """The actor loss at the step's weights, from the recorded Experience, written out by hand;
    its gradient clipped to `grad_clip` (None: the run's ppo.grad_clip). Over the Experience rows
    `rows` only (a mini-batch: every denominator counts those rows; None: the whole batch);
    `nll_over_batch`: the positive NLL divided by the whole batch's positive tokens instead."""
    exp = run.probe.iterations[step.iteration].exp
    ppo = run.cfg.ppo
    actor = with_weights(run.module.actor, step.weights)
    logp = ref_logprobs(actor, exp, ppo.temperature)
    m = exp.mask
    if rows is not None:
        m = m * torch.zeros(m.shape[0], dtype=m.dtype).index_fill(0, torch.tensor(rows), 1.0)[:, None]
    ratio = torch.exp(logp - exp.behaviour_logprobs)
    adv = exp.advantages
    j = torch.minimum(ratio * adv, ratio.clamp(1 - ppo.eps, 1 + eps_high) * adv) * m
    if token_level:
        pg = -j.sum() / m.sum()
    else:
        pg = -(j.sum(1) / m.sum(1).clamp(min=1)).sum() / (m.sum(1) > 0).sum()
    loss = pg
    pos = (exp.scores > 0)[:, None] * m
    pos_den = ((exp.scores > 0)[:, None] * exp.mask).sum() if nll_over_batch else pos.sum()
    nll = torch.zeros(())
    if mu and pos.sum() > 0:  # (the NLL is logged as 0 when the component is off)
        nll = -(logp * pos).sum() / pos_den
    loss = loss + mu * nll
    if kl_coef:
        initial = with_weights(run.module.actor, run.probe.iterations[0].actor)
        with torch.no_grad():
            ref = ref_logprobs(initial, exp, ppo.temperature)
        log_ratio = ref - logp
        loss = loss + kl_coef * ((torch.expm1(log_ratio) - log_ratio) * m).sum() / m.sum()
    names = [n for n, _ in actor.named_parameters()]
    grads = torch.autograd.grad(loss, list(actor.parameters()), allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, actor.parameters())]
    norm, coef = clip_coef(grads, ppo.grad_clip if grad_clip is None else grad_clip)
    with torch.no_grad():
        r, valid = ratio.detach(), m.bool()
        log_r = (logp - exp.behaviour_logprobs).detach()
        return {
            "grads": {n: g * coef for n, g in zip(names, grads)},
            "norm": norm,
            "loss/policy": float(pg),
            "loss/nll": float(nll),
            "loss/total": float(loss),
            "policy/clipfrac_high": float(((adv > 0) & (r > 1 + eps_high))[valid].float().mean()),
            "policy/clipfrac_low": float(((adv < 0) & (r < 1 - ppo.eps))[valid].float().mean()),
            "policy/approx_kl": float((torch.expm1(log_r) - log_r)[valid].mean()),
            "policy/ratio_mean": float(r[valid].mean()),
            "policy/ratio_max": float(r[valid].max()),
        }


def critic_reference(run, step, value_clip: float | None = -1.0) -> dict:
    """0.5 (V - target)^2 over the valid tokens at the step's weights; with ppo.value_clip (or
    `value_clip` when given) PPO's pessimistic form around the values at sampling time."""
    exp = run.probe.iterations[step.iteration].exp
    clip = run.cfg.ppo.value_clip if value_clip == -1.0 else value_clip
    critic = with_weights(run.module.critic, step.weights)
    values, _ = ref_values(critic, exp)
    m = exp.mask
    err = (values - exp.returns) ** 2
    if clip is not None:
        old = exp.values.double()
        err = torch.maximum(err, (old + (values - old).clamp(-clip, clip) - exp.returns) ** 2)
    loss = 0.5 * (err * m).sum() / m.sum()
    names = [n for n, _ in critic.named_parameters()]
    grads = torch.autograd.grad(loss, list(critic.parameters()), allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, critic.parameters())]
    norm, coef = clip_coef(grads, run.cfg.ppo.grad_clip)
    return {"grads": {n: g * coef for n, g in zip(names, grads)}, "norm": norm, "loss": float(loss.detach())}


def gap(got: dict, want: dict) -> float:
    """Largest gradient difference, relative to the largest gradient of either."""
    scale = max(float(t.abs().max()) for d in (got, want) for t in d.values())
    return max(float((got[n] - want[n]).abs().max()) for n in want) / scale


TOL = 1e-4  # micro-batch accumulation and float32 reduction order


def settings_of(name: str, run) -> dict:
    sw = run.module.switches
    return {
        "eps_high": sw.eps_high if sw.clip_higher else run.cfg.ppo.eps,
        "token_level": sw.token_level_loss,
        "mu": sw.mu if sw.positive_lm_loss else 0.0,
        "kl_coef": run.cfg.vapo.kl_coef if "kl_penalty" in run.cfg.components else 0.0,
    }


# ----------------------------------------------------------------------------- the actor
@pytest.mark.parametrize("name", list(RUNS))
def test_every_actor_step_is_the_gradient_of_the_switched_loss(runs, name):
    run = runs(name)
    steps = run.probe.of("actor")
    assert len(steps) == 3  # 3 epochs x 1 mini-batch
    refs = [actor_reference(run, s, **settings_of(name, run)) for s in steps]
    for k, (s, ref) in enumerate(zip(steps, refs)):
        assert gap(s.grads, ref["grads"]) < TOL, (name, k, gap(s.grads, ref["grads"]))
    # the logged metrics are the steps' values averaged over the update (max for ratio_max)
    logged = run.row(1)
    for key in (
        "loss/policy",
        "loss/nll",
        "loss/total",
        "policy/clipfrac_high",
        "policy/clipfrac_low",
        "policy/approx_kl",
        "policy/ratio_mean",
    ):
        assert logged[key] == pytest.approx(sum(r[key] for r in refs) / 3, rel=1e-4, abs=1e-6), key
    assert logged["policy/ratio_max"] == pytest.approx(max(r["policy/ratio_max"] for r in refs), rel=1e-5)
    assert logged["policy/grad_norm"] == pytest.approx(sum(r["norm"] for r in refs) / 3, rel=1e-4)
    assert logged["policy/clipfrac_high"] > 0 and logged["policy/clipfrac_low"] > 0  # the clip binds


@pytest.mark.parametrize(
    "name,flip",
    [
        ("vanilla", {"eps_high": 0.28}),
        ("vanilla", {"token_level": True}),
        ("vanilla", {"mu": 0.5}),
        ("clip_higher", {"eps_high": 0.2}),
        ("token_level_loss", {"token_level": False}),
        ("positive_lm_loss", {"mu": 0.0}),
        ("kl_penalty", {"kl_coef": 0.0}),
    ],
)
def test_the_flipped_switch_gives_another_update(runs, name, flip):
    """So the test above can fail: with the switch flipped the reference misses some step."""
    run = runs(name)
    settings = {**settings_of(name, run), **flip}
    gaps = [gap(s.grads, actor_reference(run, s, **settings)["grads"]) for s in run.probe.of("actor")]
    assert max(gaps) > 100 * TOL, gaps


def test_clip_higher_is_set_up_by_the_trainer_and_changes_the_run(runs):
    on, off = runs("clip_higher"), runs("vanilla")
    assert on.module.switches.clip_higher and on.module.switches.eps_high == 0.28
    assert not off.module.switches.clip_higher
    # clipfrac_high counts ratios above 1 + 0.28 (not 1 + 0.2) where A > 0
    steps = on.probe.of("actor")
    high = [actor_reference(on, s, **settings_of("clip_higher", on))["policy/clipfrac_high"] for s in steps]
    sym = [
        actor_reference(on, s, eps_high=0.2, token_level=False, mu=0.0)["policy/clipfrac_high"] for s in steps
    ]
    assert on.row(1)["policy/clipfrac_high"] == pytest.approx(sum(high) / 3, rel=1e-4)
    assert sum(sym) > sum(high) * 1.2
    # the same first step (ratio 1: nothing clipped), then the runs part
    assert gap(on.probe.of("actor")[0].grads, off.probe.of("actor")[0].grads) < TOL
    assert gap(on.probe.of("actor")[2].grads, off.probe.of("actor")[2].grads) > 100 * TOL
    assert on.row(1)["loss/policy"] != off.row(1)["loss/policy"]


def test_positive_nll_is_exactly_zero_without_positives(runs):
    none = runs("positive_lm_loss_none")
    assert none.row(1)["rollout/positive_responses"] == 0
    assert none.row(1)["loss/nll"] == 0.0 and none.row(1)["loss/total"] == none.row(1)["loss/policy"]
    some = runs("positive_lm_loss")
    assert some.row(1)["rollout/positive_responses"] > 0 and some.row(1)["loss/nll"] > 0
    # mu-scaled: total = policy + mu * nll, step by step (so also on average)
    mu = some.module.switches.mu
    assert mu == 0.5
    assert some.row(1)["loss/total"] == pytest.approx(
        some.row(1)["loss/policy"] + mu * some.row(1)["loss/nll"], rel=1e-5
    )
    assert runs("vanilla").row(1)["loss/nll"] == 0.0  # off: no term although positives exist


def test_kl_penalty_pulls_towards_the_initial_policy(runs):
    run = runs("kl_penalty")
    exp = run.probe.iterations[0].exp
    initial = with_weights(run.module.actor, run.probe.iterations[0].actor)
    with torch.no_grad():
        want = ref_logprobs(initial, exp, run.cfg.ppo.temperature)
    torch.testing.assert_close(exp.extras["ref_logprobs"] * exp.mask, want * exp.mask, rtol=0, atol=1e-5)
    steps = run.probe.of("actor")
    no_kl = dict(settings_of("kl_penalty", run), kl_coef=0.0)
    # at the initial policy the KL gradient is 0; afterwards it is not
    assert gap(steps[0].grads, actor_reference(run, steps[0], **no_kl)["grads"]) < TOL
    assert run.row(1)["policy/kl_initial"] > 0


# ----------------------------------------------------------------------------- the critic
@pytest.mark.parametrize("name", ["vanilla", "clip_higher", "critic_clip"])
def test_every_critic_step_is_the_value_loss_gradient(runs, name):
    run = runs(name)
    steps = run.probe.of("critic")
    assert len(steps) == run.cfg.ppo.critic_epochs  # x 1 mini-batch
    refs = [critic_reference(run, s) for s in steps]
    for s, ref in zip(steps, refs):
        assert gap(s.grads, ref["grads"]) < TOL
    assert run.row(1)["value/loss"] == pytest.approx(sum(r["loss"] for r in refs) / len(refs), rel=1e-5)
    assert run.row(1)["value/grad_norm"] == pytest.approx(sum(r["norm"] for r in refs) / len(refs), rel=1e-4)
    # the critic was updated before the actor, from the weights it had at sampling time
    it = run.probe.iterations[0]
    assert all(torch.equal(steps[0].weights[n], it.critic[n]) for n in it.critic)
    assert [s.model for s in run.probe.steps] == ["critic"] * len(steps) + ["actor"] * 3
    assert run.module.critic_steps == len(steps) and run.module.actor_steps == 3
    assert run.probe.weight_loads == [0]  # the engine samples from the updated actor next time


def test_value_clipping_and_gradient_clipping_bind(runs):
    """So the tests above can fail: the second critic epoch moves values beyond ppo.value_clip,
    and some actor steps have gradients beyond ppo.grad_clip."""
    run = runs("critic_clip")
    second = run.probe.of("critic")[1]
    assert gap(second.grads, critic_reference(run, second, value_clip=None)["grads"]) > 100 * TOL
    run = runs("token_level_loss")
    unclipped = [
        actor_reference(run, s, **settings_of("token_level_loss", run), grad_clip=0.0)
        for s in run.probe.of("actor")
    ]
    assert any(r["norm"] > 0.4 for r in unclipped) and any(r["norm"] < 0.4 for r in unclipped)
    assert max(gap(s.grads, r["grads"]) for s, r in zip(run.probe.of("actor"), unclipped)) > 100 * TOL


@pytest.mark.parametrize("name", ["positive_lm_loss", "kl_penalty"])
def test_recomputed_behaviour_logprobs_are_the_training_pass(runs, name):
    """ppo.recompute_logprobs: the behaviour log-probs are the initial actor's own (0 on padding),
    at the run's temperature, through the plain pass and (kl_penalty: logits_chunk 7, T = 0.7) the
    no-grad chunked one."""
    run = runs(name)
    it = run.probe.iterations[0]
    with torch.no_grad():
        want = ref_logprobs(with_weights(run.module.actor, it.actor), it.exp, run.cfg.ppo.temperature)
    torch.testing.assert_close(it.exp.behaviour_logprobs, want * it.exp.mask, rtol=0, atol=1e-6)


def test_the_critic_targets_are_what_it_learns(runs):
    """A critic step towards anything but exp.returns (MC returns, advantages, the values) misses."""
    run = runs("vanilla")
    (step,) = run.probe.of("critic")
    exp = run.probe.iterations[0].exp
    saved = exp.returns
    try:
        for other in (exp.mc_returns, exp.advantages, exp.values):
            exp.returns = other
            assert gap(step.grads, critic_reference(run, step)["grads"]) > 100 * TOL
    finally:
        exp.returns = saved


# ----------------------------------------------------------------------------- MicroBatchSums
def _cut(n: int, g: torch.Generator) -> list[int]:
    """Random micro-batch boundaries of n tokens' rows (at least one row each)."""
    inner = sorted(torch.randperm(n - 1, generator=g)[:3].add(1).tolist())
    return [0, *inner, n]


def test_micro_batch_sums_are_token_weighted_whatever_the_cut():
    """Means over micro-batches weighted by their share of the mini-batch's tokens equal the float64
    token mean of each mini-batch, averaged over mini-batches, however the rows are cut; totals add
    up; peaks are maxima; declared keys come first, in order."""
    from vapo_lit.update_stats import ActorStats, MicroBatchSums

    g = torch.Generator().manual_seed(0)
    minibatches = [
        [
            torch.rand(int(n), generator=g, dtype=torch.float64)
            for n in torch.randint(1, 9, (10,), generator=g)
        ]
        for _ in range(3)
    ]  # 3 mini-batches of 10 rows, each row a few tokens' values
    want = sum(float(torch.cat(rows).mean()) for rows in minibatches) / len(minibatches)
    got = []
    for trial in range(3):
        sums = MicroBatchSums.declared(weighted=["a"], totals=["loss"], peaks=["top"])
        for rows in minibatches:
            tokens = sum(len(r) for r in rows)
            edges = _cut(len(rows), g)
            for lo, hi in zip(edges, edges[1:]):
                micro = torch.cat(rows[lo:hi])
                sums.add(
                    len(micro) / tokens,
                    weighted={"z": 1.0, "a": micro.mean()},
                    totals={"loss": micro.sum() / tokens},
                    peaks={"top": micro.max()},
                )
        means, totals, peaks = sums.reduce()
        assert list(means) == ["a", "z"] and means["z"] == pytest.approx(1.0, rel=1e-15)
        assert means["a"] == pytest.approx(want, rel=1e-13)
        assert totals["loss"] == pytest.approx(want * len(minibatches), rel=1e-13)
        assert peaks["top"] == max(float(torch.cat(rows).max()) for rows in minibatches)
        assert sums.finite()
        got.append(means["a"])
    assert max(got) - min(got) < 1e-15
    sums.add(0.5, weighted={}, totals={"loss": float("nan")}, peaks={})
    assert not sums.finite()
    assert list(ActorStats.sums().weighted) == list(ActorStats.MEANS)  # every rank reduces the same keys


# ----------------------------------------------------------------------------- several mini-batches
def test_each_minibatch_step_is_normalised_by_its_own_minibatch(runs):
    """Two mini-batches of 8 per rollout: every actor step is the gradient of the loss over its own
    rows, the token-level and the positive-NLL denominators counting that mini-batch (docs/algorithm.md: the NLL
    over the correct responses in the batch the step sees, divided by their token count); the logged
    loss/nll is the mean over the steps. The whole rollout's positive-token count as the NLL
    denominator (what one-mini-batch runs cannot tell apart) misses."""
    run = runs("two_minibatches")
    steps = run.probe.of("actor")
    assert len(steps) == 6 and all(len(s.rows) == 8 for s in steps)  # 3 epochs x 2 mini-batches
    assert sorted(steps[0].rows + steps[1].rows) == list(range(16))  # the two halves of the rollout
    exp = run.probe.iterations[0].exp
    assert all(0 < int(exp.positive[s.rows].sum()) < 8 for s in steps)  # positives in every mini-batch
    settings = settings_of("two_minibatches", run)
    refs = [actor_reference(run, s, **settings, rows=s.rows) for s in steps]
    for k, (s, ref) in enumerate(zip(steps, refs)):
        assert gap(s.grads, ref["grads"]) < TOL, (k, gap(s.grads, ref["grads"]))
    for key in ("loss/nll", "loss/policy", "loss/total"):
        assert run.row(1)[key] == pytest.approx(sum(r[key] for r in refs) / 6, rel=1e-4, abs=1e-6), key
    wrong = [
        gap(s.grads, actor_reference(run, s, **settings, rows=s.rows, nll_over_batch=True)["grads"])
        for s in steps
    ]
    assert max(wrong) > 100 * TOL, wrong
    whole = [gap(s.grads, actor_reference(run, s, **settings)["grads"]) for s in steps]
    assert max(whole) > 100 * TOL, whole


# ----------------------------------------------------------------------------- loss share by length
def test_the_loss_share_skips_a_minibatch_without_policy_gradient_weight(tmp_path):
    """GRPO with groups of 2 in four mini-batches of 4: the verifier makes every group that has a
    response in the first actor mini-batch score alike (advantage 0 on all of its rows: no
    policy-gradient weight, its share by length 0/0) and the other groups mixed. The logged
    `policy/loss_share_len_*` is the mean over the mini-batches that carry weight, recomputed from
    the recorded Experience and the rows of each optimizer step; averaging the empty mini-batch in
    would make it NaN."""
    from vapo_lit.experience import LENGTH_EDGES, bucket_labels
    from vapo_lit.rng import Stream
    from vapo_lit.tasks.base import Verdict

    group = 2

    def prepare(module):
        def verify_batch(problems, texts):  # rows in order, `group` consecutive rows per prompt
            first = set(
                next(module._minibatches(len(texts), Stream.ACTOR_MINIBATCH))[0].tolist()
            )  # the actor's first mini-batch
            flat = {i // group for i in first}
            return [Verdict(1.0 if i // group in flat or i % group == 0 else 0.0) for i in range(len(texts))]

        module.task.verify_batch = verify_batch

    run = probe_run(
        tmp_path,
        ["group_sampling"],
        verifier=None,
        prepare=prepare,
        advantage_estimator="grpo",
        vapo={"samples_per_prompt": group},
        ppo={"mini_batch_size": 4},
    )
    exp = run.probe.iterations[0].exp
    steps = run.probe.of("actor", 0)
    assert len(steps) == 4 and sorted(r for s in steps for r in s.rows) == list(range(exp.n))
    labels = bucket_labels(LENGTH_EDGES)
    lengths = [int(x) for x in exp.mask.sum(1).tolist()]
    bucket = [labels[sum(length >= e for e in LENGTH_EDGES)] for length in lengths]
    shares, empty = [], 0
    for s in steps:  # sample-level loss: w = 1 / (rows of the mini-batch * the response's length)
        mass = {b: 0.0 for b in set(bucket)}
        for i in s.rows:
            mass[bucket[i]] += sum(abs(float(exp.advantages[i, t])) for t in range(lengths[i])) / (
                len(s.rows) * lengths[i]
            )
        total = sum(mass.values())
        if total == 0:
            empty += 1
            continue
        shares.append({b: m / total for b, m in mass.items()})
    assert empty >= 1 and shares  # the run did build a mini-batch without weight, and others with
    for b in set(bucket):
        assert run.last[f"policy/loss_share_len_{b}"] == pytest.approx(
            sum(x[b] for x in shares) / len(shares), rel=1e-9, abs=1e-12
        )
