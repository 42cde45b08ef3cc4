"""`run_card.json`: everything docs/algorithm.md says a run must record, with this run's values, each
derived from the settings the module uses, and under `definitions` the docs section that defines
each field."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from vapo_lit import cpu_pin
from vapo_lit.config import COMPONENTS, OPTIONAL_COMPONENTS, RunConfig, to_dict
from vapo_lit.models import resolve_critic_init
from vapo_lit.tasks.env import is_environment

_ALGORITHM = "docs/algorithm.md"
_COMPONENT_TABLE = (
    f"{_ALGORITHM}#the-seven-components-each-can-be-switched-off-off-gives-the-vanilla-ppo-behaviour"
)
DEFINITIONS = {
    "config": "docs/reference/configuration.md#configuration-reference",
    "components_on": _COMPONENT_TABLE,
    "components_off": _COMPONENT_TABLE,
    "optional_components_on": "docs/components.md#baselines-and-optional-components",
    "switches": "docs/reference/configuration.md#vapo-values-the-components-apply",
    "value_initialisation_and_warmup": _COMPONENT_TABLE,
    "value_initialisation_and_warmup.critic_init": "docs/reference/configuration.md#run",
    "update_frequencies": "docs/architecture.md#architecture",
    "lambdas": f"{_ALGORITHM}#formulas",
    "lambdas.estimator": "docs/guides/ablation-grids.md#a-fair-critic-free-baseline-grpo-and-dapo",
    "lambdas.state_values": "docs/guides/critic.md#the-oracle-critic",
    "masks": f"{_ALGORITHM}#formulas",
    "masks.truncation": f"{_ALGORITHM}#this-projects-decisions-where-the-paper-is-silent",
    "token_denominator": f"{_ALGORITHM}#formulas",
    "packed_batch_semantics": "docs/guides/rollout-engines.md#rollout-engines",
    "positive_samples": f"{_ALGORITHM}#formulas",
    "rollout_budget.total_rollout_tokens": "docs/guides/reports.md#metric-glossary",
    "rollout_budget.dynamic_sampling": "docs/guides/ablation-grids.md#a-fair-critic-free-baseline-grpo-and-dapo",
    "sampling.behaviour_logprobs": "docs/guides/rollout-engines.md#rollout-engines",
    "sampling.recompute_logprobs": "docs/guides/scaling-out.md#one-gpu",
    "sampling.truncated_importance_sampling_cap": "docs/guides/vllm.md#settings",
    "verifier": "docs/guides/extending.md#adding-a-task",
    "eps": f"{_ALGORITHM}#formulas",
    "advantage_normalisation": "docs/reference/configuration.md#ppo-ppo-settings",
    "hardware": "docs/guides/scaling-out.md#one-gpu",
    "base_models": "docs/guides/ablation-grids.md#storage-workers-resume",
    "multi_turn": f"{_ALGORITHM}#multi-turn-trajectories-beyond-the-paper",
    "multi_turn.max_turns": "docs/guides/multi-turn.md#multi-turn-environments-tools-and-observations",
    "multi_turn.tools": "docs/guides/multi-turn.md#multi-turn-environments-tools-and-observations",
}
"""Card field (a dotted path) -> the docs section that defines what its value means."""


def run_card(cfg: RunConfig, module, hardware: dict | None = None) -> dict:
    """Everything docs/algorithm.md says a run must record, with this run's values (derived from the
    settings the module uses) and, under `definitions`, where docs/ defines each field."""
    sw, p, loss = module.switches, cfg.ppo, module.loss_settings
    gae = module.advantage_settings(pretraining=False)
    card = {
        **_components(cfg, sw),
        "value_initialisation_and_warmup": _warmup(cfg, module),
        "update_frequencies": _update_frequencies(p),
        "lambdas": _lambdas(module),
        "masks": {"truncation": cfg.truncation},
        "token_denominator": loss.aggregation,
        "packed_batch_semantics": "none",
        "positive_samples": {"nll_coefficient": 0.0 if loss.mu is None else loss.mu},
        "rollout_budget": _rollout_budget(module),
        "sampling": _sampling(cfg, module),
        "verifier": {"task": cfg.task, "version": getattr(module.task, "version", "?")},
        "eps": {"eps_low": loss.eps_low, "eps_high": loss.eps_high},
        "advantage_normalisation": "whitened" if gae.whiten else "none",
        "software": _software(),
        "base_models": _base_models(cfg, module),
        "hardware": _hardware(cfg, module, hardware or {}),
    }
    if is_environment(module.task):
        card["multi_turn"] = multi_turn_card(cfg, module)
    card["definitions"] = {field: link for field, link in DEFINITIONS.items() if _has(card, field)}
    return card


def _has(card: dict, field: str) -> bool:
    """Whether the dotted path `field` names an entry of `card`."""
    node = card
    for key in field.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _components(cfg: RunConfig, sw) -> dict:
    return {
        "config": to_dict(cfg),
        "components_on": [c for c in COMPONENTS if c in cfg.components],
        "components_off": [c for c in COMPONENTS if c not in cfg.components],
        "optional_components_on": [c for c in OPTIONAL_COMPONENTS if c in cfg.components],
        "switches": to_dict(sw),
    }


def _warmup(cfg: RunConfig, module) -> dict:
    """The critic's initialisation and value pretraining (the module's plan for the phase before
    PPO), with the lambda its targets use then."""
    plan = module.pretrain_plan
    return {
        "critic_init": resolve_critic_init(cfg.critic_init, cfg.model),
        "value_pretraining": plan is not None,
        "warmup_steps_max": plan.value_pretrain_steps if plan else 0,
        "warmup_stop_min_ev": plan.value_pretrain_min_ev if plan else None,
        "warmup_lambda_critic": module.advantage_settings(pretraining=True).lam_critic if plan else None,
        "warmup_critic_lr_epochs": list(module.critic_schedule(pretraining=True)) if plan else None,
    }


def _update_frequencies(p) -> dict:
    return {
        "actor_updates_per_iteration": (p.responses_per_step // p.mini_batch_size) * p.ppo_epochs,
        "critic_updates_per_iteration": (
            p.responses_per_step // (p.critic_mini_batch_size or p.mini_batch_size)
        )
        * p.critic_epochs,
    }


def _lambdas(module) -> dict:
    """The GAE settings of a PPO iteration (VapoModule.advantage_settings): lambda_policy fixed or
    'length_adaptive' (with its alpha), lambda_critic its own or the policy's."""
    gae = module.advantage_settings(pretraining=False)
    return {
        "estimator": gae.estimator,
        "lambda_policy": gae.lam if gae.alpha is None else "length_adaptive",
        "alpha": gae.alpha,
        "lambda_critic": "lambda_policy" if gae.lam_critic is None else gae.lam_critic,
        "gamma": gae.gamma,
        "state_values": gae.values,
    }


def _rollout_budget(module) -> dict:
    sw = module.switches
    return {
        "prompts_per_step": module.prompts_per_step,
        "samples_per_prompt": module.samples_per_prompt,
        "responses_per_step": module.cfg.ppo.responses_per_step,
        "max_new_tokens": module.max_new_tokens,
        "total_rollout_tokens": "perf/cumulative_tokens",  # the metrics.csv column that counts them
        "dynamic_sampling": {"max_rounds": sw.dynamic_max_rounds} if sw.dynamic_sampling else None,
    }


def _sampling(cfg: RunConfig, module) -> dict:
    """The rollout's sampling, and where the behaviour log-probs come from: the update's own forward
    ('recomputed', ppo.recompute_logprobs resolved) or the rollout engine ('sampler')."""
    p, recompute = cfg.ppo, module.recompute_logprobs
    return {
        "temperature": p.temperature,
        "top_p": p.top_p,
        "recompute_logprobs": recompute,
        "behaviour_logprobs": "recomputed" if recompute else "sampler",
        "rollout_engine": cfg.rollout_engine,
        "eval": {"k": cfg.eval_k, "temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p},
        "truncated_importance_sampling_cap": p.tis_cap,  # None: off
    }


def _software() -> dict:
    vllm = sys.modules.get("vllm")
    # the instruction set torch's CPU kernels dispatch to (AVX2, AVX512, ...): float32 results, the
    # built-in models' training among them, differ in their last bits from one to another
    return {
        "torch": torch.__version__,
        "lightning": L.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # the instruction set a grid held this run to (vapo_lit/cpu_pin.py), and any of its variables set
        **({"cpu_pin": cpu_pin.current()} if cpu_pin.current() else {}),
        **({"cpu_pin_env": cpu_pin.recorded()} if cpu_pin.recorded() else {}),
        **({"vllm": getattr(vllm, "__version__", "?")} if vllm is not None else {}),
    }


def _base_models(cfg: RunConfig, module) -> dict:
    """What the run started from: for the built-in models, each cache entry and the SHA-256 of its
    weights (its manifest's, checked when loaded). Runs paired by seed must start from the same
    weights, and float32 builds on CPUs of different instruction sets differ."""
    from vapo_lit.build import builtin_cache_dirs
    from vapo_lit.cache import MANIFEST, cache_root

    loaded = str(getattr(getattr(module.actor, "config", None), "name_or_path", "") or "")
    if cfg.model != "builtin" or Path(loaded).resolve().parent != cache_root(cfg.cache_dir).resolve():
        # a named model, or models built by the caller and handed to the module
        return {"policy": {"model": str(cfg.model), **({"loaded_from": loaded} if loaded else {})}}

    out = {}
    for what, directory in builtin_cache_dirs(cfg, module.task).items():
        try:
            files = json.loads((directory / MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            files = {}
        out[what] = {"cache": directory.name, "weights_sha256": files.get("model.safetensors")}
    return out


def _hardware(cfg: RunConfig, module, devices: dict) -> dict:
    """The Trainer's devices (as train() describes them), the world size, the memory settings and
    the CPU model (CPUs of one instruction set can still differ in the last bits of float32 results)."""
    p = cfg.ppo
    return {
        **devices,
        "world_size": module.trainer.world_size if module._trainer else 1,
        "model_dtype": cfg.model_dtype,
        "gradient_checkpointing": cfg.gradient_checkpointing,
        "rollout_batch_size": p.rollout_batch_size,
        "logits_chunk": p.logits_chunk,
        "memory_plan": plan.record() if (plan := getattr(module, "memory_plan", None)) else None,
        "micro_batch_size": p.micro_batch_size,
        "cpu": cpu_pin.cpu_model(),
    }


def multi_turn_card(cfg: RunConfig, module) -> dict:
    """What a multi-turn run adds (docs/algorithm.md "Multi-turn trajectories"): how GAE crosses
    observation spans, and the environment's limits."""
    task = module.task
    return {
        "observations": cfg.observations,
        "max_turns": getattr(task, "max_turns", None),
        "token_budget": module.max_new_tokens,
        "stop_sequences": list(getattr(task, "stop_sequences", ())),
        "tools": sorted(getattr(task, "tools", {})),
    }


class RunCardWriter(Callback):
    """Writes run_card.json once the component callbacks have set the switches; `hardware`
    describes the Trainer's devices, `extra` adds top-level fields."""

    def __init__(self, run_dir: Path, extra: dict, hardware: dict | None = None):
        self.run_dir, self.extra, self.hardware = Path(run_dir), extra, hardware

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        card = run_card(pl_module.cfg, pl_module, self.hardware)
        card.update(self.extra)
        from lightning.pytorch.loggers import WandbLogger

        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                card["wandb"] = {
                    "id": lg.version,
                    "project": pl_module.cfg.wandb_project,
                    "group": pl_module.cfg.wandb_group or self.run_dir.name,
                    "mode": lg.experiment.settings.mode,
                }
                lg.experiment.config.update({"run_card": card}, allow_val_change=True)
        write_json(self.run_dir / "run_card.json", card)


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
