"""Where and in what precision a run computes: the config's accelerator / devices / precision as
Lightning Trainer arguments, with 'auto' resolved here so the run card records what was used; and
the memory-bounded pass sizes ('auto' rollout_batch_size / logits_chunk) from the model and the
device's free memory."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

import torch

from vapo_lit.config import RunConfig, parse_devices


def resolve_accelerator(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if choice == "gpu" else choice


def resolve_precision(choice: str, accelerator: str) -> str:
    """auto: bf16-mixed on a CUDA device that supports bf16 (fp32 master weights, bf16 compute),
    else 32-true."""
    if choice != "auto":
        return choice
    if accelerator == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def visible_gpus() -> list[str]:
    """The CUDA device ids this process may use, as CUDA_VISIBLE_DEVICES would name them."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [x.strip() for x in env.split(",") if x.strip() and x.strip() != "-1"]
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def spans_devices(cfg: RunConfig) -> bool:
    """More than one process: several devices (or 'auto') or several nodes."""
    devices = parse_devices(cfg.devices)
    return (
        cfg.num_nodes > 1 or devices == "auto" or (devices if isinstance(devices, int) else len(devices)) > 1
    )


def trainer_kwargs(cfg: RunConfig) -> dict:
    """accelerator, devices, num_nodes, strategy and precision for `lightning.Trainer` ('auto'
    resolved, except a device count of 'auto')."""
    accelerator = resolve_accelerator(cfg.accelerator)
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ValueError("accelerator=cuda but no CUDA device is visible; use --accelerator cpu or auto")
    devices = parse_devices(cfg.devices)
    out = {
        "accelerator": accelerator,
        "devices": devices,
        "num_nodes": cfg.num_nodes,
        "precision": resolve_precision(cfg.precision, accelerator),
    }
    strategy = cfg.strategy if cfg.strategy != "auto" else ("ddp" if spans_devices(cfg) else "auto")
    if strategy == "ddp":
        from vapo_lit.distributed import VapoDDPStrategy

        out["strategy"] = VapoDDPStrategy(process_group_backend="nccl" if accelerator == "cuda" else "gloo")
    elif strategy == "fsdp":
        from vapo_lit.distributed import vapo_fsdp_strategy

        out["strategy"] = vapo_fsdp_strategy(cfg, accelerator)
    return out


def describe(kwargs: dict) -> dict:
    """The Trainer arguments as the run card records them."""
    return {
        k: (getattr(v, "strategy_name", type(v).__name__) if k == "strategy" else v)
        for k, v in kwargs.items()
    }


FULL_PRECISIONS = ("32-true", "32", "64-true", "64")
"""Lightning precisions that compute in the weights' own 32/64-bit dtype (no autocast, no 16-bit weights)."""


def reduced_precision(precision: str | None, weights_dtype: torch.dtype) -> bool:
    """Whether the run computes in less than 32 bits: a 16-bit Lightning precision (bf16-mixed,
    16-mixed, bf16-true, ...) or 16-bit weights."""
    return (precision is not None and str(precision) not in FULL_PRECISIONS) or torch.finfo(
        weights_dtype
    ).bits < 32


def recompute_logprobs(cfg: RunConfig, precision: str | None, weights_dtype: torch.dtype) -> bool:
    """cfg.ppo.recompute_logprobs with None ('auto') resolved: on under any reduced precision
    (`precision`: the Trainer's; None: resolved from `cfg`), where the sampler (outside autocast,
    its own kernels) and the update (under autocast) round differently, so the first mini-batch's
    ratio would not be 1; off in fp32/fp64, where the two agree to ~1e-6. Also on for an engine with
    kernels of its own (vllm) and with truncated importance sampling (ppo.tis_cap), whose weights
    compare the two."""
    if cfg.ppo.recompute_logprobs is not None:
        return bool(cfg.ppo.recompute_logprobs)
    from vapo_lit.engines import own_kernels

    if own_kernels(cfg.rollout_engine) or cfg.ppo.tis_cap is not None:
        return True
    if precision is None:
        precision = resolve_precision(cfg.precision, resolve_accelerator(cfg.accelerator))
    return reduced_precision(precision, weights_dtype)


@contextlib.contextmanager
def autocast_off():
    """Leave every autocast region the caller is in (Lightning's bf16-mixed wraps the whole
    training_step in one): sampling then runs in the weights' own dtype, cast once, instead of
    re-casting every fp32 weight to bf16 at every token (Lightning >= 2.6 disables the cast cache;
    older versions would serve weights cast before an optimizer step to passes after it)."""
    with contextlib.ExitStack() as stack:
        for kind in ("cpu", "cuda", "mps", "xpu"):
            if torch.is_autocast_enabled(kind):
                stack.enter_context(torch.autocast(kind, enabled=False))
        yield


def clear_autocast_cache_after_steps(optimizers) -> None:
    """Every step of these optimizers empties autocast's cache of weight casts. Lightning < 2.6
    autocasts with that cache on, and one training_step (several optimizer steps) is one autocast
    region, so a forward after a step would otherwise compute with bf16 casts of the weights as
    they were before it (Lightning >= 2.6 turns the cache off; then this costs nothing)."""
    for opt in optimizers:
        opt.register_step_post_hook(lambda *_: torch.clear_autocast_cache())


# ----------------------------------------------------------------------------- memory-bounded defaults
LOGIT_BYTES = 16
"""Bytes per logit in the update's log-prob pass: the logit itself, its float32 log-softmax, and
the gradients of both (an upper bound for float32 and bf16 logits alike)."""
SAMPLING_LOGIT_COPIES = 4
"""Float32 copies of one row's logits while a token is drawn (scaled logits, softmax, sorted
probabilities and their cumulative sum for top-p)."""
STATE_BYTES_PER_PARAM = 16
"""Device bytes per trained parameter outside the passes: float32 weight, gradient, AdamW's two moments."""
SHARE = 4
"""Each bounded pass (sampling, the log-prob pass) may use 1/SHARE of what the weights leave free."""


@dataclass(frozen=True)
class MemoryPlan:
    """`ppo.rollout_batch_size` and `ppo.logits_chunk` as a run uses them ('auto' resolved once, at
    start, from the model's shape and the device's free memory; recorded in the run card)."""

    rollout_batch_size: int | None
    logits_chunk: int | None
    budget_bytes: int | None
    """Bytes each bounded pass may use (None: no 'auto' to resolve)."""
    how: str

    def record(self) -> dict:
        return dataclasses.asdict(self)


def free_device_bytes(accelerator: str) -> int:
    """Free memory of the device this process computes on: CUDA's free bytes (the device of
    LOCAL_RANK), else the host's available memory."""
    if accelerator == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", "0") or 0))[0])
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        return info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError, IndexError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def model_shape(model) -> dict | None:
    """vocab, layers and K/V width (key-value heads x head dim) from a transformers config; None
    when the model has no such config."""
    c = getattr(model, "config", None)
    try:
        heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        return {
            "vocab": int(c.vocab_size),
            "layers": int(c.num_hidden_layers),
            "kv_width": int((getattr(c, "num_key_value_heads", None) or heads) * head_dim),
        }
    except (AttributeError, TypeError):
        return None


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(x).bit_length() - 1) if x >= 1 else 0


def plan_sizes(
    shape: dict,
    *,
    tokens: int,
    response_tokens: int,
    rows: int,
    micro_batch: int,
    elem_bytes: int,
    budget: int,
) -> tuple[int | None, int | None]:
    """(rollout_batch_size, logits_chunk) that keep each pass within `budget` bytes; None where
    the whole pass fits (all responses at once, all positions in one chunk: today's behaviour).

    sampling, per response: its K/V cache, 2 x layers x tokens x kv_width x elem_bytes, plus the
    draw's float32 copies of one logits row; the log-prob pass: micro_batch x chunk x vocab x
    LOGIT_BYTES. Sizes are powers of two, at least 1 (the smallest pass there is)."""
    per_row = (
        2 * shape["layers"] * tokens * shape["kv_width"] * elem_bytes
        + SAMPLING_LOGIT_COPIES * 4 * shape["vocab"]
    )
    per_position = micro_batch * shape["vocab"] * LOGIT_BYTES
    fit_rows, fit_positions = budget // per_row, budget // per_position
    batch = None if fit_rows >= rows else max(1, _pow2_floor(fit_rows))
    chunk = None if fit_positions >= response_tokens else max(1, _pow2_floor(fit_positions))
    return batch, chunk


def longest_prompt(tokenizer, problems) -> int:
    """Tokens of the longest prompt among `problems` (the eval set stands in for the task's prompts)."""
    return max((len(tokenizer(pr.prompt)["input_ids"]) for pr in problems), default=0)


def resolve_memory_defaults(
    cfg: RunConfig, actor, critic, prompt_tokens: int, max_new_tokens: int, free_bytes: int | None = None
) -> tuple[RunConfig, MemoryPlan]:
    """`cfg` with 'auto' rollout_batch_size / logits_chunk replaced by numbers from the model and
    the device (None: the whole pass fits, as before 'auto' existed), and the plan to record."""
    p = cfg.ppo
    auto = [k for k in ("rollout_batch_size", "logits_chunk") if getattr(p, k) == "auto"]
    if not auto:
        return cfg, MemoryPlan(p.rollout_batch_size, p.logits_chunk, None, "set in the config")
    shape = model_shape(actor)
    if shape is None:  # no transformers config to size from: unbounded, as before
        resolved = {k: None for k in auto}
        plan = MemoryPlan(
            **{"rollout_batch_size": p.rollout_batch_size, "logits_chunk": p.logits_chunk, **resolved},
            budget_bytes=None,
            how="auto: the model has no transformers config to size from; unbounded",
        )
        return dataclasses.replace(cfg, ppo=dataclasses.replace(p, **resolved)), plan
    accelerator = resolve_accelerator(cfg.accelerator)
    free = free_device_bytes(accelerator) if free_bytes is None else free_bytes
    params = sum(m.numel() for model in (actor, critic) if model is not None for m in model.parameters())
    budget = max(0, free - STATE_BYTES_PER_PARAM * params) // SHARE
    elem = max(t.element_size() for t in actor.parameters())
    batch, chunk = plan_sizes(
        shape,
        tokens=prompt_tokens + max_new_tokens,
        response_tokens=max_new_tokens,
        rows=p.responses_per_step,
        micro_batch=p.micro_batch_size,
        elem_bytes=elem,
        budget=budget,
    )
    resolved = {k: v for k, v in (("rollout_batch_size", batch), ("logits_chunk", chunk)) if k in auto}
    out = dataclasses.replace(p, **resolved)
    how = (
        f"auto: {free} free bytes on {accelerator}, minus {STATE_BYTES_PER_PARAM} x {params} parameters, / {SHARE} "
        f"per pass; vocab {shape['vocab']}, {shape['layers']} layers, K/V width {shape['kv_width']}, "
        f"{prompt_tokens} + {max_new_tokens} tokens"
    )
    return dataclasses.replace(cfg, ppo=out), MemoryPlan(
        out.rollout_batch_size, out.logits_chunk, budget, how
    )
