"""Counter-based random numbers for sampling: the draw for response i at token t is a pure function
of (seed_i, t), computed with SplitMix64 on int64 tensors, so a response's tokens do not depend on
which other responses share its batch, how a rollout is chunked, on which rank it is sampled, or
which rows have already finished. (A `torch.Generator` shared by a batch gives none of these.)

    seeds = torch.tensor([sample_seed(run_seed, iteration, i) for i in global_indices])
    u = uniforms(seeds, t)            # (N,) float64 in [0, 1)
"""
from __future__ import annotations

import torch

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 holding it."""
    return x - (1 << 64) if x >= 1 << 63 else x


def mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int (64-bit wrap-around)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return x ^ (x >> 31)


def sample_seed(*parts: int) -> int:
    """One int64 seed from any number of ints (run seed, iteration, global sample index, ...)."""
    h = 0
    for p in parts:
        h = mix64(h ^ ((int(p) + _GOLDEN) & _M64))
    return _signed(h)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> on int64 is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix64_t(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _signed(_C1)
    x = (x ^ _shr(x, 27)) * _signed(_C2)
    return x ^ _shr(x, 31)


def uniforms(seeds: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """(N,) float64 uniforms in [0, 1): the `step`-th draw of each row's stream (`step` one int for
    every row, or an int64 tensor of N, one per row)."""
    if seeds.dtype != torch.int64:
        raise ValueError(f"seeds must be an int64 tensor; got {seeds.dtype}")
    if isinstance(step, torch.Tensor):
        offset = step.to(device=seeds.device, dtype=torch.int64) * _signed(_GOLDEN)  # int64 product wraps around
    else:
        offset = _signed((int(step) * _GOLDEN) & _M64)
    counter = seeds + offset  # int64 add wraps around
    bits = _shr(_mix64_t(counter), 11)  # the top 53 bits
    return bits.to(torch.float64) * (1.0 / (1 << 53))
