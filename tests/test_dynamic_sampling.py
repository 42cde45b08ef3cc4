"""DAPO's dynamic sampling (the optional `dynamic_sampling` component): the group filter and the
round loop against a plain reference of DAPO's procedure on random group scores; the pool of rounds
keeps every row; real runs (the golden tiny SFT'd float64 policy) train on mixed groups only, count
every sampled token, equal the switch-off run when one round is allowed, and resume to the same
history; the rule that it needs group_sampling; two data-parallel processes equal one (slow)."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from golden import CONFIG
from golden import factory as golden_factory
from lightning.pytorch.callbacks import Callback

from vapo_lit import group_filter
from vapo_lit.config import COMPONENTS, RunConfig, merge, validate
from vapo_lit.train import train

GRPO = ["token_level_loss", "clip_higher", "group_sampling"]


# ----------------------------------------------------------------------------- the pure steps
def dapo_reference(rounds: list[list[float]], k: int, target: int, max_rounds: int):
    """DAPO's loop written out plainly: per round, keep the groups whose scores are not all equal,
    accumulate, stop once `target` are held or the rounds are used up; then (this project's fill
    rule) top up with the earliest uniform groups. Returns (rounds used, kept group indices, filled)."""
    kept, uniform, index, used = [], [], 0, 0
    for r in range(max_rounds):
        used += 1
        scores = rounds[r]
        for g in range(len(scores) // k):
            group = scores[g * k : (g + 1) * k]
            if max(group) != min(group):
                kept.append(index)
            else:
                uniform.append(index)
            index += 1
        if len(kept) >= target:
            return used, kept[:target], 0
    fill = uniform[: target - len(kept)]
    return used, sorted(kept + fill), len(fill)


@pytest.mark.parametrize("block", range(4))
def test_the_round_loop_matches_a_plain_dapo_reference(block):
    seen = [_check_against_reference(random.Random(trial)) for trial in range(block * 100, (block + 1) * 100)]
    assert any(used > 1 and not filled for used, filled in seen)  # extra rounds that filled the batch
    assert any(filled for _, filled in seen) and any(
        used == 1 for used, _ in seen
    )  # the cap; one round enough


def _check_against_reference(rng: random.Random):
    k, target = rng.choice([2, 3, 4, 8]), rng.randint(1, 6)
    max_rounds = rng.randint(1, 5)
    p_uniform = rng.choice([0.0, 0.3, 0.7, 0.95, 1.0])
    rounds = []
    for _ in range(max_rounds):
        scores = []
        for _ in range(target):  # each round samples the step's number of prompts (groups)
            if rng.random() < p_uniform:
                scores += [rng.choice([0.0, 1.0, 0.5])] * k
            else:  # 0/1 scores with at least one of each, or real-valued ones
                group = [float(rng.random() < 0.5) for _ in range(k)]
                group[rng.randrange(k)] = 1.0 - group[0] if len(set(group)) == 1 else group[rng.randrange(k)]
                if rng.random() < 0.3:
                    group = [rng.random() for _ in range(k)]
                scores += group
        rounds.append(scores)
    calls = []

    def sample_round(r):
        calls.append(r)
        return SimpleNamespace(scores=torch.tensor(rounds[r], dtype=torch.float32))

    parts, sel = group_filter.run_rounds(sample_round, k, target, max_rounds)
    used, kept, filled = dapo_reference(rounds, k, target, max_rounds)
    assert calls == list(range(used)) and len(parts) == used
    assert sel.kept == kept and sel.filled == filled and len(sel.kept) == target
    mixed_in_pool = sum(
        max(rounds[r][g * k : (g + 1) * k]) != min(rounds[r][g * k : (g + 1) * k])
        for r in range(used)
        for g in range(target)
    )
    assert sel.mixed == mixed_in_pool
    rows = group_filter.group_rows(sel.kept, k)
    assert rows.tolist() == [g * k + j for g in kept for j in range(k)]
    return used, filled


def test_group_is_mixed_and_its_refusals():
    assert group_filter.group_is_mixed(torch.tensor([0.0, 0, 1, 0, 1, 1, 0.5, 0.25]), 2) == [
        False,
        True,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="groups of at least 2"):
        group_filter.group_is_mixed(torch.tensor([0.0, 1.0]), 1)
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        group_filter.group_is_mixed(torch.tensor([0.0, 1.0, 1.0, 0.0]), 3)
    with pytest.raises(ValueError, match="max_rounds=0"):
        group_filter.run_rounds(lambda r: None, 2, 1, 0)


def test_a_rank_takes_its_contiguous_share_of_the_kept_groups():
    kept, k, world = [1, 4, 5, 9], 3, 2
    shares = [group_filter.group_rows(kept, k, slice(r * 2, (r + 1) * 2)) for r in range(world)]
    assert torch.cat(shares).tolist() == group_filter.group_rows(kept, k).tolist()
    assert shares[1].tolist() == [15, 16, 17, 27, 28, 29]


def _part(n_rows: int, P: int, R: int, seed: int):
    from vapo_lit.experience import Experience

    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(1, P + 1, (n_rows,), generator=g)
    rlen = torch.randint(1, R + 1, (n_rows,), generator=g)
    prompt_ids, prompt_mask = torch.full((n_rows, P), 99), torch.zeros(n_rows, P, dtype=torch.long)
    response_ids, mask = torch.full((n_rows, R), 99), torch.zeros(n_rows, R)
    for i in range(n_rows):
        prompt_ids[i, P - plen[i] :], prompt_mask[i, P - plen[i] :] = (
            torch.randint(1, 50, (int(plen[i]),), generator=g),
            1,
        )
        response_ids[i, : rlen[i]], mask[i, : rlen[i]] = (
            torch.randint(1, 50, (int(rlen[i]),), generator=g),
            1.0,
        )
    return Experience(
        problems=[f"p{seed}-{i}" for i in range(n_rows)],
        group_size=2,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        mask=mask,
        behaviour_logprobs=-torch.rand(n_rows, R, generator=g, dtype=torch.float64) * mask,
        lengths=rlen,
        truncated=rlen == R,
        texts=[f"t{seed}-{i}" for i in range(n_rows)],
        scores=torch.randint(0, 2, (n_rows,), generator=g).float(),
        rewards=torch.zeros(n_rows, R),
        verdicts=list(range(n_rows)),
    )


def test_the_pool_of_rounds_keeps_every_row_as_it_was():
    """Rounds of different widths pooled: each row's real prompt and response tokens, masks,
    log-probs, scores and texts are those of its round (padding 99 on the prompt's left, the
    response's right)."""
    parts = [_part(4, 3, 5, 0), _part(6, 5, 2, 1), _part(2, 2, 7, 2)]
    pool = group_filter.concat_experiences(parts, pad_id=99)
    assert pool.n == 12 and pool.prompt_width == 5 and pool.mask.shape[1] == 7 and pool.group_size == 2
    row = 0
    for part in parts:
        for i in range(part.n):
            p, r = int(part.prompt_mask[i].sum()), int(part.lengths[i])
            assert torch.equal(pool.prompt_ids[row, -p:], part.prompt_ids[i, -p:])
            assert int(pool.prompt_mask[row].sum()) == p and bool((pool.prompt_ids[row, :-p] == 99).all())
            assert torch.equal(pool.response_ids[row, :r], part.response_ids[i, :r])
            assert bool((pool.response_ids[row, r:] == 99).all()) and float(pool.mask[row, r:].sum()) == 0
            assert torch.equal(pool.behaviour_logprobs[row, :r], part.behaviour_logprobs[i, :r])
            assert pool.scores[row] == part.scores[i] and pool.texts[row] == part.texts[i]
            assert pool.problems[row] == part.problems[i] and pool.verdicts[row] == part.verdicts[i]
            row += 1
    sel = pool.select(group_filter.group_rows([1, 4], 2), trim=True)
    assert sel.texts == ["t0-2", "t0-3", "t1-4", "t1-5"]


# ----------------------------------------------------------------------------- the rule
def test_dynamic_sampling_needs_group_sampling():
    cfg = merge(RunConfig(), {"components": ["token_level_loss", "dynamic_sampling"]})
    with pytest.raises(ValueError, match="dynamic_sampling needs group_sampling"):
        validate(cfg)
    validate(merge(RunConfig(), {"components": [*GRPO, "dynamic_sampling"], "advantage_estimator": "grpo"}))
    with pytest.raises(ValueError, match=r"dynamic_max_rounds=0 is out of range; valid range: >= 1"):
        validate(
            merge(RunConfig(), {"components": [*GRPO, "dynamic_sampling"], "vapo": {"dynamic_max_rounds": 0}})
        )


def test_the_cli_refuses_it_without_group_sampling_in_one_line(capsys):
    from vapo_lit.cli.train import main

    assert main(["--preset", "smoke", "--only", "clip_higher,dynamic_sampling", "--wandb", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dynamic_sampling needs group_sampling" in err[0]


def test_the_labels_name_the_row_for_what_it_is():
    from vapo_lit.labels import run_label
    from vapo_lit.report.table import pretty

    label = run_label([*GRPO, "dynamic_sampling"], "grpo")
    assert label == "grpo+token_level_loss+clip_higher+group_sampling-with-dynamic_sampling"
    assert (
        pretty(label)
        == "critic-free GRPO (token_level_loss, clip_higher, group_sampling) with dynamic_sampling"
    )
    assert pretty("vapo-with-kl_penalty") == "VAPO (full) with kl_penalty"


def test_the_critic_free_grid_has_a_dapo_row_and_table1_is_unchanged():
    from vapo_lit.ablate.grid import load_grid

    rows = {r.label: r for r in load_grid("critic_free").rows}
    dapo = rows["grpo+token_level_loss+clip_higher+group_sampling-with-dynamic_sampling"]
    assert dapo.components == [*GRPO, "dynamic_sampling"] and dapo.delta == {"advantage_estimator": "grpo"}
    table1 = [r.label for r in load_grid("table1").rows]
    committed = [
        "vapo",
        "vapo-no-value_pretraining",
        "vapo-no-decoupled_gae",
        "vapo-no-length_adaptive_gae",
        "vapo-no-token_level_loss",
        "vapo-no-clip_higher",
        "vapo-no-positive_lm_loss",
        "vapo-no-group_sampling",
        "vanilla_ppo",
        "grpo+token_level_loss+clip_higher+group_sampling",
    ]
    assert table1 == committed


# ----------------------------------------------------------------------------- real runs
def cfg_of(tmp_path: Path, name: str, components, **delta) -> RunConfig:
    base = {
        **CONFIG,
        "components": list(components),
        "out_dir": str(tmp_path / "runs"),
        "name": name,
        "cache_dir": str(tmp_path / f"cache-{name}"),
        "steps": 3,
        "eval_every": 0,
    }
    return merge(RunConfig(), {**base, **delta})


def factory(cfg: RunConfig):
    """The golden runs' tiny SFT'd float64 policy (it gets some answers right: groups are mixed and
    uniform); no critic for the critic-free estimator."""
    from vapo_lit.module import VapoModule

    module = golden_factory(cfg)
    if cfg.advantage_estimator != "grpo":
        return module
    return VapoModule(cfg, module.task, module.actor, module.tokenizer, None)


def rows_of(tmp_path: Path, name: str) -> list[dict]:
    with open(tmp_path / "runs" / name / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


DYNAMIC = ("rollout/dynamic_", "rollout/kept_groups_frac")


def test_a_dynamic_grpo_run_trains_on_mixed_groups_and_counts_every_sampled_token(tmp_path):
    cfg = cfg_of(tmp_path, "dapo", [*GRPO, "dynamic_sampling"], advantage_estimator="grpo", steps=4)
    train(cfg, module_factory=factory)
    rows = [r for r in rows_of(tmp_path, "dapo") if r.get("train/ppo_update") and int(r["step"]) > 0]
    assert len(rows) == 4
    target = cfg.ppo.responses_per_step // cfg.vapo.samples_per_prompt
    tokens_before, extra_rounds = 0.0, 0
    for r in rows:
        rounds, filled = float(r["rollout/dynamic_rounds"]), float(r["rollout/dynamic_filled_groups"])
        extra_rounds += rounds > 1
        assert 1 <= rounds <= cfg.vapo.dynamic_max_rounds
        assert float(r["rollout/dynamic_groups_sampled"]) == rounds * target
        assert float(r["rollout/kept_groups_frac"]) == pytest.approx(target / (rounds * target))
        assert float(r["rollout/dynamic_cap_hit"]) == float(filled > 0)
        # the batch trained on: mixed groups only, unless the cap filled it
        assert float(r["rollout/mixed_groups_frac"]) == pytest.approx((target - filled) / target)
        kept = float(r["rollout/response_length"]) * cfg.ppo.responses_per_step
        assert float(r["perf/cumulative_tokens"]) - tokens_before == pytest.approx(
            kept + float(r["rollout/dynamic_discarded_tokens"]), abs=1e-6
        )
        assert (float(r["rollout/dynamic_discarded_tokens"]) > 0) == (rounds > 1)
        tokens_before = float(r["perf/cumulative_tokens"])
    assert extra_rounds >= 1, "no iteration needed a second round: the test does not exercise the loop"


def test_one_round_allowed_equals_the_switch_off_run_for_a_critic_row(tmp_path):
    """With dynamic_max_rounds = 1 the batch is the step's own (filled with its uniform groups when
    any): the history equals the run without the component, every non-perf column but the
    component's own; value pretraining (2 iterations here) is not touched by it."""
    on = cfg_of(
        tmp_path, "on", [*COMPONENTS, "dynamic_sampling"], vapo={**CONFIG["vapo"], "dynamic_max_rounds": 1}
    )
    off = cfg_of(tmp_path, "off", COMPONENTS)
    with pytest.warns(UserWarning, match="dynamic sampling's 1 rounds"):
        train(on, module_factory=factory)
    train(off, module_factory=factory)
    a, b = rows_of(tmp_path, "on"), rows_of(tmp_path, "off")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        dynamic = {k for k in x if k.startswith(DYNAMIC) and x[k] != ""}
        pretraining = x.get("train/value_pretraining") == "1.0"
        assert not dynamic if (pretraining or x["step"] == "0") else dynamic
        assert {k: v for k, v in x.items() if not k.startswith(("perf/", *DYNAMIC))} == {
            k: v for k, v in y.items() if not k.startswith(("perf/", *DYNAMIC))
        }
        assert x.get("perf/cumulative_tokens") == y.get("perf/cumulative_tokens")


class CrashAt(Callback):
    def __init__(self, iteration):
        self.iteration = iteration

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.iteration == self.iteration:
            raise KeyboardInterrupt


def test_a_resumed_dynamic_run_samples_what_the_uninterrupted_one_did(tmp_path):
    delta = dict(advantage_estimator="grpo", steps=4, checkpoint_every=1)
    train(cfg_of(tmp_path, "full", [*GRPO, "dynamic_sampling"], **delta), module_factory=factory)
    broken = cfg_of(tmp_path, "broken", [*GRPO, "dynamic_sampling"], **delta)
    with pytest.raises(BaseException):
        train(broken, module_factory=factory, extra_callbacks=[CrashAt(2)])
    assert len(rows_of(tmp_path, "broken")) == 3  # the base eval and iterations 1, 2
    train(broken, resume=True, module_factory=factory)
    a, b = rows_of(tmp_path, "full"), rows_of(tmp_path, "broken")
    assert any(float(r.get("rollout/dynamic_rounds") or 1) > 1 for r in a[3:]), (
        "no extra round after the restart"
    )
    assert [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in a] == [
        {k: v for k, v in r.items() if not k.startswith("perf/")} for r in b
    ]
    assert [r["perf/cumulative_tokens"] for r in a] == [r["perf/cumulative_tokens"] for r in b]


# ----------------------------------------------------------------------------- data parallel
@pytest.mark.slow
def test_two_processes_sample_and_train_what_one_does(tmp_path):
    """Two gloo processes (DDP, float64): each samples its share of every round's groups; the kept
    groups (decided on the whole gathered round) are split in whole groups; the history and the
    parameters equal the single process's."""
    from test_data_parallel import TASK, assert_same_history, assert_same_parameters, flags, run_cli

    from vapo_lit.cli.args import config_from_args
    from vapo_lit.cli.train import build_parser
    from vapo_lit.models.builtin import SFTConfig, TinyModelConfig, train_sft
    from vapo_lit.tasks import get_task

    model_dir = tmp_path / "model"
    task = get_task("chain", **TASK)
    actor = train_sft(
        task,
        TinyModelConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        SFTConfig(steps=150, batch_size=16, lr=1e-2, warmup_steps=5),
        seed=0,
    )
    actor.save_pretrained(model_dir)
    task.tokenizer.save_pretrained(model_dir)
    extra = ("--add", "dynamic_sampling")
    train(
        config_from_args(
            build_parser().parse_args(flags(model_dir, tmp_path, "single", tmp_path / "c1", *extra))
        )
    )
    ddp = run_cli(
        flags(model_dir, tmp_path, "ddp", tmp_path / "c2", *extra, "--devices", "2", "--strategy", "ddp")
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in ddp.stderr
    rows = list(csv.DictReader(open(tmp_path / "single" / "metrics.csv")))
    assert any(float(r.get("rollout/dynamic_rounds") or 1) > 1 for r in rows), (
        "no extra round: the test is weak"
    )
    assert_same_history(tmp_path / "single", tmp_path / "ddp")
    assert_same_parameters(tmp_path / "single", tmp_path / "ddp")
    assert math.isfinite(float(rows[-1]["perf/cumulative_tokens"]))


def test_multi_turn_episodes_pool_like_single_turn_ones(tmp_path):
    """A multi-turn task (tool observations inside responses) through two rounds: the random-init
    policy solves nothing, so every group is uniform, the cap (2 rounds) is hit and the batch is
    filled with round 0's groups: exactly the step's own episodes, observation masks included."""
    from vapo_lit.build import build_module
    from vapo_lit.components import build_callbacks
    from vapo_lit.presets import PRESETS

    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "task": "toolchain",
            "task_options": {"max_n": 3},
            "model": "random",
            "wandb": "disabled",
            "out_dir": str(tmp_path),
            "components": [*GRPO, "dynamic_sampling"],
            "advantage_estimator": "grpo",
            "vapo": {"samples_per_prompt": 4, "dynamic_max_rounds": 2},
        },
    )
    module = build_module(cfg)
    for cb in build_callbacks(cfg.components, cfg.vapo):  # what their setup does, without a Trainer
        cb.attach(module)
    problems = module.task.train_problems(module.prompts_per_step, 0)
    own = module.sample(problems)
    with pytest.warns(UserWarning, match="filled with 4 groups"):
        exp = module.rollout(problems)
    assert (
        module._carry["rollout/dynamic_rounds"] == 2.0
        and module._carry["rollout/dynamic_filled_groups"] == 4.0
    )
    assert exp.obs_mask is not None and float(exp.obs_mask.sum()) > 0
    assert exp.texts == own.texts and torch.equal(exp.lengths, own.lengths)
    R = int(own.lengths.max())
    for name in ("mask", "obs_mask", "response_ids", "behaviour_logprobs"):
        assert torch.equal(getattr(exp, name)[:, :R], getattr(own, name)[:, :R]), name
    assert module.generated_tokens == module._carry["rollout/dynamic_discarded_tokens"] > 0
