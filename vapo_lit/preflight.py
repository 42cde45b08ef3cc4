"""`preflight(cfg)`: everything a run needs from the outside world, checked before any folder is
created or any weight is loaded. One function, called by `train()` (so `vapo-train`, the ablation
workers and the sweep trials all get it), once per grid by `vapo-ablate`'s planner and once on the
sweep's base config.

It checks, each failure a `ValueError` of one line naming the setting, the value and what is valid:
the config's ranges (`config.validate`); that the output folder can be created and written; the
policy and critic model folders (a folder, a readable ``config.json``, weight files, a tokenizer
for the policy) and that ``critic_init`` fits the model; the task and its options, by building the
task (a data file is read and every record checked; unknown options are named with the valid
ones). It reads a few small files (configs, tokenizers, data) and writes nothing; it never loads
weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from vapo_lit.config import RunConfig, validate

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
CRITIC_CHOICES = (
    "--critic_init actor or auto (the policy's backbone with a fresh value head) or --critic_init PATH "
    "(a local value/reward model or HF causal-LM folder)"
)


BUILTIN_TASKS = ("chain", "longchain", "toolchain")
"""The tasks with a built-in base policy and reward model (vapo_lit.models.builtin)."""


def preflight(cfg: RunConfig) -> RunConfig:
    """Check `cfg` and everything it points at (module doc); returns `cfg`; raises ValueError."""
    validate(cfg)
    check_writable(cfg.out_dir, "out_dir")
    if cfg.cache_dir is not None:
        check_writable(cfg.cache_dir, "cache_dir")
    local_policy = cfg.model not in ("builtin", "random")
    if cfg.model == "builtin" and cfg.task not in BUILTIN_TASKS:
        raise ValueError(
            f"model='builtin' exists only for the built-in tasks ({', '.join(BUILTIN_TASKS)}), not {cfg.task!r}; "
            "pass --model PATH (a local HF causal-LM folder) or --model random"
        )
    if local_policy:
        check_model_dir(cfg.model, "model", tokenizer=True)
    needs_critic = cfg.advantage_estimator != "grpo" and cfg.model != "random"
    if needs_critic:
        if cfg.critic_init == "reward_model" and local_policy:
            raise ValueError(
                f"critic_init='reward_model' is built only for --model builtin, not for the local model "
                f"{cfg.model!r}; use {CRITIC_CHOICES}"
            )
        if cfg.critic_init not in ("auto", "reward_model", "actor"):
            check_model_dir(cfg.critic_init, "critic_init")
        check_critic_model(cfg)
    check_task(cfg)
    if cfg.rollout_engine == "vllm":
        check_vllm(cfg)
    return cfg


def check_vllm(cfg: RunConfig) -> None:
    """rollout_engine=vllm: vLLM installed and able to run the policy as the run will build it
    (vapo_lit.engines.vllm.preflight: install, dtype, model shape, KV-cache memory)."""
    import torch

    from vapo_lit.build import policy_config, task_options_of
    from vapo_lit.config import parse_devices
    from vapo_lit.devices import resolve_accelerator
    from vapo_lit.engines.vllm import preflight as vllm_preflight
    from vapo_lit.tasks import get_task

    accelerator = resolve_accelerator(cfg.accelerator)
    devices = parse_devices(cfg.devices)
    count = (
        len(devices)
        if isinstance(devices, list)
        else devices
        if isinstance(devices, int)
        else torch.cuda.device_count()
        if accelerator == "cuda"
        else 1
    )
    vllm_preflight(
        cfg, policy_config(cfg, get_task(cfg.task, **task_options_of(cfg))), accelerator, processes=count
    )


def preflight_grid(cells) -> None:
    """`preflight` once per distinct (task, options, model, critic) of a grid's cells; the first
    failure refuses the whole grid, naming the cell."""
    seen = set()
    for c in cells:
        key = json.dumps(
            [
                c.cfg.task,
                c.cfg.task_options,
                c.cfg.model,
                c.cfg.critic_init,
                c.cfg.advantage_estimator,
                c.cfg.out_dir,
                c.cfg.cache_dir,
            ],
            sort_keys=True,
            default=str,
        )
        if key in seen:
            continue
        seen.add(key)
        try:
            preflight(c.cfg)
        except ValueError as e:
            raise ValueError(
                f"cell {c.cfg.name} (row {c.row!r}, seed {c.seed}): {e}; nothing was started"
            ) from None


def check_critic_model(cfg: RunConfig) -> None:
    """`critic_model` shapes only the built-in critics, with TinyModelConfig's fields."""
    if not cfg.critic_model:
        return

    from vapo_lit.models.builtin import TinyModelConfig

    if cfg.model != "builtin" or cfg.critic_init not in ("auto", "reward_model", "actor"):
        raise ValueError(
            f"critic_model shapes the built-in critic (model=builtin, critic_init auto, reward_model or "
            f"actor), not model={cfg.model!r} with critic_init={cfg.critic_init!r}; drop it or use them"
        )
    fields = {f.name: f for f in dataclasses.fields(TinyModelConfig)}
    for key, value in cfg.critic_model.items():
        if key not in fields:
            raise ValueError(f"critic_model: unknown field {key!r}; valid: {', '.join(fields)}")
        kind = type(fields[key].default)
        if (
            isinstance(value, bool) != (kind is bool)
            or not isinstance(value, (int, float))
            or (kind is int and not isinstance(value, int))
            or (not isinstance(value, bool) and value <= 0)
        ):
            raise ValueError(
                f"critic_model.{key}={value!r} is not valid; expected a positive {kind.__name__}"
            )
    if cfg.critic_model.get("hidden_size", 64) % cfg.critic_model.get("num_attention_heads", 4):
        raise ValueError("critic_model: hidden_size must be a multiple of num_attention_heads")


def check_writable(path, flag: str) -> None:
    """`path` is a folder we may write in, or can be created as one (nothing is created here)."""
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {str(path)!r} exists and is not a folder")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{flag} {str(path)!r} cannot be created: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag} {str(path)!r} is not writable ({probe} does not allow writing; "
            "choose a folder you may write in)"
        )


def check_model_dir(path: str, flag: str, *, tokenizer: bool = False) -> None:
    """A local HF model folder: config.json that parses, weights, and (for a policy) a tokenizer."""
    p = Path(path).expanduser()
    valid = "a local HF model folder (config.json + weights, saved with save_pretrained)"
    if not p.exists():
        raise ValueError(
            f"{flag} {str(path)!r} does not exist; expected {valid}"
            + (" or 'builtin' / 'random'" if flag == "model" else "")
        )
    if not p.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is not a folder; expected {valid}")
    config = p / "config.json"
    if not config.is_file():
        raise ValueError(f"{flag} {str(path)!r} is not a model folder (no config.json); expected {valid}")
    try:
        data = json.loads(config.read_text())
        if not isinstance(data, dict) or "model_type" not in data:
            raise ValueError("no 'model_type' key")
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{flag} {str(path)!r}: config.json is not a model config ({e}); expected {valid}"
        ) from None
    if not any((p / w).is_file() for w in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        raise ValueError(
            f"{flag} {str(path)!r} holds no weights (none of {', '.join(WEIGHT_FILES)}); expected {valid}"
        )
    if tokenizer:
        from transformers import AutoTokenizer

        try:
            AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means "no usable tokenizer here"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(
                f"{flag} {str(path)!r}: cannot load its tokenizer ({type(e).__name__}: {first}); "
                "save the tokenizer into the model folder (tokenizer.save_pretrained)"
            ) from None


def check_task(cfg: RunConfig) -> None:
    """Build the task once: unknown options, bad values and every data-file defect surface here."""
    from vapo_lit.build import task_options_of
    from vapo_lit.tasks import get_task, option_names, task_factory
    from vapo_lit.tasks.env import is_environment

    task_factory(cfg.task)  # an unknown name or a class that cannot be imported: one line saying which
    valid = option_names(cfg.task)
    unknown = sorted(set(cfg.task_options) - set(valid)) if valid is not None else []
    if unknown:
        raise ValueError(
            f"task_options: unknown option(s) {', '.join(map(repr, unknown))} for task {cfg.task!r}; "
            + (f"valid: {', '.join(valid)}" if valid else "it takes none")
        )
    try:
        task = get_task(cfg.task, **task_options_of(cfg))
    except (TypeError, ValueError) as e:
        raise ValueError(f"task {cfg.task!r}: {e}") from None
    multi_turn = is_environment(task)
    if multi_turn and getattr(task, "tool_format", "call") not in ("call", "json"):
        raise ValueError(
            f"task {cfg.task!r}: tool_format={task.tool_format!r} is not valid; choose one of: call, json"
        )
    if multi_turn and getattr(task, "chat", False) and not getattr(task.tokenizer, "chat_template", None):
        raise ValueError(
            f"task {cfg.task!r} renders observations with the tokenizer's chat template, but its "
            f"tokenizer has none (use a chat model's tokenizer, or chat = False)"
        )
    has_oracle = bool(getattr(task, "has_oracle", False))
    close = getattr(task, "close", None)
    if callable(close):
        close()
    if cfg.gae_values == "oracle" and not has_oracle:
        raise ValueError(
            f"gae_values=oracle needs a task with true state values (longchain, or chain with "
            f"task_options reward=chain); task {cfg.task!r} with these options has none"
        )
    if multi_turn and cfg.rollout_engine not in ("hf", "vllm"):
        raise ValueError(
            f"task {cfg.task!r} is multi-turn (an environment answers between turns): it runs on "
            f"rollout_engine=hf or vllm, not {cfg.rollout_engine!r}"
        )
