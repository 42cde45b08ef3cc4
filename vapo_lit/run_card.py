"""`run_card.json`: everything docs/algorithm.md says a run must record, with this project's answers."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from vapo_lit.config import COMPONENTS, OPTIONAL_COMPONENTS, RunConfig, to_dict
from vapo_lit.models import resolve_critic_init
from vapo_lit.tasks.env import is_environment


def run_card(cfg: RunConfig, module) -> dict:
    """Everything docs/algorithm.md says a run must record, with this project's answers."""
    card = _single_turn_card(cfg, module)
    if is_environment(module.task):
        card["multi_turn"] = multi_turn_card(cfg, module)
    return card


def multi_turn_card(cfg: RunConfig, module) -> dict:
    """What a multi-turn run adds (docs/algorithm.md "Multi-turn trajectories"): the segment definitions."""
    task = module.task
    return {
        "observations": cfg.observations,
        "gae_over_observations": {
            "skip": "GAE over the action tokens only: an observation span adds no residual and no decay",
            "step": "every action and observation token is a timestep with its own value and residual",
            "zero": "values zeroed on observation tokens, which take part in the recursion",
        }[cfg.observations],
        "action_step": "a token the policy sampled (action mask 1); behaviour log-probs exist for these only",
        "observation": "tokens the environment wrote after a tool call, appended to the context through the "
                       "rollout's KV cache; action mask 0, no loss, no log-prob",
        "segment": "one policy turn: up to a stop sequence (a tool call) or EOS (the final answer)",
        "reward": "the verifier's outcome on the whole transcript, on the last action token",
        "length_for_lambda": "action tokens of the episode",
        "token_counts": "losses, token-level denominator, positive NLL, entropy and clip statistics: action tokens only",
        "max_turns": getattr(task, "max_turns", None), "token_budget": module.max_new_tokens,
        "stop_sequences": list(getattr(task, "stop_sequences", ())),
        "tools": sorted(getattr(task, "tools", {})),
        "turn_limit": "a tool call on the last allowed turn ends the episode with reward 0 (truncated)",
        "malformed_calls": "answered with an 'error ...' observation; never an exception out of the rollout",
    }


def _single_turn_card(cfg: RunConfig, module) -> dict:
    sw, p = module.switches, cfg.ppo
    task = module.task
    return {
        "config": to_dict(cfg),
        "components_on": [c for c in COMPONENTS if c in cfg.components],
        "components_off": [c for c in COMPONENTS if c not in cfg.components],
        "optional_components_on": [c for c in OPTIONAL_COMPONENTS if c in cfg.components],
        "switches": to_dict(sw),
        "value_initialisation_and_warmup": {
            "critic_init": resolve_critic_init(cfg.critic_init, cfg.model),
            "value_pretraining": sw.value_pretraining,
            "warmup_steps_max": sw.value_pretrain_steps if sw.value_pretraining else 0,
            "warmup_stop_min_ev": sw.value_pretrain_min_ev if sw.value_pretraining else None,
            "warmup_data": "fresh rollouts of the frozen initial policy from the training prompt stream, "
                           "Monte-Carlo returns (lambda = 1), critic-only updates",
        },
        "update_frequencies": {
            "actor_updates_per_iteration": (p.responses_per_step // p.mini_batch_size) * p.ppo_epochs,
            "critic_updates_per_iteration": (p.responses_per_step // (p.critic_mini_batch_size or p.mini_batch_size))
                                            * p.critic_epochs,
            "order": "critic then actor, on the same rollout, advantages computed before either update",
        },
        "lambdas": {
            "lambda_policy": f"1 - 1/({sw.alpha} * l), clamped to [0, 1]" if sw.length_adaptive_gae else p.lam,
            "lambda_critic": sw.lambda_critic if sw.decoupled_gae else "same as lambda_policy",
            "length_definition": "number of valid response tokens (EOS included) of that response",
            "gamma": p.gamma,
            "state_values": ("the task's true values (oracle: success probability from each state, from per-kind "
                             "error rates measured on each batch); the critic trains and is measured, GAE ignores it"
                             if cfg.gae_values == "oracle" else "the critic's"),
        },
        "masks": {
            "terminal": "response ended with EOS: no value after the last token (bootstrap 0)",
            "truncated": ("response hit max_new_tokens: bootstrapped from V(state after the last token)"
                          if cfg.truncation == "bootstrap" else
                          "response hit max_new_tokens: scored by the verifier and treated as terminal (bootstrap 0)"),
            "truncation": cfg.truncation,
            "padding": "no TD residual; interior zeros are skipped as if cut out",
        },
        "token_denominator": (
            "token-level: valid tokens of the whole mini-batch (summed over micro-batches)"
            if sw.token_level_loss else
            "sample-level: mean over each response's tokens, then over the mini-batch's responses"
        ),
        "packed_batch_semantics": "no packing: one response per row, left-padded prompt, right-padded response",
        "positive_samples": {
            "rule": "verifier reward == 1",
            "nll_coefficient": sw.mu if sw.positive_lm_loss else 0.0,
            "nll_denominator": "positive tokens of the mini-batch; exactly 0 with none",
        },
        "rollout_budget": {
            "prompts_per_step": module.prompts_per_step,
            "samples_per_prompt": module.samples_per_prompt,
            "responses_per_step": p.responses_per_step,
            "max_new_tokens": module.max_new_tokens,
            "total_rollout_tokens": "see rollout/response_length x responses_per_step in metrics.csv",
            "dynamic_sampling": {
                "rule": "groups whose responses all score the same are dropped; prompt batches of prompts_per_step "
                        "are sampled until the batch holds prompts_per_step mixed groups (PPO iterations only)",
                "max_rounds": sw.dynamic_max_rounds,
                "when_the_rounds_run_out": "filled with the earliest uniform groups (rollout/dynamic_filled_groups)",
                "cost": "every sampled response token counts in perf/cumulative_tokens (rollout/dynamic_discarded_tokens)",
            } if sw.dynamic_sampling else None,
        },
        "sampling": {
            "temperature": p.temperature, "top_p": p.top_p,
            "recompute_logprobs": module.recompute_logprobs,  # ppo.recompute_logprobs resolved (None: auto)
            "behaviour_logprobs": ("recomputed by the training forward pass after sampling" if module.recompute_logprobs else
                                   "recorded at sampling time: log softmax(logits / temperature) of the sampled "
                                   f"token, before top-p truncation (rollout engine {cfg.rollout_engine!r})"),
            "eval": {"k": cfg.eval_k, "temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p},
            "truncated_importance_sampling_cap": p.tis_cap,  # None: off
        },
        "verifier": {
            "task": cfg.task, "version": getattr(task, "version", "?"),
            "failures": "an exception or timeout inside the verifier scores 0 and is counted apart as "
                        "rollout/verifier_errors",
        },
        "eps": {"eps_low": p.eps, "eps_high": sw.eps_high if sw.clip_higher else p.eps},
        "advantage_normalisation": "actor advantages whitened over valid tokens" if p.whiten_advantages else "none",
        "software": {"torch": torch.__version__, "lightning": L.__version__,
                     **({"vllm": getattr(sys.modules["vllm"], "__version__", "?")} if "vllm" in sys.modules else {})},
        "hardware": {**getattr(module, "hardware", {}), "world_size": module.trainer.world_size if module._trainer else 1,
                     "model_dtype": cfg.model_dtype,
                     "gradient_checkpointing": cfg.gradient_checkpointing,
                     "rollout_batch_size": p.rollout_batch_size, "logits_chunk": p.logits_chunk,
                     "memory_plan": plan.record() if (plan := getattr(module, "memory_plan", None)) else None,
                     "micro_batch_size": p.micro_batch_size},
    }


class RunCardWriter(Callback):
    """Writes run_card.json once the component callbacks have set the switches."""

    def __init__(self, run_dir: Path, extra: dict):
        self.run_dir, self.extra = Path(run_dir), extra

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        card = run_card(pl_module.cfg, pl_module)
        card.update(self.extra)
        from lightning.pytorch.loggers import WandbLogger

        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                card["wandb"] = {"id": lg.version, "project": pl_module.cfg.wandb_project,
                                 "group": pl_module.cfg.wandb_group or self.run_dir.name,
                                 "mode": lg.experiment.settings.mode}
                lg.experiment.config.update({"run_card": card}, allow_val_change=True)
        write_json(self.run_dir / "run_card.json", card)


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
