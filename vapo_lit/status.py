"""Status lines: what a run is loading, building or starting before its first iteration ends.

    09:14:02 vapo-train: run runs/vapo-s0 (task chain, policy builtin, critic auto, engine hf, 100 PPO updates)
    09:14:02 loading torch and Lightning
    09:14:06 policy: the built-in base policy, from the cache (~/.cache/vapo-lit/policy-2463a127d64bc645)
    09:14:07 evaluating the initial policy: 32 problems x 8 samples, up to 223 new tokens each

One plain line per step, stamped with the time, on stdout: the same in a terminal, a pipe or a log
file. `vapo-train` turns them on (`vapo_lit.progress_line.enabled`), and a grid cell run as a process of its
own writes them into its `cell.log`; VAPO_LIT_PROGRESS=0 turns them off, =1 on anywhere. Only the
first process of a multi-process run prints. This module imports nothing heavy, so the first line
can be printed before torch and Lightning are imported.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

ENV = "VAPO_LIT_PROGRESS"
_on = False


@contextmanager
def announcing(on: bool = True):
    """Status lines on inside the block."""
    global _on
    before, _on = _on, on
    try:
        yield
    finally:
        _on = before


def env_setting() -> bool | None:
    """VAPO_LIT_PROGRESS as a switch: False (0/false/no/off), True (1/true/yes/on) or None (unset)."""
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    return True if env in ("1", "true", "yes", "on") else None


def is_on() -> bool:
    env = env_setting()
    return _on if env is None else env


def _rank_zero() -> bool:
    """vapo_lit.distributed.is_global_zero_env without importing torch."""
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").strip().isdigit():
            return int(os.environ[key]) == 0
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK"))


def say(text: str, stream=None) -> None:
    """Print `text` as one stamped status line (when status lines are on, on the first process)."""
    if is_on() and _rank_zero():
        print(f"{time.strftime('%H:%M:%S')} {text}", file=stream or sys.stdout, flush=True)


def minutes(m: float) -> str:
    """'about 5 min' / 'about 30 s' for an expected duration in minutes."""
    return f"about {round(m * 60)} s" if m < 1 else f"about {m:g} min"
