"""Value pretraining (VC-PPO, VAPO section 4.1): before any actor update, train the critic alone on
samples of the fixed initial policy with Monte-Carlo returns (lambda = 1), for `value_pretrain_steps`
iterations (paper: 50) or until its explained variance reaches `value_pretrain_min_ev`.
Off: actor and critic start updating together from the critic's initialisation.

The module runs the critic-only iterations while `pl_module.phase == "value_pretrain"`; this
callback decides when the phase ends and keeps the pretrained critic in the cache, keyed by
everything that determines it (initial policy, critic init, task, seed, sampling, critic
optimiser settings and these values), so every run of a sweep that shares them starts from the
same critic with a fresh critic optimiser instead of pretraining again.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from vapo_lit.cache import cache_root, cached_build, config_key, verify_dir
from vapo_lit.components.base import Component

CACHE_NAME = "pretrained-critic"


class ValuePretraining(Component):
    name = "value_pretraining"
    declares = ("value_pretraining", "value_pretrain_steps", "value_pretrain_min_ev")

    def __init__(self, **values):
        super().__init__(**values)
        self.steps_done = 0
        self.done = False
        self.last_ev = float("nan")
        self.from_cache: str | None = None

    # ------------------------------------------------------------------ cache
    def _key(self, pl_module) -> dict:
        return {"run": pl_module.critic_identity(), "pretraining": self.values}

    def _entry(self, pl_module) -> Path:
        key = self._key(pl_module)
        return cache_root(pl_module.cfg.cache_dir) / f"{CACHE_NAME}-{config_key(key)}"

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.done:  # resumed from a checkpoint after pretraining finished
            pl_module.phase = "ppo"
            return
        if self.steps_done:  # resumed in the middle of pretraining: continue it
            pl_module.phase = "value_pretrain"
            return
        entry = self._entry(pl_module)
        if verify_dir(entry) is None:
            stats = json.loads((entry / "pretraining.json").read_text())
            pl_module.load_critic_weights(entry)
            pl_module.reset_critic_optimizer()
            self.steps_done, self.last_ev, self.done = stats["steps_done"], stats["last_ev"], True
            self.from_cache = str(entry)
            pl_module.iteration = stats["steps_done"]  # same prompt stream as a run that pretrained
            pl_module.phase = "ppo"
        else:
            pl_module.phase = "value_pretrain"

    # ------------------------------------------------------------------ phase control
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.done or pl_module.phase != "value_pretrain":
            return
        self.steps_done += 1
        self.last_ev = float(pl_module.last_metrics.get("value/explained_variance", float("nan")))
        target = self.values["value_pretrain_min_ev"]
        reached = target is not None and not math.isnan(self.last_ev) and self.last_ev >= target
        if self.steps_done >= self.values["value_pretrain_steps"] or reached:
            self.done = True
            pl_module.phase = "ppo"
            pl_module.on_value_pretraining_end(self.steps_done, self.last_ev)
            stats = {"steps_done": self.steps_done, "last_ev": self.last_ev, "reached_min_ev": reached}

            def build(tmp: Path) -> None:
                pl_module.critic.save_pretrained(tmp)
                (tmp / "pretraining.json").write_text(json.dumps(stats))

            self.from_cache = None
            cached_build(CACHE_NAME, self._key(pl_module), build, cache_dir=pl_module.cfg.cache_dir)

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict:
        return {"steps_done": self.steps_done, "done": self.done, "last_ev": self.last_ev,
                "from_cache": self.from_cache}

    def load_state_dict(self, state: dict) -> None:
        self.steps_done = state["steps_done"]
        self.done = state["done"]
        self.last_ev = state["last_ev"]
        self.from_cache = state.get("from_cache")
