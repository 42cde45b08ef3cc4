"""Counter-based random numbers for sampling: the draw for response i at token t is a pure function
of (seed_i, t), computed with SplitMix64 on int64 tensors, so a response's tokens do not depend on
which other responses share its batch, how a rollout is chunked, on which rank it is sampled, or
which rows have already finished. (A `torch.Generator` shared by a batch gives none of these.)

    seeds = torch.tensor([sample_seed(run_seed, iteration, i) for i in global_indices])
    u = uniforms(seeds, t)            # (N,) float64 in [0, 1)

Every random draw of a run comes from its run seed through one named stream (`Stream`), so no two
parts of an iteration share a draw and a resumed run draws exactly what the uninterrupted one did:

    stream            value  drawn by                                         what it seeds
    PROMPTS               1  step_seed(seed, it, PROMPTS)                     the iteration's prompts
    ROLLOUT               2  sample_seed(seed, it, ROLLOUT, i)                response i of the batch
    EVAL                  3  sample_seed(seed, it, EVAL)                      an evaluation's samples
    EXTRA_PROMPTS         4  sample_seed(seed, it, EXTRA_PROMPTS, r)          extra round r's prompts
    EXTRA_ROLLOUT         5  sample_seed(seed, it, EXTRA_ROLLOUT, r, i)       extra round r's response i
    CRITIC_MINIBATCH     10  step_seed(seed, it, CRITIC_MINIBATCH + epoch)    critic mini-batch order
    ACTOR_MINIBATCH      20  step_seed(seed, it, ACTOR_MINIBATCH + epoch)     actor mini-batch order

(`it`: the iteration; an evaluation's response j is seeded by `sample_seed(that seed, j)`; the
extra rounds r >= 1 are dynamic sampling's; the actor's epoch-0 order also orders the recomputed
behaviour log-probs.) A critic with more than 10 epochs per batch reaches the actor's streams (its
epoch 10 draws the order of the actor's epoch 0). The built-in models are built from `model_seed`
with `BuildSeed`'s offsets (vapo_lit/models/builtin.py). The values are part of what a seed means:
changing one changes every run's draws (the golden histories, tests/golden.py, pin them).
"""

from __future__ import annotations

import enum

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


class Stream(enum.IntEnum):
    """The random streams of a run, each a salt of `step_seed` or a part of `sample_seed` (table above)."""

    PROMPTS = 1
    ROLLOUT = 2
    EVAL = 3
    EXTRA_PROMPTS = 4
    EXTRA_ROLLOUT = 5
    CRITIC_MINIBATCH = 10
    ACTOR_MINIBATCH = 20


class BuildSeed(enum.IntEnum):
    """Offsets added to `model_seed` for the parts of the built-in reward model's build."""

    REWARD_MODEL_SAMPLES = 1_000_003
    """the base policy's scored samples the reward model is fitted to"""
    REWARD_MODEL_HEAD = 17
    """the value head's initial weights"""


def step_seed(seed: int, iteration: int, salt: int = 0) -> int:
    """A per-iteration seed of stream `salt` (a `Stream`, plus the epoch for the mini-batch
    orders), so a resumed run draws exactly what the uninterrupted one did."""
    return (seed * 1_000_003 + iteration * 7_919 + salt * 104_729) % (2**63 - 1)


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
        offset = step.to(device=seeds.device, dtype=torch.int64) * _signed(
            _GOLDEN
        )  # int64 product wraps around
    else:
        offset = _signed((int(step) * _GOLDEN) & _M64)
    counter = seeds + offset  # int64 add wraps around
    bits = _shr(_mix64_t(counter), 11)  # the top 53 bits
    return bits.to(torch.float64) * (1.0 / (1 << 53))
