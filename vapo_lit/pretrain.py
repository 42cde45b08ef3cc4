"""Value pretraining as a phase of the run (VC-PPO, VAPO section 4.1).

The module owns a `PretrainPhase`: while it is active, iterations sample from the frozen initial
policy and update only the critic, on Monte-Carlo returns (lambda = 1). The `ValuePretraining`
callback decides when it ends (step count or explained variance). The pretrained critic is cached
under a key derived from the WHOLE resolved run config minus `CANNOT_AFFECT_PRETRAINING`, so a
setting added later changes the key unless someone declares here that it cannot matter.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vapo_lit.cache import cache_root, cached_build, config_key, verify_dir
from vapo_lit.config import to_dict, without_neutral
from vapo_lit.distributed import (
    barrier,
    broadcast_object,
    full_state_dict,
    load_full_state_dict,
    rank_and_world,
)

NAN = float("nan")
END_WINDOW = 10
"""Iterations whose median is 'the critic at the end of value pretraining' (report/critic.py's LAST_VP)."""
CACHE_NAME = "pretrained-critic"
CACHE_VERSION = 3
"""Bump when the pretraining code changes what it produces (3: entries carry the phase's cost)."""

CANNOT_AFFECT_PRETRAINING = (
    # where and how a run is recorded
    "out_dir",
    "name",
    "wandb",
    "wandb_project",
    "wandb_group",
    "wandb_job_type",
    "threads",
    "cache_dir",
    "checkpoint_every",
    "checkpoint_keep",
    "samples_per_iteration",
    "print_sample_every",
    # the PPO phase after pretraining: actor updates, advantages, evaluation, run length
    "steps",
    "eval_every",
    "eval_k",
    "eval_top_p",
    "eval_temperature",
    "eval_problems",
    "ppo.actor_lr",
    "ppo.lam",
    "ppo.eps",
    "ppo.ppo_epochs",
    "ppo.whiten_advantages",
    "ppo.tis_cap",
    "ppo.critic_replay",
    # memory given to a sampler, not what it samples
    "vllm_kv_cache_gib",
    # components and their values: replaced in the key by what pretraining uses of them
    # (value_pretrain_steps, value_pretrain_min_ev and the effective samples per prompt)
    "components",
    "vapo",
)
"""Config paths left out of the pretrained-critic cache key. Everything else is in it."""


@dataclass
class PretrainPhase:
    """Where value pretraining stands (saved in every checkpoint)."""

    active: bool = False
    steps_done: int = 0
    last_ev: float = float("nan")
    """Explained variance (against Monte-Carlo returns) of the critic on the last pretraining batch,
    measured before that batch's update."""
    recent_ev: list = field(default_factory=list)
    """Every pretraining iteration's explained variance (NaN where a batch's returns were all equal)."""
    recent_oracle: list = field(default_factory=list)
    """Every pretraining iteration's [explained variance against the true values, their ceiling]
    on a task with true values (NaN elsewhere)."""
    end: dict = field(default_factory=dict)
    """The cached phase's `end_stats`, for a phase loaded from the cache (its iterations were not run
    here)."""
    from_cache: str | None = None
    """The cache entry the pretrained critic was loaded from, if it was."""
    finished: bool = False
    seconds: float = 0.0
    """Wall time of the phase's iterations (that of the run that computed it, for a cached critic)."""
    tokens: float = 0.0
    """Response tokens the phase sampled (likewise)."""

    def state_dict(self) -> dict:
        return asdict(self)

    def record(self, ev: float, ev_oracle: float = NAN, ceiling: float = NAN) -> None:
        """One pretraining iteration's explained variance (and, on a task with true values, the
        critic's against them and the true values' own ceiling)."""
        self.last_ev = ev
        self.recent_ev = [*self.recent_ev, ev]
        self.recent_oracle = [*self.recent_oracle, [ev_oracle, ceiling]]

    def end_stats(self) -> dict:
        """Medians over the phase's last END_WINDOW iterations: explained variance against returns,
        against the true values, and the ceiling (the critic report's 'end of value pretraining');
        the cached ones for a phase loaded from the cache."""
        if self.end:
            return dict(self.end)
        tail = self.recent_oracle[-END_WINDOW:]
        columns = (self.recent_ev[-END_WINDOW:], [x for x, _ in tail], [c for _, c in tail])
        out = {}
        for name, xs in zip(("ev_end", "ev_oracle_end", "ceiling_end"), columns):
            finite = [x for x in xs if x == x]
            if finite:
                out[name] = statistics.median(finite)
        return out

    def recent_ev_median(self, window: int) -> float:
        """The median explained variance of the last `window` iterations (those with one), NaN until
        `window` iterations have run."""
        last = self.recent_ev[-window:]
        finite = [x for x in last if x == x]
        return statistics.median(finite) if len(last) >= window and finite else float("nan")

    def log(self) -> dict:
        """The phase's outcome as metrics (logged with the first row after it)."""
        out = {
            "value_pretrain/steps": self.steps_done,
            "value_pretrain/final_ev": self.last_ev,
            **{f"value_pretrain/{k}": v for k, v in self.end_stats().items()},
        }
        return {**out, "value_pretrain/from_cache": 1.0} if self.from_cache else out

    def cost(self) -> dict:
        """What the cache entry keeps besides the critic: how far the phase went, where it ended
        (`end_stats`) and what it cost."""
        return {
            "steps_done": self.steps_done,
            "last_ev": self.last_ev,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "end": self.end_stats(),
        }

    def load_state_dict(self, state: dict) -> None:
        """The saved phase; fields a checkpoint from before they existed lacks take their defaults
        (never what this object held), and the true-value columns of its earlier iterations are NaN."""
        fresh = PretrainPhase()
        for k in asdict(fresh):
            setattr(self, k, state.get(k, getattr(fresh, k)))
        missing = len(self.recent_ev) - len(self.recent_oracle)
        if missing > 0:
            self.recent_oracle = [[NAN, NAN]] * missing + list(self.recent_oracle)


@dataclass(frozen=True)
class Plan:
    """The phase as a component asks for it (`Component.before_ppo`: value pretraining), its values
    named as in the config's vapo section: at most `value_pretrain_steps` iterations, or until the
    median explained variance of the last `value_pretrain_ev_window` reaches `value_pretrain_min_ev`
    (the component's rule), at the critic's own learning rate and passes (each None: the PPO ones).
    Whatever it asks, the phase's critic targets are Monte-Carlo returns on the critic's own values."""

    value_pretrain_steps: int
    value_pretrain_min_ev: float | None = None
    value_pretrain_ev_window: int = 1
    value_pretrain_critic_lr: float | None = None
    value_pretrain_critic_epochs: int | None = None


def phase_critic(ppo, values) -> tuple[float, int]:
    """The critic's (learning rate, passes per batch) during value pretraining: `values`'
    value_pretrain_critic_lr / _epochs (the config's vapo section, or the phase's `Plan`), each
    None meaning ppo's critic_lr / critic_epochs."""
    lr, epochs = values.value_pretrain_critic_lr, values.value_pretrain_critic_epochs
    return (ppo.critic_lr if lr is None else lr), (ppo.critic_epochs if epochs is None else epochs)


def cache_key(
    cfg,
    *,
    steps: int,
    min_ev,
    samples_per_prompt: int,
    max_new_tokens: int,
    task_version: str,
    ev_window: int = 1,
) -> dict:
    """Everything that determines a pretrained critic: the run config minus CANNOT_AFFECT_PRETRAINING,
    plus the effective pretraining values. The critic's learning rate and passes are the phase's own
    (vapo.value_pretrain_critic_lr / _epochs where set), in ppo's place: a critic pretrained at the
    same rate keeps its key whichever setting named that rate."""
    resolved = without_neutral(to_dict(cfg))
    resolved["ppo"]["critic_lr"], resolved["ppo"]["critic_epochs"] = phase_critic(cfg.ppo, cfg.vapo)
    for path in CANNOT_AFFECT_PRETRAINING:
        node, *rest = path.split(".")
        if rest:
            resolved.get(node, {}).pop(rest[0], None)
        else:
            resolved.pop(node, None)
    window = {} if min_ev is None or ev_window == 1 else {"value_pretrain_ev_window": ev_window}
    return {
        "config": resolved,
        "value_pretrain_steps": steps,
        "value_pretrain_min_ev": min_ev,
        **window,
        "samples_per_prompt": samples_per_prompt,
        "max_new_tokens": max_new_tokens,
        "task_version": task_version,
        "version": CACHE_VERSION,
    }


def entry_dir(key: dict, cache_dir) -> Path:
    return cache_root(cache_dir) / f"{CACHE_NAME}-{config_key(key)}"


def load_cached(key: dict, cache_dir) -> tuple[Path, dict] | None:
    """(entry folder, its stats) when a complete entry exists, else None."""
    entry = entry_dir(key, cache_dir)
    if verify_dir(entry) is not None:
        return None
    return entry, json.loads((entry / "pretraining.json").read_text())


def save(key: dict, cache_dir, critic, stats: dict, state_dict: dict | None = None) -> Path:
    """Write the critic (or `state_dict`, its full weights) and its stats as a verified cache entry (atomic)."""

    def build(tmp: Path) -> None:
        critic.save_pretrained(tmp, state_dict=state_dict)
        (tmp / "pretraining.json").write_text(json.dumps(stats))

    return cached_build(CACHE_NAME, key, build, cache_dir=cache_dir)


def restore(key: dict, cache_dir, critic) -> PretrainPhase | None:
    """Load the cached pretrained critic for `key` into `critic` and return its phase (finished,
    with the computing run's cost), or None when the cache holds none. Every rank calls it: rank 0
    reads the cache (other machines may not share its disk) and hands the weights to the rest."""
    zero = rank_and_world()[0] == 0
    cached = broadcast_object(load_cached(key, cache_dir) if zero else None)
    if cached is None:
        return None
    entry, stats = cached
    load_full_state_dict(critic, _read_critic(entry, critic) if zero else None)
    return PretrainPhase(
        steps_done=stats["steps_done"],
        last_ev=stats["last_ev"],
        from_cache=str(entry),
        finished=True,
        seconds=stats["seconds"],
        tokens=stats["tokens"],
        end=stats.get("end", {}),
    )


def store(key: dict, cache_dir, critic, phase: PretrainPhase) -> None:
    """Cache the just-pretrained `critic` with its phase's cost. Every rank calls it (gathering a
    sharded critic is a collective); rank 0 writes."""
    state = full_state_dict(critic)
    if rank_and_world()[0] == 0:
        save(key, cache_dir, critic, phase.cost(), state_dict=state)
    barrier()


def _read_critic(directory, critic) -> dict:
    from vapo_lit.models.value import ValueModel

    return ValueModel.from_pretrained(directory, dtype=next(critic.parameters()).dtype).state_dict()
