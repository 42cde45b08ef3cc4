"""Holding a grid's CPU kernels (torch's, MKL's, oneDNN's) to one instruction set, on any CPU that has it.

torch dispatches its own CPU kernels by instruction set (default, AVX2, AVX-512 on x86-64) and links
MKL (BLAS) and oneDNN, which dispatch on their own; float32 results differ in their last bits from
one to another, and an RL run amplifies last bits into another trajectory. A grid pinned to one
(`cpu_capability: avx2` in its file, or `vapo-ablate --cpu-capability avx2`) runs every process
with all three held to it, so any CPU that has the instruction set runs the grid's remaining cells
on that set's code paths, as the first machine did. A pin holds the instruction set, not every last
bit: CPU models of one set can still differ in the last bits of some float32 results, so each
attempt records its CPU model too (`cpu_model`) and the report names the models a grid ran on. The
pin is recorded in the grid's manifest and kept for the grid's life. Reading the environment is most
of what this module does: torch is imported only to check that this CPU has the pinned set and that
torch dispatches to it.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

PINS = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
"""Each pin's environment: torch's kernels (read once when torch loads), MKL's conditional numerical
reproducibility branch and oneDNN's highest instruction set."""

TORCH_NAME = {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}
"""What `torch.backends.cpu.get_cpu_capability()` (and the attempt ledger) says under each pin."""


def parse(text, where: str) -> str:
    """A pin name (case-insensitive), or ValueError naming the valid ones."""
    name = str(text).strip().lower()
    if name not in PINS:
        raise ValueError(f"{where} {text!r}: not an instruction set to pin; valid: {', '.join(PINS)}")
    return name


def env_for(pin: str) -> dict:
    return dict(PINS[pin])


def in_effect(pin: str, environ=None) -> bool:
    """Whether `environ` (default: this process's) holds every variable of the pin."""
    environ = os.environ if environ is None else environ
    return all(environ.get(k) == v for k, v in PINS[pin].items())


def current(environ=None) -> str | None:
    """The pin whose every variable `environ` (default: this process's) holds, or None."""
    return next((pin for pin in PINS if in_effect(pin, environ)), None)


def recorded(environ=None) -> dict:
    """The pin variables set in `environ` (for run cards: what a run computed under)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in PINS["default"] if k in environ}


@functools.cache
def cpu_model() -> str:
    """This machine's CPU model: /proc/cpuinfo's model name (Linux), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


RANK = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}
"""torch's x86-64 instruction sets, each running on the CPUs of those above it."""

_native: list = []


def native() -> str:
    """The instruction set torch picks on this CPU unpinned (asked of a fresh interpreter without the
    pin variables, once per process): under ATEN_CPU_CAPABILITY torch reports whatever it is told,
    even a set the CPU lacks, and then dies of an illegal instruction in its first kernel."""
    if not _native:
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if k not in PINS["default"]}
        code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        _native.append(out.stdout.strip().splitlines()[-1])
    return _native[0]


def check(pin: str) -> None:
    """ValueError unless this process runs under the pin: its environment holds the pin's variables
    (they must be set before Python starts: torch reads its own once, when it loads), this CPU has
    the pinned instruction set, and torch dispatches to it."""
    if not in_effect(pin):
        raise ValueError(
            f"cpu_capability {pin}: this process was started without "
            f"{' '.join(f'{k}={v}' for k, v in PINS[pin].items())}; set them before Python starts "
            "(the vapo-ablate command restarts itself with them)"
        )
    have = native()
    if pin != "default" and RANK.get(have, -1) < RANK[TORCH_NAME[pin]]:  # default runs anywhere
        raise ValueError(
            f"cpu_capability {pin}: this CPU lacks it (torch runs {have} here unpinned); run the grid on a "
            f"CPU with {pin}, or start a new grid (another --out) with a pin it has"
        )
    import torch

    got = torch.backends.cpu.get_cpu_capability()
    if got != TORCH_NAME[pin]:
        raise ValueError(f"cpu_capability {pin}: torch's CPU kernels run {got} here, not {TORCH_NAME[pin]}")
