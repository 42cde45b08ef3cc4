"""Named starting points (deltas from `RunConfig()`'s vanilla/paper values).

* `default`: the paper's recipe (its ratios) scaled to the built-in task and tiny model on a
  2-core CPU (`make demo`); every departure is listed with its reason below.
* `long`: the same ratios on the built-in long chain-of-thought task (longchain: responses of 23 to
  2,003 tokens), for Table 1 in the regime VAPO is about (`vapo-ablate --grid table1 --preset long`),
  with a critic trained harder than the paper's ratio in value pretraining (the preset's comments
  say why; the measurements are on the results pages they point to).
* `smoke`: a few iterations on a shrunken task, to check that everything runs (tests, CI).
* `paper`: VAPO section 5.1 hyperparameters for GPU users with a real model
  (512 prompts x 16, mini-batch 512, actor lr 1e-6, critic lr 2e-6, 50 warmup steps, alpha 0.05).
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    "default": {
        # The paper's recipe scaled to the built-in chain task on a 2-core CPU. Its ratios are kept:
        # 16 samples per prompt, 16 mini-batches per rollout, critic lr = 2 x actor lr, 50 value-
        # pretraining steps, Clip-Higher 0.2 / 0.28, mu 0.1, lambda_critic 1. Only what size forces
        # is scaled (how it was chosen: docs/results/table1/index.md, "How the preset was chosen"):
        #   * 128 responses per step (8 prompts x 16) instead of 8192 (512 x 16), mini-batch 8
        #     (128 / 16) instead of 512: 2 CPU cores;
        #   * learning rates actor 3e-5 / critic 6e-5 (paper 1e-6 / 2e-6 for a 7B-32B model): a
        #     140k-parameter model needs larger steps; at a third of this rate the clip almost never
        #     binds (Clip-Higher would be a no-op), at this one both clip sides do (the measurement is
        #     in docs/results/table1/index.md, "How the preset was chosen");
        #   * alpha 1.0 instead of 0.05: responses here are 11-223 tokens, not thousands; alpha = 1
        #     gives lambda_policy 0.95 at l = 20 and 0.9955 at l = 223, the range alpha = 0.05
        #     gives the paper's 400-4000-token responses (docs/algorithm.md);
        #   * 30 PPO updates with an eval every 5 on 32 problems x 8 samples (avg@8; the paper's
        #     avg@32 costs 4x more), so curves show speed, not only the end point: the task
        #     saturates well before the last update (docs/results/table1/index.md).
        "ppo": {
            "actor_lr": 3e-5,
            "critic_lr": 6e-5,
            "responses_per_step": 128,
            "mini_batch_size": 8,
            "micro_batch_size": 8,
        },
        "vapo": {
            "alpha": 1.0,
            "value_pretrain_steps": 50,
            "value_pretrain_min_ev": None,
            "samples_per_prompt": 16,
            "eps_high": 0.28,
            "mu": 0.1,
            "lambda_critic": 1.0,
        },
        "steps": 30,
        "eval_every": 5,
        "eval_problems": 32,
        "eval_k": 8,
    },
    "long": {
        # Table 1 where VAPO lives: the built-in longchain task, responses of 23-2,003
        # tokens in one batch (vapo_lit/tasks/longchain.py), the tiny model's base policy and reward
        # model built for it. The paper's ratios are kept as in `default` (16 samples per prompt, 16
        # mini-batches per rollout, 50 value-pretraining steps, Clip-Higher 0.2 / 0.28, mu 0.1,
        # lambda_critic 1); scaled, each for its reason:
        #   * 64 responses per step (4 prompts x 16; mini-batch 4) instead of 128: responses here are
        #     several times longer on average, and a run must stay short on one core (its length and
        #     wall time: docs/results/table1-long/index.md, "The testbed");
        #   * the critic in value pretraining: lr 3e-4 (10 x the actor's) and 4 passes over each
        #     batch. At the paper's ratio (6e-5, one pass) the critic explains a small share of the
        #     ceiling (the true values' own explained variance against the returns) after the 50
        #     value-pretraining iterations; at 3e-4 x 4 passes most of it, on every seed
        #     (tools/critic_fit.yaml; docs/results/critic-fit/index.md; docs/guides/critic.md,
        #     "Settings that shape the critic"). In PPO the paper's ratio (6e-5, one pass): it scored
        #     as well as 3e-4 x 4 passes there and its explained variance against the true values
        #     held better late in PPO, at a quarter of the critic's compute in PPO
        #     (tools/critic_alpha.yaml; docs/results/critic-alpha/index.md, "The critic's rate in PPO");
        #   * alpha 0.5 instead of 0.05. lambda_policy^l = (1 - 1/(alpha l))^l is about e^(-1/alpha)
        #     at every length, so alpha sets how much of the reward reaches a response's first
        #     tokens through lambda (0.135 at 0.5, 2e-9 at 0.05) rather than scaling with length;
        #     at 0.05 the early tokens' credit comes from the critic alone. With the true state
        #     values (the oracle critic) 0.05 and 0.5 both beat GRPO; with the learned critic 0.05 is
        #     behind 0.5 with either critic, and one run stalled (tools/critic_alpha.yaml;
        #     docs/results/critic-alpha/index.md, "Alpha");
        #   * actor learning rate as `default` (chosen there; the same architecture, 2 layers of
        #     width 64, whose larger vocabulary and 2,048 positions make 196,480 parameters against
        #     the chain task's 139,520);
        #   * 100 PPO updates, eval every 10 on 32 problems (8 per length bucket) x 4 samples at top-p
        #     1.0 (the paper evaluates at 0.7, which cuts any error below 30% per step out of the
        #     samples: the compounding errors this task is built to show would be invisible).
        "task": "longchain",
        #   * micro-batches of one response (the update's math is the same for any micro-batch size):
        #     at these mixed lengths (23 to 2,003 tokens) a micro-batch of 4 pads every response to
        #     its longest one.
        #   * in PPO the critic trains on a replay of this batch and the 3 before it (ppo.critic_replay 4,
        #     as many steps, each over 4x the responses): of the levers piloted on the tuning seeds
        #     (tools/critic_hold.yaml: more passes, TD(0.95) targets, replay) it is the one whose fit
        #     against the true values ends at least level with its start on every seed
        #     (docs/results/critic-hold/index.md).
        "ppo": {
            "actor_lr": 3e-5,
            "critic_lr": 6e-5,
            "critic_epochs": 1,
            "critic_replay": 4,
            "responses_per_step": 64,
            "mini_batch_size": 4,
            "micro_batch_size": 1,
        },
        "vapo": {
            "alpha": 0.5,
            "value_pretrain_steps": 50,
            "value_pretrain_min_ev": None,
            "samples_per_prompt": 16,
            "value_pretrain_critic_lr": 3e-4,
            "value_pretrain_critic_epochs": 4,
            "eps_high": 0.28,
            "mu": 0.1,
            "lambda_critic": 1.0,
        },
        "steps": 100,
        "eval_every": 10,
        "eval_problems": 32,
        "eval_k": 4,
        "eval_top_p": 1.0,
    },
    "smoke": {
        "task_options": {"max_n": 12, "eval_per_bucket": 2},
        "ppo": {
            "actor_lr": 1e-4,
            "critic_lr": 1e-4,
            "responses_per_step": 16,
            "mini_batch_size": 8,
            "micro_batch_size": 4,
        },
        "vapo": {"alpha": 1.0, "value_pretrain_steps": 2, "samples_per_prompt": 4},
        "steps": 3,
        "eval_every": 2,
        "eval_k": 2,
        "checkpoint_every": 1,
    },
    "paper": {
        "ppo": {
            "actor_lr": 1e-6,
            "critic_lr": 2e-6,
            "responses_per_step": 8192,
            "mini_batch_size": 512,
            "micro_batch_size": 8,
            "lam": 0.95,
            "gamma": 1.0,
            "eps": 0.2,
            # memory-bounded passes (not in the paper; they do not change the result)
            "rollout_batch_size": 512,
            "logits_chunk": 512,
        },
        "gradient_checkpointing": True,
        "vapo": {
            "alpha": 0.05,
            "value_pretrain_steps": 50,
            "lambda_critic": 1.0,
            "eps_high": 0.28,
            "mu": 0.1,
            "samples_per_prompt": 16,
        },
        "eval_k": 32,
        "eval_top_p": 0.7,
        "eval_temperature": 1.0,
        "steps": 5000,
        "eval_every": 50,
    },
}


def preset_task_options(name: str, task: str) -> dict:
    """Preset `name`'s task options that `task` accepts: a preset made for the built-in tasks applies
    to a user's task only where the option means something there."""
    from vapo_lit.tasks import option_names

    options = PRESETS[name].get("task_options", {})
    try:
        valid = option_names(task)
    except ValueError:  # not a task: the config check says so in its own words
        return options
    return options if valid is None else {k: v for k, v in options.items() if k in valid}
