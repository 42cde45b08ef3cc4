"""Where and in what precision a run computes: the config's accelerator / devices / precision as
Lightning Trainer arguments, with 'auto' resolved here so the run card records what was used."""
from __future__ import annotations

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
