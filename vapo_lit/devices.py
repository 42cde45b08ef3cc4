"""Where and in what precision a run computes: the config's accelerator / devices / precision as
Lightning Trainer arguments, with 'auto' resolved here so the run card records what was used."""
from __future__ import annotations

import contextlib
import os

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
    return cfg.num_nodes > 1 or devices == "auto" or (devices if isinstance(devices, int) else len(devices)) > 1


def trainer_kwargs(cfg: RunConfig) -> dict:
    """accelerator, devices, num_nodes, strategy and precision for `lightning.Trainer` ('auto'
    resolved, except a device count of 'auto')."""
    accelerator = resolve_accelerator(cfg.accelerator)
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ValueError("accelerator=cuda but no CUDA device is visible; use --accelerator cpu or auto")
    devices = parse_devices(cfg.devices)
    out = {"accelerator": accelerator, "devices": devices, "num_nodes": cfg.num_nodes,
           "precision": resolve_precision(cfg.precision, accelerator)}
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
    return {k: (getattr(v, "strategy_name", type(v).__name__) if k == "strategy" else v) for k, v in kwargs.items()}


FULL_PRECISIONS = ("32-true", "32", "64-true", "64")
"""Lightning precisions that compute in the weights' own 32/64-bit dtype (no autocast, no 16-bit weights)."""


def reduced_precision(precision: str | None, weights_dtype: torch.dtype) -> bool:
    """Whether the run computes in less than 32 bits: a 16-bit Lightning precision (bf16-mixed,
    16-mixed, bf16-true, ...) or 16-bit weights."""
    return (precision is not None and str(precision) not in FULL_PRECISIONS) or torch.finfo(weights_dtype).bits < 32


def recompute_logprobs(cfg: RunConfig, precision: str | None, weights_dtype: torch.dtype) -> bool:
    """cfg.ppo.recompute_logprobs with None ('auto') resolved: on under any reduced precision
    (`precision`: the Trainer's; None: resolved from `cfg`), where the sampler (outside autocast,
    its own kernels) and the update (under autocast) round differently, so the first mini-batch's
    ratio would not be 1; off in fp32/fp64, where the two agree to ~1e-6."""
    if cfg.ppo.recompute_logprobs is not None:
        return bool(cfg.ppo.recompute_logprobs)
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
