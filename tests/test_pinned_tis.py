"""Truncated importance sampling (ppo.tis_cap) pinned on a real run without vLLM: a sampler "with
its own kernels" is simulated by offsetting the hf engine's log-probs by a fixed random amount per
token (so pi_trainer / pi_sampler spreads around 1 and the cap binds on some tokens). The trainer
recomputes the behaviour log-probs (auto-on with tis_cap), keeps the sampler's apart, and every
actor step must be the gradient of the clipped policy loss weighted per token by
min(pi_old / pi_sampler, cap), written out here by hand (the actor at the step's weights, pi_old
from a plain forward at the rollout's weights, pi_sampler what the fake sampler returned), and NOT
the unweighted one. The run is float64 (precision 64-true), as is the reference, so no sampled
token and no comparison depends on the CPU's instruction set. The logged sampler gap and TIS statistics
(otherwise checked only by the vLLM tests, where the gap is ~0 and no weight is capped) are
checked against the same reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from wiring import N, clip_coef, probe_run, ref_logprobs, with_weights

CAP = 1.3
OFFSET = 0.6  # sampler log-prob = engine log-prob + U(-OFFSET, OFFSET) per token: weights in [0.55, 1.8]
SETTINGS = {"precision": "64-true", "ppo": {"tis_cap": CAP, "ppo_epochs": 2, "actor_lr": 3e-2}}
TOL = 1e-9  # float64 run (precision 64-true) against the float64 reference: summation order only


class OffsetSampler:
    """Wraps the engine's generate: the log-probs of a training rollout (N prompts; evals have
    fewer) moved by a seeded random offset on every response token; remembers what it returned."""

    def __init__(self):
        self.returned: list[torch.Tensor] = []

    def __call__(self, module):
        generate = module.engine.generate

        def offset_generate(prompts, sampling, seeds):
            ro = generate(prompts, sampling, seeds)
            if len(prompts) != N:
                return ro
            g = torch.Generator().manual_seed(1234 + len(self.returned))
            noise = (torch.rand(ro.logprobs.shape, generator=g, dtype=torch.float64) * 2 - 1) * OFFSET
            lp = ro.logprobs + (noise * ro.response_mask.double()).to(ro.logprobs.dtype)
            self.returned.append(lp.detach().clone())
            return dataclasses.replace(ro, logprobs=lp)

        module.engine.generate = offset_generate


@pytest.fixture(scope="module")
def tis_run(tmp_path_factory):
    sampler = OffsetSampler()
    run = probe_run(
        tmp_path_factory.mktemp("tis"), ["token_level_loss"], name="tis", prepare=sampler, **SETTINGS
    )
    return run, sampler


def reference(run, sampler, step, *, weighted: bool) -> dict:
    """The token-level clipped policy loss at the step's weights, each token's term times
    min(exp(logp_old - logp_sampler), CAP) (weighted) or times 1, in float64; its clipped gradient."""
    it = run.probe.iterations[step.iteration]
    exp = it.exp
    ppo = run.cfg.ppo
    m = exp.mask.double()
    sampled = sampler.returned[step.iteration].double()[:, : m.shape[1]] * m
    with torch.no_grad():  # the behaviour policy: the actor at rollout time, by a float64 forward
        old = ref_logprobs(with_weights(run.module.actor, it.actor).double(), exp, ppo.temperature).double()
    actor = with_weights(run.module.actor, step.weights).double()
    logp = ref_logprobs(actor, exp, ppo.temperature)
    w = torch.clamp(torch.exp(old - sampled), max=CAP) if weighted else torch.ones_like(old)
    ratio = torch.exp(logp - old)
    adv = exp.advantages.double()
    eps_high = run.module.switches.eps_high if run.module.switches.clip_higher else ppo.eps
    j = torch.minimum(ratio * adv, ratio.clamp(1 - ppo.eps, 1 + eps_high) * adv)
    loss = -(w * j * m).sum() / m.sum()
    names = [n for n, _ in actor.named_parameters()]
    grads = torch.autograd.grad(loss, list(actor.parameters()), allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, actor.parameters())]
    _, coef = clip_coef(grads, ppo.grad_clip)
    valid = m.bool()
    return {
        "grads": {n: g * coef for n, g in zip(names, grads)},
        "loss": float(loss.detach()),
        "old": old,
        "sampled": sampled,
        "weights": w,
        "valid": valid,
    }


def gap(got: dict, want: dict) -> float:
    scale = max(float(t.abs().max()) for d in (got, want) for t in d.values())
    return max(float((got[n].double() - want[n].double()).abs().max()) for n in want) / scale


def test_tis_weights_every_actor_step_by_the_capped_sampler_ratio(tis_run):
    run, sampler = tis_run
    exp = run.probe.iterations[0].exp
    steps = run.probe.of("actor")
    assert len(steps) == 2 and len(sampler.returned) == 1  # 2 epochs x 1 mini-batch; one training rollout
    ref = reference(run, sampler, steps[0], weighted=True)
    valid, w = ref["valid"], ref["weights"]
    # the inputs make the test able to see the weights: spread around 1, the cap binding on some tokens
    assert 0.1 < float((w[valid] >= CAP).double().mean()) < 0.6 and float(w[valid].min()) < 0.7
    for k, s in enumerate(steps):
        weighted = reference(run, sampler, s, weighted=True)
        plain = reference(run, sampler, s, weighted=False)
        to_weighted, to_plain = gap(s.grads, weighted["grads"]), gap(s.grads, plain["grads"])
        assert to_weighted < TOL, (
            f"actor step {k}: not the gradient of the TIS-weighted loss (gap {to_weighted:.2e})"
        )
        assert to_plain > 100 * TOL, (
            f"actor step {k}: the unweighted loss gives the same step (gap {to_plain:.2e})"
        )
    # the sampler's own log-probs are kept beside the recomputed ones
    torch.testing.assert_close(
        exp.extras["sampler_logprobs"].double() * exp.mask.double(),
        ref["sampled"],
        rtol=0,
        atol=0,
        msg=lambda m: f"the sampler's log-probs are not kept in extras: {m}",
    )
    torch.testing.assert_close(
        exp.behaviour_logprobs.double() * exp.mask.double(), ref["old"], rtol=0, atol=1e-10
    )
    logged = run.row(1)
    assert logged["loss/policy"] == pytest.approx(
        sum(reference(run, sampler, s, weighted=True)["loss"] for s in steps) / 2, rel=1e-9, abs=1e-12
    )


def test_the_logged_sampler_gap_and_tis_statistics_match_the_offsets(tis_run):
    """rollout/sampler_* (|log pi_trainer - log pi_sampler| mean and max, k3 KL) and
    rollout/tis_weight_mean, rollout/tis_capped_frac over the valid tokens, from the reference."""
    run, sampler = tis_run
    it = run.probe.iterations[0]
    ref = reference(run, sampler, run.probe.of("actor")[0], weighted=True)
    valid = ref["valid"]
    d = (ref["old"] - ref["sampled"])[valid]
    w = ref["weights"][valid]
    logged = run.row(1)
    assert logged["rollout/sampler_logprob_diff_mean"] == pytest.approx(float(d.abs().mean()), rel=1e-9)
    assert logged["rollout/sampler_logprob_diff_max"] == pytest.approx(float(d.abs().max()), rel=1e-9)
    assert logged["rollout/sampler_approx_kl"] == pytest.approx(float((torch.expm1(d) - d).mean()), rel=1e-9)
    assert logged["rollout/tis_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-9)
    # a token counts as capped when its raw ratio reaches the cap (a token within rounding of the cap
    # may count either way)
    raw = torch.exp(d)
    at_least, at_most = float((raw >= CAP + 1e-9).double().mean()), float((raw > CAP - 1e-9).double().mean())
    assert at_least - 1e-12 <= logged["rollout/tis_capped_frac"] <= at_most + 1e-12, (
        f"rollout/tis_capped_frac {logged['rollout/tis_capped_frac']}: {at_least} of the tokens reach the cap"
    )
    assert 0 < logged["rollout/tis_capped_frac"] < 1 and it.exp.n == N
