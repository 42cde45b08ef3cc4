"""The critic's replay (`ppo.critic_replay`, vapo_lit/replay.py): which batches the critic trains on,
that its steps are the gradients of the value loss over them, and that a resumed run replays what an
uninterrupted one did."""

from __future__ import annotations

import pytest
import torch
from test_module import CrashAt, _comparable, read_metrics, smoke_cfg, tiny_factory
from test_updates import TOL, gap
from wiring import N, clip_coef, coin, probe_run, ref_values, with_weights

from vapo_lit.config import RunConfig, merge, validate
from vapo_lit.experience import Experience
from vapo_lit.rng import Stream, step_seed
from vapo_lit.replay import CriticReplay
from vapo_lit.train import train

PAD = 0


def batch(n: int, prompt: int, width: int, seed: int) -> Experience:
    """n rows with prompts of up to `prompt` tokens (left-padded) and responses of up to `width`."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    prompt_len = torch.randint(1, prompt + 1, (n,), generator=g)
    prompt_len[0] = prompt
    prompt_mask = (torch.arange(prompt)[None] >= prompt - prompt_len[:, None]).long()
    return Experience(
        problems=[None] * n,
        group_size=1,
        texts=[""] * n,
        prompt_ids=torch.randint(1, 50, (n, prompt), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(1, 50, (n, width), generator=g) * mask.long(),
        mask=mask,
        lengths=lengths,
        truncated=torch.zeros(n, dtype=torch.bool),
        behaviour_logprobs=torch.randn(n, width, generator=g) * mask,
        values=torch.randn(n, width, generator=g) * mask,
        returns=torch.randn(n, width, generator=g) * mask,
        advantages=torch.randn(n, width, generator=g) * mask,
    )


def rows_of(exp: Experience) -> list[tuple]:
    """Each row as (prompt tokens, response tokens, returns, values) without padding."""
    out = []
    for i in range(exp.n):
        p, r = exp.prompt_mask[i].bool(), exp.mask[i].bool()
        out.append(
            (
                exp.prompt_ids[i][p].tolist(),
                exp.response_ids[i][r].tolist(),
                exp.returns[i][r].tolist(),
                exp.values[i][r].tolist(),
            )
        )
    return out


def test_the_replay_trains_on_the_last_batches_oldest_first_and_resumes():
    batches = [batch(3 + i, prompt=2 + i % 3, width=4 + 3 * (i % 2), seed=i) for i in range(5)]
    replay = CriticReplay(3)
    got = [replay.batch(b, PAD) for b in batches[:4]]
    assert got[0].n == 3 and rows_of(got[0]) == rows_of(batches[0])
    for t in (1, 2, 3):
        want = [row for b in batches[max(0, t - 2) : t + 1] for row in rows_of(b)]
        assert rows_of(got[t]) == want, t
    # left-padded prompts, right-padded responses: the padding is the pad id and mask 0
    last = got[3]
    assert last.prompt_ids[last.prompt_mask == 0].eq(PAD).all()
    assert last.response_ids[last.mask == 0].eq(PAD).all() and last.returns[last.mask == 0].eq(0).all()
    # a replay restored from the state of another gives the same next batch
    restored = CriticReplay(3)
    restored.load_state_dict(replay.state_dict())
    assert rows_of(restored.batch(batches[4], PAD)) == rows_of(replay.batch(batches[4], PAD))


def test_one_batch_is_the_iterations_own_and_bad_sizes_are_refused():
    b = batch(4, 3, 5, seed=0)
    assert CriticReplay(1).batch(b, PAD) is b
    with pytest.raises(ValueError, match="ppo.critic_replay=0"):
        CriticReplay(0)
    with pytest.raises(ValueError, match="resume with the same setting"):
        CriticReplay(2).load_state_dict(CriticReplay(3).state_dict())
    with pytest.raises(ValueError, match="ppo.critic_replay"):
        validate(merge(RunConfig(), {"ppo": {"critic_replay": 0}}))


def critic_replay_reference(run, step, parts: list, rows: torch.Tensor) -> dict:
    """0.5 (V - G)^2 over the valid tokens of rows `rows` of the batches `parts` stacked in order,
    at the step's weights, each batch with its own targets: written out without the project's helpers."""
    critic = with_weights(run.module.critic, step.weights)
    num, den = 0.0, 0.0
    offset = 0
    for exp in parts:
        values, _ = ref_values(critic, exp)
        mine = [r - offset for r in rows.tolist() if offset <= r < offset + exp.n]
        m = exp.mask[mine].double()
        num = num + 0.5 * (((values[mine] - exp.returns[mine].double()) ** 2) * m).sum()
        den += float(m.sum())
        offset += exp.n
    loss = num / den
    names = [n for n, _ in critic.named_parameters()]
    grads = torch.autograd.grad(loss, list(critic.parameters()), allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, critic.parameters())]
    _, coef = clip_coef(grads, run.cfg.ppo.grad_clip)
    return {n: g * coef for n, g in zip(names, grads)}


def test_each_critic_step_is_the_value_loss_over_this_batch_and_the_one_before(tmp_path):
    """Mini-batches of 8 responses: 2 critic steps an iteration; with the batch before it replayed
    each step takes 16 responses of the 32 (8 of each batch's share, in the seeded shuffle)."""
    run = probe_run(
        tmp_path, [], verifier=coin, steps=3, ppo={"critic_replay": 2, "critic_mini_batch_size": 8}
    )
    its = run.probe.iterations
    assert len(its) == 3 and not any(it.pretraining for it in its)
    for t in (0, 1, 2):
        parts = [its[0].exp] if t == 0 else [its[t - 1].exp, its[t].exp]
        n = N * len(parts)
        steps = run.probe.of("critic", t)
        assert len(steps) == 2, t  # as many steps as without replay
        perm = torch.randperm(
            n, generator=torch.Generator().manual_seed(step_seed(run.cfg.seed, t, Stream.CRITIC_MINIBATCH))
        )
        size = n // 2
        for k, step in enumerate(steps):
            rows = perm[k * size : (k + 1) * size]
            assert gap(step.grads, critic_replay_reference(run, step, parts, rows)) < TOL, (t, k)
            if t:  # the same rows of this batch alone (no replay) give another gradient
                alone = critic_replay_reference(run, step, parts[1:], rows[rows >= N] - N)
                assert gap(step.grads, alone) > 100 * TOL


def test_a_resumed_run_replays_what_the_uninterrupted_one_did(tmp_path):
    base = dict(
        components=["value_pretraining"],
        steps=4,
        eval_every=2,
        checkpoint_every=1,
        vapo={"value_pretrain_steps": 1},
        ppo={"critic_replay": 3},
    )
    train(
        smoke_cfg(tmp_path, name="full", cache_dir=str(tmp_path / "cache_full"), **base),
        module_factory=tiny_factory,
    )
    broken = smoke_cfg(tmp_path, name="broken", cache_dir=str(tmp_path / "cache_broken"), **base)
    with pytest.raises(BaseException):
        train(broken, module_factory=tiny_factory, extra_callbacks=[CrashAt(3)])
    train(broken, resume=True, module_factory=tiny_factory)
    a = _comparable(read_metrics(tmp_path / "runs" / "full"))
    b = _comparable(read_metrics(tmp_path / "runs" / "broken"))
    assert a == b and len(a) == 6
    # and the replay changed the run: without it the critic's loss differs from the second PPO iteration on
    train(
        smoke_cfg(
            tmp_path,
            name="plain",
            cache_dir=str(tmp_path / "cache_plain"),
            **{**base, "ppo": {"critic_replay": 1}},
        ),
        module_factory=tiny_factory,
    )
    c = _comparable(read_metrics(tmp_path / "runs" / "plain"))
    assert [r["value/loss"] for r in a[:3]] == [r["value/loss"] for r in c[:3]]
    assert a[3]["value/loss"] != c[3]["value/loss"]
