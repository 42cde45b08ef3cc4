"""Build what a run trains from its config: the task, the policy and its tokenizer, the critic
(none for the critic-free estimator), wrapped in a `VapoModule`."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import torch

from vapo_lit import status
from vapo_lit.config import RunConfig
from vapo_lit.module import VapoModule

BUILD_MINUTES = {
    ("chain", "{}"): {"policy": 5, "reward model": 6},
    ("chain", '{"eval_per_bucket": 2, "max_n": 12}'): {"policy": 1, "reward model": 1},
    ("longchain", "{}"): {"policy": 17, "reward model": 3.5},
}
"""Minutes the built-in models took to build on a shared 2-core CPU, by (task, its options as sorted
JSON): the default chain task, the smoke preset's and the long preset's. The status line before a
build quotes them; other tasks and options say 'a few minutes or more'."""


def build_module(cfg: RunConfig) -> VapoModule:
    """Task, policy and critic as the config names them (no critic for the critic-free estimator).

    `model: random` is an untrained tiny Llama on the task's tokenizer with a critic on a copy of
    its backbone: seconds to build, for smoke runs and tests of the machinery (it learns nothing)."""
    from vapo_lit.models import DTYPES, enable_gradient_checkpointing
    from vapo_lit.models.value import ValueModel
    from vapo_lit.tasks import get_task

    t0 = time.perf_counter()
    status.say(
        f"task: {cfg.task}" + (f" {json.dumps(cfg.task_options, sort_keys=True)}" if cfg.task_options else "")
    )
    task = get_task(cfg.task, **task_options_of(cfg))
    critic_free = cfg.advantage_estimator == "grpo"
    # 64-true: build in float64 already (Lightning casts only after a checkpoint was loaded into the
    # module, so a float32 module would round a resumed run's float64 weights)
    dtype = "float64" if cfg.precision == "64-true" else cfg.model_dtype
    if cfg.model == "random":
        status.say(
            "policy: an untrained tiny Llama (model random)"
            + ("" if critic_free else "; critic: a copy of its backbone with a value head")
        )
        actor, tokenizer = random_tiny_policy(task, cfg.seed, heads=1 if vllm_shape(cfg) else 2)
        critic = None if critic_free else ValueModel.from_causal_lm(actor)
        if dtype != "auto":
            actor = actor.to(DTYPES[dtype])
            critic = critic if critic is None else critic.to(DTYPES[dtype])
    else:
        actor, tokenizer, critic = load_models(cfg, task, dtype, log=status.say if status.is_on() else None)
    say_models_ready(cfg, actor, critic, time.perf_counter() - t0)
    low = {p.dtype for p in actor.parameters()} & {torch.bfloat16, torch.float16}
    if low:
        warnings.warn(
            f"the actor's weights are {', '.join(map(str, low))} (model_dtype={cfg.model_dtype}): AdamW steps "
            "them in that precision and most updates at small learning rates round away; keep float32 master "
            "weights (--model_dtype float32) and compute in bf16 with --precision bf16-mixed",
            stacklevel=2,
        )
    if cfg.gradient_checkpointing:
        for model in (actor, critic):
            if model is not None:
                enable_gradient_checkpointing(model)
    return VapoModule(cfg, task, actor, tokenizer, critic)


def load_models(cfg: RunConfig, task, dtype: str = "float32", log=None):
    """(policy, tokenizer, critic or None for the critic-free estimator) of every `model` but
    `random`, loaded, or built and cached on first use: the built-in variant the config asks for and
    the critic's `critic_model` shape (vapo-ablate calls it before its workers start). `log(text)`:
    a line before each model is loaded or built, and a built-in model's build progress."""
    from vapo_lit.models import load_critic, load_policy, resolve_critic_init

    variant = builtin_variant(cfg)
    say = log or (lambda text: None)
    dirs = builtin_cache_dirs(cfg, task) if cfg.model == "builtin" else {}
    builtin_log = {"log": lambda text: say(f"  {text}")} if log is not None and cfg.model == "builtin" else {}
    say(policy_line(cfg, dirs))
    actor, tokenizer = load_policy(
        cfg.model, task, seed=cfg.model_seed, cache_dir=cfg.cache_dir, dtype=dtype, **variant, **builtin_log
    )
    if cfg.advantage_estimator == "grpo":
        return actor, tokenizer, None
    init = resolve_critic_init(cfg.critic_init, cfg.model)
    from_builtin = variant and init in ("reward_model", "actor")
    say(critic_line(cfg, init, dirs))
    critic = load_critic(
        cfg.critic_init,
        task,
        policy_spec=cfg.model,
        seed=cfg.model_seed,
        cache_dir=cfg.cache_dir,
        dtype=dtype,
        **critic_shape(cfg, task, variant if from_builtin else {}),
        **(builtin_log if init in ("reward_model", "actor") else {}),
    )
    return actor, tokenizer, critic


def builtin_cache_dirs(cfg: RunConfig, task) -> dict[str, Path]:
    """Where `load_models` finds (or builds) the built-in models of `cfg` (model builtin): the policy,
    and with the built-in reward model as critic, its base policy (the policy's, unless critic_model
    changes the shape) and the reward model."""
    from vapo_lit.cache import cache_root, config_key
    from vapo_lit.models import resolve_critic_init
    from vapo_lit.models.builtin import (
        RewardModelConfig,
        default_model,
        default_sft,
        policy_build_config,
        reward_build_config,
    )

    root, sft, variant = cache_root(cfg.cache_dir), default_sft(task), builtin_variant(cfg)
    policy = policy_build_config(
        task, variant.get("model_config") or default_model(task), sft, cfg.model_seed
    )
    dirs = {"policy": root / f"policy-{config_key(policy)}"}
    if (
        cfg.advantage_estimator != "grpo"
        and resolve_critic_init(cfg.critic_init, cfg.model) == "reward_model"
    ):
        shape = critic_shape(cfg, task, variant).get("model_config") or default_model(task)
        base = policy_build_config(task, shape, sft, cfg.model_seed)
        dirs["critic's base policy"] = root / f"policy-{config_key(base)}"
        rm = RewardModelConfig(**getattr(task, "rm_overrides", {}))
        dirs["reward model"] = (
            root / f"reward_model-{config_key(reward_build_config(base, rm, cfg.model_seed))}"
        )
    return dirs


def _build_note(cfg: RunConfig, what: str) -> str:
    """'about 5 min on a 2-core CPU' for a built-in model whose build was timed (BUILD_MINUTES)."""
    known = BUILD_MINUTES.get((cfg.task, json.dumps(cfg.task_options, sort_keys=True)), {})
    kind = "policy" if "policy" in what else "reward model"
    took = (
        f"{status.minutes(known[kind])} on a 2-core CPU"
        if kind in known
        else "a few minutes or more on a CPU"
    )
    return f"{took}, once: it is cached for later runs"


def policy_line(cfg: RunConfig, dirs: dict) -> str:
    """The status line before the policy is loaded or built (`dirs`: builtin_cache_dirs)."""
    if cfg.model != "builtin":
        return f"policy: loading {cfg.model} ({weights_size(cfg.model)}, as {cfg.model_dtype})"
    if not dirs["policy"].is_dir():
        return (
            f"policy: building the built-in base policy into {dirs['policy']} ({_build_note(cfg, 'policy')})"
        )
    return f"policy: the built-in base policy, from the cache ({dirs['policy']})"


def critic_line(cfg: RunConfig, init: str, dirs: dict) -> str:
    """The status line before the critic is loaded or built (`dirs`: builtin_cache_dirs)."""
    if init == "actor":
        return "critic: the policy's backbone with a fresh value head"
    if init != "reward_model":
        return f"critic: loading {init} ({weights_size(init)}, as {cfg.model_dtype})"
    if "reward model" not in dirs:  # not a built-in policy: load_critic says what is wrong
        return "critic: the built-in reward model"
    builds = [name for name in ("critic's base policy", "reward model") if not dirs[name].is_dir()]
    if builds:
        return (
            f"critic: building the built-in {' and '.join(builds)} into {dirs[builds[-1]]} "
            f"({_build_note(cfg, builds[-1])})"
        )
    return f"critic: the built-in reward model, from the cache ({dirs['reward model']})"


def weights_size(path: str) -> str:
    """'513 MB of weights' in a model folder (its safetensors and .bin files)."""
    files = [p for p in Path(path).expanduser().glob("*") if p.suffix in (".safetensors", ".bin")]
    return f"{fmt_bytes(sum(p.stat().st_size for p in files))} of weights"


def fmt_bytes(n: float) -> str:
    """Bytes in decimal units: '3.2 GB', '540 MB', '327 kB'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def say_models_ready(cfg: RunConfig, actor, critic, seconds: float) -> None:
    """A status line once the models are there: their sizes and what each checkpoint will take."""
    if not status.is_on():
        return
    from vapo_lit.checkpoints import checkpoint_bytes

    models = [m for m in (actor, critic) if m is not None]
    full, lean = checkpoint_bytes(models, optimizer=True), checkpoint_bytes(models, optimizer=False)
    size = (
        f"each checkpoint about {fmt_bytes(full)} (checkpoint_optimizer false: {fmt_bytes(lean)})"
        if cfg.checkpoint_optimizer
        else f"each checkpoint about {fmt_bytes(lean)} (no optimizer state)"
    )
    status.say(
        f"models ready in {seconds:.1f} s: policy {parameters(actor)}"
        + (f", critic {parameters(critic)}" if critic is not None else "")
        + f"; {size}"
    )


def parameters(model) -> str:
    """'135M parameters', '140k parameters' (tied ones counted once)."""
    n = sum(p.numel() for p in model.parameters())
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit} parameters"
    return f"{n} parameters"


def critic_shape(cfg: RunConfig, task, variant: dict) -> dict:
    """The built-in critic's options: the engine's `variant` of the built-in models, with `critic_model`'s
    overrides on its architecture (on the task's default one without a variant)."""
    if not cfg.critic_model:
        return variant
    from dataclasses import replace

    from vapo_lit.models.builtin import default_model

    return {
        **variant,
        "model_config": replace(variant.get("model_config") or default_model(task), **cfg.critic_model),
    }


def task_options_of(cfg: RunConfig) -> dict:
    """The options the task is built with (a task that takes a tokenizer gets the local model's; one
    that takes a tools_prompt gets the run's unless its options name one)."""
    from vapo_lit.tasks import option_names

    options = dict(cfg.task_options)
    valid = option_names(cfg.task)
    if (
        cfg.model not in ("builtin", "random")
        and "tokenizer" not in options
        and valid is not None
        and "tokenizer" in valid
    ):
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
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


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
