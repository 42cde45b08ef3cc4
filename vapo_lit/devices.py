"""Where and in what precision a run computes: the config's accelerator / devices / precision as
Lightning Trainer arguments, with 'auto' resolved here so the run card records what was used."""
from __future__ import annotations

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


def trainer_kwargs(cfg: RunConfig) -> dict:
    """accelerator, devices and precision for `lightning.Trainer` (all resolved, no 'auto' left
    except a device count of 'auto')."""
    accelerator = resolve_accelerator(cfg.accelerator)
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ValueError("accelerator=cuda but no CUDA device is visible; use --accelerator cpu or auto")
    return {"accelerator": accelerator, "devices": parse_devices(cfg.devices),
            "precision": resolve_precision(cfg.precision, accelerator)}
