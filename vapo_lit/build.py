"""Build what a run trains from its config: the task, the policy and its tokenizer, the critic
(none for the critic-free estimator), wrapped in a `VapoModule`."""
from __future__ import annotations

import warnings

import torch

from vapo_lit.config import RunConfig
from vapo_lit.module import VapoModule


def build_module(cfg: RunConfig) -> VapoModule:
    """Task, policy and critic as the config names them (no critic for the critic-free estimator).

    `model: random` is an untrained tiny Llama on the task's tokenizer with a critic on a copy of
    its backbone: seconds to build, for smoke runs and tests of the machinery (it learns nothing)."""
    from vapo_lit.models import DTYPES, enable_gradient_checkpointing
    from vapo_lit.models.value import ValueModel
    from vapo_lit.tasks import get_task

    task = get_task(cfg.task, **task_options_of(cfg))
    critic_free = cfg.advantage_estimator == "grpo"
    # 64-true: build in float64 already (Lightning casts only after a checkpoint was loaded into the
    # module, so a float32 module would round a resumed run's float64 weights)
    dtype = "float64" if cfg.precision == "64-true" else cfg.model_dtype
    if cfg.model == "random":
        actor, tokenizer = random_tiny_policy(task, cfg.seed, heads=1 if vllm_shape(cfg) else 2)
        critic = None if critic_free else ValueModel.from_causal_lm(actor)
        if dtype != "auto":
            actor = actor.to(DTYPES[dtype])
            critic = critic if critic is None else critic.to(DTYPES[dtype])
    else:
        actor, tokenizer, critic = load_models(cfg, task, dtype)
    low = {p.dtype for p in actor.parameters()} & {torch.bfloat16, torch.float16}
    if low:
        warnings.warn(f"the actor's weights are {', '.join(map(str, low))} (model_dtype={cfg.model_dtype}): AdamW steps "
                      "them in that precision and most updates at small learning rates round away; keep float32 master "
                      "weights (--model_dtype float32) and compute in bf16 with --precision bf16-mixed", stacklevel=2)
    if cfg.gradient_checkpointing:
        for model in (actor, critic):
            if model is not None:
                enable_gradient_checkpointing(model)
    return VapoModule(cfg, task, actor, tokenizer, critic)


def load_models(cfg: RunConfig, task, dtype: str = "float32"):
    """(policy, tokenizer, critic or None for the critic-free estimator) of every `model` but
    `random`, loaded, or built and cached on first use: the built-in variant the config asks for and
    the critic's `critic_model` shape (vapo-ablate calls it before its workers start)."""
    from vapo_lit.models import load_critic, load_policy, resolve_critic_init

    variant = builtin_variant(cfg)
    actor, tokenizer = load_policy(cfg.model, task, seed=cfg.model_seed, cache_dir=cfg.cache_dir, dtype=dtype,
                                   **variant)
    if cfg.advantage_estimator == "grpo":
        return actor, tokenizer, None
    from_builtin = variant and resolve_critic_init(cfg.critic_init, cfg.model) in ("reward_model", "actor")
    critic = load_critic(cfg.critic_init, task, policy_spec=cfg.model, seed=cfg.model_seed, cache_dir=cfg.cache_dir,
                         dtype=dtype, **critic_shape(cfg, task, variant if from_builtin else {}))
    return actor, tokenizer, critic


def critic_shape(cfg: RunConfig, task, variant: dict) -> dict:
    """The built-in critic's options: the engine's `variant` of the built-in models, with `critic_model`'s
    overrides on its architecture (on the task's default one without a variant)."""
    if not cfg.critic_model:
        return variant
    from dataclasses import replace

    from vapo_lit.models.builtin import default_model

    return {**variant, "model_config": replace(variant.get("model_config") or default_model(task), **cfg.critic_model)}


def task_options_of(cfg: RunConfig) -> dict:
    """The options the task is built with (a task that takes a tokenizer gets the local model's; one
    that takes a tools_prompt gets the run's unless its options name one)."""
    from vapo_lit.tasks import option_names

    options = dict(cfg.task_options)
    valid = option_names(cfg.task)
    if cfg.model not in ("builtin", "random") and "tokenizer" not in options and valid is not None and "tokenizer" in valid:
        options["tokenizer"] = cfg.model  # a task on your own model uses that model's tokenizer
    if "tools_prompt" not in options and valid is not None and "tools_prompt" in valid:
        options["tools_prompt"] = cfg.tools_prompt
    return options


def vllm_shape(cfg: RunConfig) -> bool:
    """Whether the built-in or random models take the shape vLLM's CPU backend runs (builtin_shape:
    vllm, or auto with rollout_engine=vllm); that backend refuses the default head size of 16."""
    return cfg.builtin_shape == "vllm" or (cfg.builtin_shape == "auto" and cfg.rollout_engine == "vllm")


def builtin_variant(cfg: RunConfig) -> dict:
    """load_policy's options for the built-in models a run gets: the vLLM variant when vllm_shape
    (vapo_lit.models.builtin.vllm_model: one attention head of 64), else none (the default models)."""
    if cfg.model != "builtin" or not vllm_shape(cfg):
        return {}
    from vapo_lit.models.builtin import vllm_model
    from vapo_lit.tasks import get_task

    return {"model_config": vllm_model(get_task(cfg.task, **cfg.task_options))}


def random_config(task, heads: int = 2):
    """The config of `model: random` (heads=1 under vllm_shape: head size 32, which vLLM's CPU
    backend runs, instead of 16)."""
    from transformers import LlamaConfig

    tok = task.tokenizer
    return LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=1024,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def policy_config(cfg: RunConfig, task):
    """The transformers config of the policy `cfg` builds, without building or loading it (preflight)."""
    if cfg.model == "random":
        return random_config(task, heads=1 if vllm_shape(cfg) else 2)
    if cfg.model == "builtin":
        from vapo_lit.models.builtin import default_model, llama_config

        return llama_config(task, builtin_variant(cfg).get("model_config") or default_model(task))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(cfg.model, local_files_only=True)


def random_tiny_policy(task, seed: int, heads: int = 2):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(random_config(task, heads)), task.tokenizer
