"""VapoModule under a real Lightning Trainer with tiny random-init models on a shrunken chain task:
vanilla == no callbacks, callbacks record only their switches, the actor is frozen during value
pretraining, resume reproduces the metric history, non-finite losses stop the run loudly, and
the W&B offline run can be read back from disk."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from vapo_lit.build import build_module
from vapo_lit.components import REGISTRY, build_callbacks
from vapo_lit.config import COMPONENTS, ComponentValues, RunConfig, Switches, merge
from vapo_lit.module import NonFiniteLossError, VapoModule  # noqa: F401
from vapo_lit.presets import PRESETS
from vapo_lit.train import train


def tiny_factory(cfg: RunConfig) -> VapoModule:
    """Random-init tiny Llama actor and a critic on a copy of its backbone (no SFT: seconds)."""
    return build_module(merge(cfg, {"model": "random"}))


def smoke_cfg(tmp_path, **delta) -> RunConfig:
    cfg = merge(RunConfig(), PRESETS["smoke"])
    base = {"out_dir": str(tmp_path / "runs"), "wandb": "disabled", "cache_dir": str(tmp_path / "cache")}
    return merge(cfg, {**base, **delta})


def read_metrics(run_dir) -> list[dict]:
    with open(f"{run_dir}/metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- switches
@pytest.mark.parametrize("name", COMPONENTS)
def test_each_callback_sets_only_its_declared_switches(name):
    values = ComponentValues(
        alpha=0.7,
        lambda_critic=0.9,
        eps_high=0.33,
        mu=0.3,
        samples_per_prompt=4,
        value_pretrain_steps=7,
        value_pretrain_min_ev=0.2,
    )
    (cb,) = build_callbacks([name], values)
    before = Switches()
    after = dataclasses.replace(before)
    cb.apply(after)
    changed = {
        f.name for f in dataclasses.fields(Switches) if getattr(before, f.name) != getattr(after, f.name)
    }
    assert getattr(after, name) is True
    assert name in changed and changed <= set(cb.declares), changed
    for key in cb.declares:
        if key != name:
            assert getattr(after, key) == getattr(values, key)


def test_unknown_component_and_bad_values():
    with pytest.raises(ValueError, match="valid names: value_pretraining, decoupled_gae"):
        build_callbacks(["not_a_component"])
    with pytest.raises(ValueError, match=r"length_adaptive_gae.alpha=0 is out of range; valid range: > 0"):
        REGISTRY["length_adaptive_gae"](alpha=0)
    with pytest.raises(ValueError, match="takes mu; got 'alpha'"):
        REGISTRY["positive_lm_loss"](alpha=1.0)


def test_callback_checks_run_in_setup(tmp_path):
    cfg = smoke_cfg(tmp_path, ppo={"eps": 0.3}, vapo={"eps_high": 0.28}, components=["clip_higher"])
    with pytest.raises(ValueError, match="eps_high=0.28 is below"):
        train(cfg, module_factory=tiny_factory)


# ----------------------------------------------------------------------------- vanilla
class FirstUpdate(Callback):
    def __init__(self):
        self.metrics = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.metrics is None:
            self.metrics = dict(pl_module.last_metrics)


def test_all_switches_off_is_vanilla_ppo(tmp_path):
    """No component callbacks at all == the explicit vanilla config (--only none): same first update."""
    import lightning as L

    cfg = smoke_cfg(tmp_path, components=[], steps=1, eval_every=0)
    probe_a = FirstUpdate()
    module = tiny_factory(cfg)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=-1,
        logger=False,
        callbacks=[probe_a],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    assert module.switches == Switches() and module.components == []  # nothing switched on, no hooks

    probe_b = FirstUpdate()
    from vapo_lit.cli.args import config_from_args
    from vapo_lit.cli.train import build_parser

    explicit = config_from_args(build_parser().parse_args(["--preset", "smoke", "--only", "none"]))
    explicit = merge(
        explicit, {"out_dir": str(tmp_path / "b"), "wandb": "disabled", "steps": 1, "eval_every": 0}
    )
    assert explicit.components == []
    train(explicit, module_factory=tiny_factory, extra_callbacks=[probe_b])
    for key in ("loss/policy", "value/loss", "policy/entropy", "gae/lambda_policy_mean", "objective/score"):
        assert probe_a.metrics[key] == probe_b.metrics[key], key
    assert probe_a.metrics["gae/lambda_policy_mean"] == pytest.approx(0.95)


def test_components_change_the_update(tmp_path):
    """Sanity: the full recipe's first update differs from vanilla's (the switches are read)."""
    probes = {}
    for label, comps in (("vanilla", []), ("vapo", [c for c in COMPONENTS if c != "value_pretraining"])):
        probes[label] = FirstUpdate()
        cfg = smoke_cfg(tmp_path, components=comps, steps=1, eval_every=0, name=label)
        train(cfg, module_factory=tiny_factory, extra_callbacks=[probes[label]])
    a, b = probes["vanilla"].metrics, probes["vapo"].metrics
    assert a["rollout/samples_per_prompt"] == 1 and b["rollout/samples_per_prompt"] == 4
    assert a["gae/lambda_policy_mean"] != b["gae/lambda_policy_mean"]
    assert a["loss/policy"] != b["loss/policy"]


# ----------------------------------------------------------------------------- value pretraining
class WeightWatch(Callback):
    def __init__(self):
        self.snapshots = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        phase = "value_pretrain" if pl_module.pretrain.active else "ppo"
        self.snapshots.append(
            (
                phase,
                {k: v.clone() for k, v in pl_module.actor.state_dict().items()},
                {k: v.clone() for k, v in pl_module.critic.state_dict().items()},
            )
        )


def test_value_pretraining_freezes_the_actor(tmp_path):
    watch = WeightWatch()
    cfg = smoke_cfg(
        tmp_path, components=["value_pretraining"], steps=1, eval_every=0, vapo={"value_pretrain_steps": 3}
    )
    train(cfg, module_factory=tiny_factory, extra_callbacks=[watch])
    phases = [p for p, _, _ in watch.snapshots]
    assert phases == ["value_pretrain"] * 3 + ["ppo"]
    first_actor, last_pre_actor = watch.snapshots[0][1], watch.snapshots[3][1]
    assert all(torch.equal(first_actor[k], last_pre_actor[k]) for k in first_actor)  # bit-identical
    c0, c3 = watch.snapshots[0][2], watch.snapshots[3][2]
    assert any(not torch.equal(c0[k], c3[k]) for k in c0)  # the critic did learn
    rows = read_metrics(next((tmp_path / "runs").iterdir()))
    assert rows[0]["step"] == "0" and rows[0]["eval/avg@2"] != ""  # the initial policy's eval row
    assert [float(r["train/value_pretraining"]) for r in rows[1:]] == [1.0, 1.0, 1.0, 0.0]


def test_pretrained_critic_is_cached_and_reused(tmp_path):
    cfg = smoke_cfg(
        tmp_path,
        components=["value_pretraining"],
        steps=1,
        eval_every=0,
        vapo={"value_pretrain_steps": 2},
        name="first",
    )
    train(cfg, module_factory=tiny_factory)
    watch = WeightWatch()
    second = merge(cfg, {"name": "second"})
    train(second, module_factory=tiny_factory, extra_callbacks=[watch])
    assert [p for p, _, _ in watch.snapshots] == ["ppo"]  # no pretraining iterations the second time
    rows_a = read_metrics(tmp_path / "runs" / "first")
    rows_b = read_metrics(tmp_path / "runs" / "second")
    # same base eval, same prompt stream position and same critic: the first PPO iteration is identical
    assert rows_a[0]["eval/avg@2"] == rows_b[0]["eval/avg@2"]
    assert rows_a[0]["eval/response_length"] == rows_b[0]["eval/response_length"]  # same samples
    assert rows_a[-1]["value/loss"] == rows_b[-1]["value/loss"]
    assert rows_a[-1]["loss/policy"] == rows_b[-1]["loss/policy"]
    # the cached phase's cost counts in the second run's cumulative counters (compute-matched
    # comparisons): the same tokens as the run that computed it, and at least its seconds
    assert float(rows_b[0]["perf/cumulative_tokens"]) == 0.0
    assert float(rows_b[-1]["perf/cumulative_tokens"]) == float(rows_a[-1]["perf/cumulative_tokens"]) > 0
    phase = [float(r["perf/total_seconds"]) for r in rows_a if r.get("train/value_pretraining") == "1.0"]
    assert len(phase) == 2
    # where the phase ended (median of its last iterations' finite explained variances; none where a
    # random model's batches all score 0), logged alike by the run that loaded the cached critic
    evs = [float(r["value/explained_variance"]) for r in rows_a if r.get("train/value_pretraining") == "1.0"]
    finite = [x for x in evs if x == x]
    logged = [
        [float(r["value_pretrain/ev_end"]) for r in rows if r.get("value_pretrain/ev_end")]
        for rows in (rows_a, rows_b)
    ]
    assert logged[0] == logged[1] == ([pytest.approx(statistics.median(finite))] if finite else [])
    assert float(rows_b[-1]["perf/cumulative_seconds"]) > sum(phase) + float(rows_b[-1]["perf/total_seconds"])


class CriticSteps(Callback):
    """(phase, critic lr, critic optimizer steps) of every iteration."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        phase = "value_pretrain" if pl_module.pretrain.active else "ppo"
        self.start = (phase, pl_module._opt(1)[0].param_groups[0]["lr"], pl_module.critic_steps)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        phase, lr, before = self.start
        self.rows.append((phase, lr, pl_module.critic_steps - before))


def test_value_pretraining_trains_the_critic_at_its_own_rate_and_passes(tmp_path):
    """value_pretrain_critic_lr / _epochs apply while the phase runs; PPO then uses ppo.critic_lr and
    ppo.critic_epochs (smoke: 16 responses per step, critic mini-batch 8: 2 steps per pass)."""
    watch = CriticSteps()
    cfg = smoke_cfg(
        tmp_path,
        components=["value_pretraining"],
        steps=2,
        eval_every=0,
        ppo={"critic_lr": 1e-4, "critic_epochs": 1},
        vapo={"value_pretrain_steps": 2, "value_pretrain_critic_lr": 1e-3, "value_pretrain_critic_epochs": 3},
    )
    train(cfg, module_factory=tiny_factory, extra_callbacks=[watch])
    assert watch.rows == [
        ("value_pretrain", 1e-3, 6),
        ("value_pretrain", 1e-3, 6),
        ("ppo", 1e-4, 2),
        ("ppo", 1e-4, 2),
    ]
    rows = read_metrics(next((tmp_path / "runs").iterdir()))
    assert [float(r["train/critic_lr"]) for r in rows[1:]] == [1e-3, 1e-3, 1e-4, 1e-4]


def test_a_critic_pretrained_at_the_same_rate_is_reused_whichever_setting_named_it(tmp_path):
    """The cache key holds the phase's effective learning rate and passes: a critic pretrained with
    ppo.critic_lr 1e-3 x 3 passes is the one a run asking for value_pretrain_critic_lr 1e-3 x 3 (and
    another PPO critic) gets, and the PPO iteration after it runs at the PPO rate."""
    first = smoke_cfg(
        tmp_path,
        components=["value_pretraining"],
        steps=1,
        eval_every=0,
        name="first",
        ppo={"critic_lr": 1e-3, "critic_epochs": 3},
        vapo={"value_pretrain_steps": 2},
    )
    train(first, module_factory=tiny_factory)
    watch = CriticSteps()
    second = merge(
        first,
        {
            "name": "second",
            "ppo": {"critic_lr": 1e-4, "critic_epochs": 1},
            "vapo": {"value_pretrain_critic_lr": 1e-3, "value_pretrain_critic_epochs": 3},
        },
    )
    train(second, module_factory=tiny_factory, extra_callbacks=[watch])
    assert watch.rows == [("ppo", 1e-4, 2)]  # loaded from the cache: no pretraining iteration
    rows_a, rows_b = read_metrics(tmp_path / "runs" / "first"), read_metrics(tmp_path / "runs" / "second")
    assert rows_a[-1]["loss/policy"] == rows_b[-1]["loss/policy"]  # same critic values: same advantages
    third = merge(second, {"name": "third", "vapo": {"value_pretrain_critic_epochs": 2}})
    watch = CriticSteps()
    train(third, module_factory=tiny_factory, extra_callbacks=[watch])
    assert [p for p, _, _ in watch.rows] == ["value_pretrain", "value_pretrain", "ppo"]  # another critic


@pytest.mark.parametrize(
    "delta",
    [
        {"vapo": {"value_pretrain_critic_lr": 1e-3}},
        {"vapo": {"value_pretrain_critic_epochs": 2}},
        {"ppo": {"gamma": 0.9}},
        {"truncation": "bootstrap"},
        {"ppo": {"temperature": 0.7}},
        {"ppo": {"top_p": 0.9}},
        {"ppo": {"critic_lr": 3e-4}},
        {"ppo": {"value_clip": 0.2}},
        {"ppo": {"responses_per_step": 32}},
        {"seed": 1},
        {"task_options": {"max_n": 10}},
        {"model": "other"},
        {"critic_init": "actor"},
    ],
)
def test_the_pretrained_critic_cache_key_changes_with_what_changes_its_training(tmp_path, delta):
    """A setting that changes the Monte-Carlo returns the critic is pretrained on (the discount,
    bootstrapping truncated responses, the sampled responses), or how it learns them, gives another
    cache entry: a run must never load a critic pretrained for other returns."""
    from vapo_lit import pretrain

    def entry(cfg):
        key = pretrain.cache_key(
            cfg, steps=2, min_ev=None, samples_per_prompt=4, max_new_tokens=20, task_version="1"
        )
        return pretrain.entry_dir(key, tmp_path)

    base = smoke_cfg(tmp_path, components=["value_pretraining"])
    assert entry(merge(base, delta)) != entry(base)


def test_the_pretrained_critic_cache_key_ignores_what_cannot_change_it(tmp_path):
    from vapo_lit import pretrain

    def entry(cfg, **kw):
        key = pretrain.cache_key(
            cfg,
            **{
                "steps": 2,
                "min_ev": None,
                "samples_per_prompt": 4,
                "max_new_tokens": 20,
                "task_version": "1",
                **kw,
            },
        )
        return pretrain.entry_dir(key, tmp_path)

    base = smoke_cfg(tmp_path, components=["value_pretraining"])
    for delta in (
        {"name": "x", "out_dir": "/elsewhere", "wandb": "offline"},
        {"steps": 99, "eval_every": 7},
        {"ppo": {"actor_lr": 0.5, "lam": 0.5, "eps": 0.3}},
        {"components": ["value_pretraining", "clip_higher"]},
    ):
        assert entry(merge(base, delta)) == entry(base), delta
    for kw in (
        {"steps": 3},
        {"min_ev": 0.5},
        {"samples_per_prompt": 8},
        {"max_new_tokens": 21},
        {"task_version": "2"},
    ):
        assert entry(base, **kw) != entry(base), kw


# ----------------------------------------------------------------------------- resume
class CrashAt(Callback):
    def __init__(self, iteration):
        self.iteration = iteration

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.iteration == self.iteration:
            raise KeyboardInterrupt  # what Lightning sees when a user kills the run with Ctrl-C


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


@pytest.mark.parametrize(
    "crash_at,every,pretrain_steps,own_rate",
    [(5, 2, 1, False), (1, 1, 1, False), (2, 1, 3, False), (2, 1, 3, True)],
)
def test_resume_reproduces_metric_history(tmp_path, crash_at, every, pretrain_steps, own_rate):
    """(1, 1, 1): killed right after the checkpoint that ends value pretraining, whose value_pretrain/*
    metrics are logged with the next row (they must survive the restart). (2, 1, 3): killed in the
    middle of value pretraining (2 of its 3 iterations done): the resumed run does the third only;
    with `own_rate` the phase's own critic learning rate and passes carry across the restart.
    Exact equality holds on any CPU: both runs are in this process, on the same kernels (it passes
    under ATEN_CPU_CAPABILITY=default, avx2 and avx512)."""
    own = {"value_pretrain_critic_lr": 5e-4, "value_pretrain_critic_epochs": 2} if own_rate else {}
    base = dict(
        components=list(COMPONENTS),
        steps=5 - pretrain_steps + 1,
        eval_every=2,
        checkpoint_every=every,
        vapo={"value_pretrain_steps": pretrain_steps, **own},
    )
    full = smoke_cfg(tmp_path, name="full", cache_dir=str(tmp_path / "cache_full"), **base)
    train(full, module_factory=tiny_factory)
    broken = smoke_cfg(tmp_path, name="broken", cache_dir=str(tmp_path / "cache_broken"), **base)
    with pytest.raises(BaseException):
        train(broken, module_factory=tiny_factory, extra_callbacks=[CrashAt(crash_at)])
    partial = read_metrics(tmp_path / "runs" / "broken")
    assert (
        len(partial) == crash_at + 1
    )  # step 0 (base eval) and iterations 1..crash_at (1 = value pretraining)
    train(broken, resume=True, module_factory=tiny_factory)
    full_rows, resumed_rows = (
        read_metrics(tmp_path / "runs" / "full"),
        read_metrics(tmp_path / "runs" / "broken"),
    )
    a, b = _comparable(full_rows), _comparable(resumed_rows)
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert a == b
    # the cost counters carry on across the restart (the compute-matched columns of the report):
    # the same responses, so exactly the same cumulative token count; wall time never restarts at 0
    assert [r["perf/cumulative_tokens"] for r in resumed_rows] == [
        r["perf/cumulative_tokens"] for r in full_rows
    ]
    seconds = [float(r["perf/cumulative_seconds"]) for r in resumed_rows]
    assert seconds == sorted(seconds) and seconds[0] > 0


# ----------------------------------------------------------------------------- non-finite
class PoisonCritic(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.iteration == 2:
            with torch.no_grad():
                pl_module.critic.head.bias.fill_(float("nan"))


def test_nan_loss_stops_with_step_tensor_and_checkpoint(tmp_path):
    cfg = smoke_cfg(tmp_path, components=[], steps=5, checkpoint_every=1, eval_every=0)
    with pytest.raises(NonFiniteLossError) as e:
        train(cfg, module_factory=tiny_factory, extra_callbacks=[PoisonCritic()])
    msg = str(e.value)
    assert "value/loss" in msg and "iteration 2" in msg and "last.ckpt" in msg


# ----------------------------------------------------------------------------- logging
def test_run_card_and_wandb_offline_run_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = smoke_cfg(
        tmp_path,
        wandb="auto",
        steps=2,
        eval_every=1,
        wandb_group="grid-x",
        components=[c for c in COMPONENTS if c != "clip_higher"],
        vapo={"value_pretrain_steps": 1},
    )
    summary = train(cfg, module_factory=tiny_factory)
    run_dir = summary["run_dir"]
    card = json.loads(open(f"{run_dir}/run_card.json").read())
    for item in (
        "value_initialisation_and_warmup",
        "update_frequencies",
        "lambdas",
        "masks",
        "token_denominator",
        "packed_batch_semantics",
        "positive_samples",
        "rollout_budget",
        "sampling",
        "verifier",
    ):
        assert item in card, item
    assert card["components_off"] == ["clip_higher"] and card["wandb"]["mode"] == "offline"
    assert card["wandb"]["group"] == "grid-x"

    import glob

    from wandb_offline import read_run, wait_complete

    (path,) = glob.glob(f"{run_dir}/wandb/offline-run-*/run-*.wandb")
    wait_complete(path)  # wandb 0.31 may still be writing the offline file when finish() returns
    run = read_run(path)
    history, config = run["history"], run["config"]
    assert run["run"].run_group == "grid-x" and run["run"].job_type == "vapo-no-clip_higher"
    assert "no-clip_higher" in list(run["run"].tags)
    logged = {k for h in history for k in h}
    assert {
        "objective/score",
        "value/explained_variance",
        "policy/entropy",
        "rollout/response_length",
        "eval/avg@2",
    } <= logged
    logged_card = config["run_card"].get("value", config["run_card"])
    assert logged_card["config"]["components"] == cfg.components  # the full config is in the W&B config
    assert logged_card["lambdas"] == card["lambdas"]
    csv_rows = read_metrics(run_dir)
    assert len(csv_rows) == 4 and math.isclose(
        float(csv_rows[-1]["objective/score"]),
        [h for h in history if "objective/score" in h][-1]["objective/score"],
    )


def test_critic_free_grpo_baseline(tmp_path):
    cfg = smoke_cfg(
        tmp_path,
        advantage_estimator="grpo",
        steps=2,
        eval_every=0,
        components=["token_level_loss", "clip_higher", "group_sampling"],
    )
    summary = train(cfg, module_factory=tiny_factory)
    rows = read_metrics(summary["run_dir"])
    assert len(rows) == 3 and not any(k.startswith("value/") for k in rows[-1] if rows[-1][k])
    assert float(rows[-1]["rollout/samples_per_prompt"]) == 4
    with pytest.raises(ValueError, match="grpo is critic-free: value_pretraining"):
        train(smoke_cfg(tmp_path, advantage_estimator="grpo"), module_factory=tiny_factory)
    with pytest.raises(ValueError, match="needs group_sampling"):
        train(
            smoke_cfg(tmp_path, advantage_estimator="grpo", components=["clip_higher"]),
            module_factory=tiny_factory,
        )


def test_perf_metrics_add_up(tmp_path):
    """The per-iteration cost split: rollout + values + advantages + critic update + actor update
    = step <= total, and rollout + update = step; cumulative seconds are the
    start eval plus every iteration's total (and later evals); peak memory is the process's peak
    resident set in MB (not some other unit)."""
    import resource

    cfg = smoke_cfg(tmp_path, steps=3, eval_every=0, vapo={"value_pretrain_steps": 1})
    summary = train(cfg, module_factory=tiny_factory)
    rows = list(csv.DictReader(open(f"{summary['run_dir']}/metrics.csv")))
    it = [r for r in rows if r.get("perf/step_seconds")]
    assert len(it) == 4  # one value-pretraining iteration, three PPO iterations
    elapsed = float(rows[0]["perf/eval_seconds"])  # the base-model eval before the first iteration
    for r in it:
        f = {k[5:]: float(v) for k, v in r.items() if k.startswith("perf/") and v}
        parts = ("rollout", "values", "advantages", "critic_update", "actor_update")
        assert (
            all(f[f"{p}_seconds"] >= 0 for p in parts)
            and f["rollout_seconds"] > 0
            and f["update_seconds"] > 0
        )
        assert f["critic_update_seconds"] > 0 and f["values_seconds"] > 0
        # no actor update while the critic is pretrained (row 0): only the clock's own cost
        assert (f["actor_update_seconds"] > 0.05 * f["critic_update_seconds"]) == (r is not it[0])
        assert sum(f[f"{p}_seconds"] for p in parts) == pytest.approx(f["step_seconds"], rel=1e-9)
        assert f["rollout_seconds"] + f["update_seconds"] == pytest.approx(f["step_seconds"], rel=1e-9)
        assert f["step_seconds"] <= f["total_seconds"]
        elapsed += f["total_seconds"] + f.get("eval_seconds", 0.0) * (r is it[-1])
        if r is not it[-1]:
            assert f["cumulative_seconds"] == pytest.approx(elapsed, rel=1e-6)
    peak_now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    assert 20 < float(it[-1]["perf/peak_memory_mb"]) <= peak_now * 1.01


def test_where_value_pretraining_ended_travels_through_the_cache(tmp_path, monkeypatch):
    """The module records each pretraining iteration; the phase's end (medians of its last
    iterations) goes into the cache entry and comes back, logged alike, in a run that loads it. A
    random model's batches all score 0 (explained variance NaN), so the recorded values are made
    finite here, keeping the module's call and everything after it."""
    from vapo_lit import pretrain as pre

    recorded, original = [], pre.PretrainPhase.record

    def record(self, ev, ev_oracle=float("nan"), ceiling=float("nan")):
        k = len(self.recent_ev)
        recorded.append((0.1 * k, 0.2 + 0.1 * k, 0.7))
        original(self, *recorded[-1])

    monkeypatch.setattr(pre.PretrainPhase, "record", record)
    cfg = smoke_cfg(
        tmp_path,
        components=["value_pretraining"],
        steps=1,
        eval_every=0,
        name="first",
        vapo={"value_pretrain_steps": 3},
    )
    train(cfg, module_factory=tiny_factory)
    train(merge(cfg, {"name": "second"}), module_factory=tiny_factory)
    assert len(recorded) == 3  # the second run pretrained nothing
    want = {"ev_end": 0.1, "ev_oracle_end": 0.3, "ceiling_end": 0.7}  # medians of the 3 iterations
    (entry,) = (tmp_path / "cache").glob("pretrained-critic-*")
    assert json.loads((entry / "pretraining.json").read_text())["end"] == pytest.approx(want)
    for name in ("first", "second"):
        rows = read_metrics(tmp_path / "runs" / name)
        logged = {
            k: float(r[f"value_pretrain/{k}"]) for r in rows for k in want if r.get(f"value_pretrain/{k}")
        }
        assert logged == pytest.approx(want), name


def test_the_phase_keeps_where_it_ended_for_a_cached_load():
    """PretrainPhase.end_stats: medians over the last END_WINDOW iterations (NaNs left out, the
    true-value columns only where recorded); a phase restored from a cache entry reports the entry's."""
    from vapo_lit.pretrain import END_WINDOW, PretrainPhase
    from vapo_lit.report.critic import LAST_VP

    assert END_WINDOW == LAST_VP  # the report's 'end of value pretraining'
    ph = PretrainPhase()
    for i in range(15):
        ph.record(0.01 * i, 0.02 * i, 0.6 if i % 2 else float("nan"))
    tail = range(15 - END_WINDOW, 15)
    end = ph.end_stats()
    assert end["ev_end"] == pytest.approx(statistics.median([0.01 * i for i in tail]))
    assert end["ev_oracle_end"] == pytest.approx(statistics.median([0.02 * i for i in tail]))
    assert end["ceiling_end"] == 0.6
    plain = PretrainPhase()
    plain.record(0.3)
    assert plain.end_stats() == {"ev_end": 0.3}
    assert (
        PretrainPhase(end=end, from_cache="x").log()["value_pretrain/ev_oracle_end"] == end["ev_oracle_end"]
    )
    assert ph.cost()["end"] == end
    # a checkpoint from before the true-value columns: their earlier iterations count as NaN, and
    # nothing this object held (a cached phase's end) survives the load
    old = PretrainPhase(end={"ev_end": 0.9}, from_cache="entry")
    old.load_state_dict({"active": True, "steps_done": 12, "recent_ev": [0.01 * i for i in range(12)]})
    assert old.end == {} and old.from_cache is None and len(old.recent_oracle) == 12
    old.record(0.5, 0.4, 0.6)
    assert old.end_stats() == {
        "ev_end": pytest.approx(statistics.median([0.01 * i for i in range(3, 12)] + [0.5])),
        "ev_oracle_end": 0.4,
        "ceiling_end": 0.6,
    }
