"""Dynamic sampling pinned on a real run with a critic (tiny random models, `model: random`; a fake
verifier marks about one response in thirteen correct, so about a quarter of the groups of 4 are
mixed and an iteration takes about four rounds): every extra round draws a fresh batch of prompts
(not the step's own again, not another round's, not the previous iteration's), and the logged
rollout/dynamic_* counts equal what the recorded rounds give when scored here by the verifier."""

from __future__ import annotations

import hashlib

import pytest
from wiring import probe_run

K = 4  # samples per prompt (the smoke preset's)
STEPS = 3


def rare(text: str) -> float:
    """Deterministic and rare: about one text in thirteen scores 1."""
    return float(hashlib.sha256(text.encode()).digest()[0] < 20)


class RoundRecorder:
    """Wraps module.sample: every round's (iteration, round, prompts, Experience) in call order."""

    def __init__(self):
        self.calls: list[tuple[int, int, list[str], object]] = []

    def __call__(self, module):
        sample = module.sample

        def recording_sample(problems, round_=0):
            problems = list(problems)
            exp = sample(problems, round_)
            self.calls.append((module.iteration, round_, [p.prompt for p in problems], exp))
            return exp

        module.sample = recording_sample

    def rounds(self, iteration: int) -> list:
        return [c for c in self.calls if c[0] == iteration]


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    rec = RoundRecorder()
    run = probe_run(
        tmp_path_factory.mktemp("dyn"),
        ["group_sampling", "dynamic_sampling"],
        name="dyn",
        verifier=rare,
        prepare=rec,
        steps=STEPS,
        vapo={"samples_per_prompt": K},
        precision="64-true",
    )  # float64: the same samples on any CPU
    assert run.module.critic is not None and run.module.switches.dynamic_sampling
    return run, rec


def mixed_of(exp) -> list[bool]:
    """Per group of K adjacent rows: whether the verifier scores its texts differently."""
    scores = [rare(t) for t in exp.texts]
    return [len(set(scores[g * K : (g + 1) * K])) > 1 for g in range(len(scores) // K)]


def test_every_extra_round_samples_a_fresh_prompt_batch(dynamic_run):
    run, rec = dynamic_run
    target = run.module.prompts_per_step
    extra = {}
    for it in range(STEPS):
        calls = rec.rounds(it)
        assert [c[1] for c in calls] == list(range(len(calls)))  # rounds 0, 1, ... in order
        own = calls[0][2]
        assert own == [p.prompt for p in run.probe.iterations[it].problems]  # round 0: the step's own batch
        for _, r, prompts, exp in calls[1:]:
            assert len(prompts) == target and exp.n == target * K
            assert prompts != own, f"iteration {it} round {r} samples the step's own prompts again: {prompts}"
            assert len(set(prompts) & set(own)) < target / 2, (it, r, prompts, own)
            assert [p.prompt for p in exp.problems[::K]] == prompts  # its rows are those prompts' samples
        batches = [tuple(c[2]) for c in calls[1:]]
        assert len(set(batches)) == len(batches), (
            f"iteration {it}: extra rounds repeat a prompt batch: {batches}"
        )
        extra[it] = batches
    assert max(len(b) for b in extra.values()) >= 2, "no iteration had two extra rounds: the test is weak"
    firsts = [b[0] for b in extra.values() if b]
    assert len(firsts) >= 2 and len(set(firsts)) == len(firsts), (
        f"round 1 repeats across iterations: {firsts}"
    )
    # a pure function of (seed, iteration, round): asked again, the module gives the same batch
    m = run.module
    m.iteration = 0
    try:
        assert [p.prompt for p in m.extra_prompts(1)] == list(extra[0][0])
    finally:
        m.iteration = STEPS


def test_the_logged_dynamic_counts_are_those_of_the_rounds(dynamic_run):
    """rollout/dynamic_mixed_frac = mixed groups / groups sampled over ALL rounds of the iteration
    (mixed counted here from the verifier on each round's texts), and the rounds, groups sampled,
    kept and filled counts beside it; the kept batch is the first `target` mixed groups."""
    run, rec = dynamic_run
    target = run.module.prompts_per_step
    several = overshoot = 0
    for it in range(STEPS):
        calls = rec.rounds(it)
        mixed = [m for c in calls for m in mixed_of(c[3])]
        row = run.row(it + 1)
        groups = len(mixed)
        assert row["rollout/dynamic_rounds"] == len(calls)
        assert row["rollout/dynamic_groups_sampled"] == groups == len(calls) * target
        assert row["rollout/dynamic_mixed_frac"] == pytest.approx(sum(mixed) / groups, rel=1e-12), (
            f"iteration {it}: {sum(mixed)} mixed of {groups} groups sampled in {len(calls)} rounds"
        )
        assert row["rollout/kept_groups_frac"] == pytest.approx(target / groups, rel=1e-12)
        filled = max(0, target - sum(mixed))
        assert row["rollout/dynamic_filled_groups"] == filled
        several += len(calls) >= 3
        overshoot += sum(mixed) > target  # the last round brought more mixed groups than needed
        # the batch trained on: the first `target` mixed groups in sampling order
        texts = [t for c in calls for t in c[3].texts]
        kept = [g for g, m in enumerate(mixed) if m][:target]
        if not filled:
            assert run.probe.iterations[it].exp.texts == [t for g in kept for t in texts[g * K : (g + 1) * K]]
    assert several >= 1 and overshoot >= 1, (
        several,
        overshoot,
        "the run does not exercise what this test pins",
    )
