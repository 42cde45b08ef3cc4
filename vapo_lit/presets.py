"""Named starting points (deltas from `RunConfig()`'s vanilla/paper values).

* `default`: the built-in task and tiny model on a 2-core CPU (the README's main job).
* `smoke`: a few iterations on a shrunken task, to check that everything runs (tests, CI).
* `paper`: VAPO section 5.1 hyperparameters for GPU users with a real model
  (512 prompts x 16, mini-batch 512, actor lr 1e-6, critic lr 2e-6, 50 warmup steps, alpha 0.05).
"""
from __future__ import annotations

PRESETS: dict[str, dict] = {
    "default": {
        # Tuned on the built-in chain task (responses 11-223 tokens): see README "Presets".
        "ppo": {"actor_lr": 5e-5, "critic_lr": 1e-3, "responses_per_step": 64, "mini_batch_size": 32,
                "micro_batch_size": 32, "warmup_steps": 4},
        # alpha chosen for this task's lengths: 0.05 gives lambda < 0.95 for every response
        # shorter than 400 tokens (SPEC.md); with alpha = 1, l = 20 -> 0.95, l = 200 -> 0.995.
        "vapo": {"alpha": 1.0, "value_pretrain_steps": 20, "value_pretrain_min_ev": 0.3, "samples_per_prompt": 8},
        "steps": 60, "eval_every": 20, "eval_problems": 64,
    },
    "smoke": {
        "task_options": {"max_n": 12, "eval_per_bucket": 2},
        "ppo": {"actor_lr": 1e-4, "critic_lr": 1e-4, "responses_per_step": 16, "mini_batch_size": 8,
                "micro_batch_size": 4},
        "vapo": {"alpha": 1.0, "value_pretrain_steps": 2, "samples_per_prompt": 4},
        "steps": 3, "eval_every": 2, "eval_k": 2, "checkpoint_every": 1,
    },
    "paper": {
        "ppo": {"actor_lr": 1e-6, "critic_lr": 2e-6, "responses_per_step": 8192, "mini_batch_size": 512,
                "micro_batch_size": 8, "lam": 0.95, "gamma": 1.0, "eps": 0.2,
                # memory-bounded passes (not in the paper; they do not change the result)
                "rollout_batch_size": 512, "logits_chunk": 512},
        "gradient_checkpointing": True,
        "vapo": {"alpha": 0.05, "value_pretrain_steps": 50, "lambda_critic": 1.0, "eps_high": 0.28, "mu": 0.1,
                 "samples_per_prompt": 16},
        "eval_k": 32, "eval_top_p": 0.7, "eval_temperature": 1.0, "steps": 5000, "eval_every": 50,
    },
}
