"""The full recipe and vanilla PPO reproduce their recorded metric histories (tests/golden.py):
every non-`perf/` column of every row, within `golden.TOLERANCE`. A refactor of the iteration must
keep these; a change of the algorithm on purpose re-records them (`python tests/golden.py --record`).

The histories must hold on every CPU a user or a CI machine may have, so they are also checked
under the other instruction sets this machine offers (torch's `ATEN_CPU_CAPABILITY`, read once when
torch loads: hence a subprocess each). A golden that depends on one instruction set's rounding fails
here on any machine with more than one (every x86-64 with AVX2; aarch64 with SVE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from golden import RUNS, comparable, differences, recorded, run

HERE = Path(__file__).parent

# each capability and the ones below it, in torch's names (ATEN_CPU_CAPABILITY values)
_LADDER = {"AVX512": ["default", "avx2"], "AVX2": ["default"], "SVE256": ["default"], "DEFAULT": []}


def other_capabilities() -> list[str]:
    """The instruction sets below the one torch uses here (which the in-process test covers)."""
    native = torch.backends.cpu.get_cpu_capability()
    return _LADDER.get(native, ["default"] if native != "DEFAULT" else [])


@pytest.mark.parametrize("label", list(RUNS))
def test_metric_history_matches_the_recorded_one(tmp_path, label):
    diffs = differences(comparable(run(tmp_path, label)), recorded(label))
    assert not diffs, diffs[:5]


@pytest.mark.parametrize(
    "capability",
    other_capabilities()
    or [
        pytest.param(
            "default",
            marks=pytest.mark.skip(
                reason="torch runs its default kernels here: no other instruction set to compare"
            ),
        )
    ],
)
def test_metric_histories_hold_under_another_instruction_set(capability):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    proc = subprocess.run(
        [sys.executable, str(HERE / "golden.py"), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr[-3000:]
    names = {"default": ("DEFAULT", "NO AVX")}.get(
        capability, (capability.upper(),)
    )  # older torch says "NO AVX"
    assert any(f"capability {n}" in proc.stdout for n in names), out  # torch took the setting
    assert proc.returncode == 0, out


def test_the_capability_ladder_names_what_torch_accepts():
    """Every name the ladder hands to ATEN_CPU_CAPABILITY is one torch knows (a typo would silently
    run the native kernels and check nothing): the subprocess test asserts the capability it ran."""
    for names in _LADDER.values():
        assert set(names) <= {"default", "avx2", "avx512", "sve256"}
