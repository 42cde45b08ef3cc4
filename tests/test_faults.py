"""Crash consistency: a real `vapo-train` process killed (SIGKILL, no handler runs) in the middle of
appending a metrics.csv row, writing a checkpoint or writing the pretrained-critic cache, or hitting a
full disk (injected ENOSPC, and a real 20 MB tmpfs where the test may mount one), then `--resume`d:
the metric history equals an uninterrupted run's (every column but perf/ timings), nothing stale is
left behind, and the user sees one line with the command that continues.

The kill points are reached through VAPO_LIT_FAULT=<point>:<n>[:enospc] (vapo_lit/faults.py); n is
drawn from a seeded RNG over the run's iterations (FAULT_SEED, printed on failure). Only the SIGKILLs
need a process of their own; the other runs go through the same command in this process (faster).
The histories are compared exactly, which holds on any CPU: the reference and the killed and resumed
runs are processes of this machine under one instruction set (a subprocess inherits the environment,
ATEN_CPU_CAPABILITY included); it passes under default, avx2 and avx512.

    .venv/bin/python -m pytest tests/test_faults.py
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from vapo_lit.loggers import ResumableCSVLogger, read_rows

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
STEPS, PRETRAIN = 6, 2  # smoke preset: 2 value-pretraining iterations, then 6 PPO iterations
ITERATIONS = STEPS + PRETRAIN  # metrics rows: base eval (step 0) + 8 iterations
FAULT_SEED = int(os.environ.get("VAPO_LIT_FAULT_SEED", "8"))
RNG = random.Random(FAULT_SEED)


def args(tmp_path, name, *extra):
    return [
        "--preset",
        "smoke",
        "--model",
        "random",
        "--steps",
        str(STEPS),
        "--checkpoint_every",
        "1",
        "--eval_every",
        "2",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--out_dir",
        str(tmp_path / "runs"),
        "--name",
        name,
        "--cache_dir",
        str(tmp_path / f"cache-{name}"),
        *extra,
    ]


def cmd(tmp_path, name, *extra):
    return [PY, "-m", "vapo_lit.cli.train", *args(tmp_path, name, *extra)]


def run(argv, fault: str | None = None, timeout: int = 300):
    """A command in a process of its own (for the SIGKILLs)."""
    env = {**os.environ, "PYTHONWARNINGS": "default", "VAPO_LIT_PROGRESS": "0"}
    env.pop("VAPO_LIT_FAULT", None)
    if fault:
        env["VAPO_LIT_FAULT"] = fault
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def here(main, argv, capsys, monkeypatch, fault: str | None = None) -> tuple[int, str]:
    """A command in this process, with a fault armed: (exit code, stderr and warnings)."""
    from vapo_lit import faults

    monkeypatch.setattr(faults, "_seen", {})  # the visit counters start over, as in a new process
    if fault:
        monkeypatch.setenv(faults.ENV, fault)
    else:
        monkeypatch.delenv(faults.ENV, raising=False)
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(argv)
    monkeypatch.delenv(faults.ENV, raising=False)
    return code, capsys.readouterr().err + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)


def history(run_dir) -> list[dict]:
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every faulted run must end up equal to."""
    from vapo_lit.cli.train import main

    tmp = tmp_path_factory.mktemp("reference")
    assert main(args(tmp, "ref")) == 0
    rows = history(tmp / "runs" / "ref")
    assert len(rows) == 1 + ITERATIONS
    return rows


def resume(run_dir, capsys, monkeypatch) -> str:
    """`vapo-train --resume RUN_DIR` in this process; its stderr and warnings."""
    from vapo_lit.cli.train import main

    code, err = here(main, ["--resume", str(run_dir)], capsys, monkeypatch)
    assert code == 0, err[-3000:]
    return err


# ----------------------------------------------------------------------------- the CSV log alone
def test_a_partial_last_row_is_dropped_on_resume_with_a_warning(tmp_path):
    """Issue 8: a metrics.csv whose last row was cut made every --resume fail (float(None))."""
    path = tmp_path / "metrics.csv"
    path.write_text("a,step,z\n1.0,0,2\n1.5,1,3\n2.0,2,4\n2.")  # the disk filled inside the next row
    with pytest.warns(RuntimeWarning, match="dropped a partial last row"):
        ResumableCSVLogger(tmp_path, keep_until_step=2).experiment
    assert path.read_text() == "a,step,z\n1.0,0,2\n1.5,1,3\n2.0,2,4\n"
    path.write_text("a,step,z\n1.0,0,2\n1.5,1\n")  # a row with missing fields, newline written
    with pytest.warns(RuntimeWarning, match="line 3"):
        ResumableCSVLogger(tmp_path, keep_until_step=5).experiment
    assert [r["step"] for r in read_rows(path)[1]] == ["0"]


def test_a_damaged_row_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("a,step\n1.0,0\n1.5\n2.0,2\n")
    with pytest.raises(ValueError, match=r"metrics.csv, line 3: 1 fields where the header has 2"):
        ResumableCSVLogger(tmp_path, keep_until_step=2).experiment


# ----------------------------------------------------------------------------- kills
KILLS = [
    ("csv_append", RNG.randint(1, 6)),  # 6 appends (rows that bring new columns rewrite the file instead)
    (
        "checkpoint",
        RNG.randint(2, ITERATIONS),
    ),  # one per iteration; the first has no earlier one to resume from
    ("cache_write", 1),  # the pretrained critic goes into the cache once
]


@pytest.mark.parametrize("point, n", KILLS, ids=[f"{p}:{n}" for p, n in KILLS])
def test_killed_mid_write_then_resumed_equals_the_uninterrupted_run(
    tmp_path, capsys, monkeypatch, reference, point, n
):
    name = point
    r = run(cmd(tmp_path, name), fault=f"{point}:{n}")
    assert r.returncode == -signal.SIGKILL, (
        f"FAULT_SEED={FAULT_SEED}: the run was not killed at {point}:{n}\n" + r.stderr[-2000:]
    )
    run_dir = tmp_path / "runs" / name
    text = (run_dir / "metrics.csv").read_text()
    if point == "csv_append":
        assert not text.endswith("\n")  # the kill left half a row
    if point == "checkpoint":
        assert (run_dir / "checkpoints" / ".last.ckpt.tmp").is_file()  # and half a checkpoint
    if point == "cache_write":
        assert list((tmp_path / f"cache-{name}").glob(".pretrained-critic-*.tmp-*"))  # and half a cache entry
    err = resume(run_dir, capsys, monkeypatch)
    if point == "csv_append":
        assert "dropped a partial last row" in err
    assert history(run_dir) == reference, f"FAULT_SEED={FAULT_SEED} {point}:{n}"
    assert not list(run_dir.rglob(".*.tmp")), "a temporary file survived the resume"
    assert not list((tmp_path / f"cache-{name}").glob(".*.tmp-*")), (
        "a dead builder's cache directory survived"
    )


# ----------------------------------------------------------------------------- full disk
def test_disk_full_is_one_line_with_the_resume_command_and_loses_nothing(
    tmp_path, capsys, monkeypatch, reference
):
    """ENOSPC in the middle of a metrics.csv row (injected; the real full disk is the test below)."""
    from vapo_lit.cli.train import main

    run_dir = tmp_path / "runs" / "full"
    code, err = here(main, args(tmp_path, "full"), capsys, monkeypatch, fault="csv_append:4:enospc")
    assert code == 1, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("vapo-train")]
    assert len(line) == 1 and line[0].startswith("vapo-train: error: disk full (") and "Traceback" not in err
    assert line[0].endswith(f"free some space, then continue with: vapo-train --resume {run_dir}")
    resume(run_dir, capsys, monkeypatch)
    assert history(run_dir) == reference


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB tmpfs (needs root and mount; skipped with the reason otherwise)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small disk to fill")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); needs root/CAP_SYS_ADMIN"
        )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_real_full_disk_mid_run_then_resume_equals_the_uninterrupted_run(
    tmp_path, capsys, monkeypatch, reference, small_disk
):
    """Fill a real file system so that the run's second checkpoint does not fit."""
    from vapo_lit.cli.train import main

    out = small_disk / "runs"
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave ~1.5 checkpoints of room (a checkpoint is ~0.33 MB here)
        f.write(b"\0" * (shutil.disk_usage(small_disk).free - 500 * 1024))
    code, err = here(main, args(tmp_path, "real", "--out_dir", str(out)), capsys, monkeypatch)
    assert code == 1, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("vapo-train")]
    assert (
        len(line) == 1
        and line[0].startswith("vapo-train: error: disk full (")
        and f"--resume {out / 'real'}" in line[0]
    )
    assert (out / "real" / "checkpoints" / "last.ckpt").is_file()  # what was done is kept
    filler.unlink()
    resume(out / "real", capsys, monkeypatch)
    assert history(out / "real") == reference


def test_a_real_full_disk_under_a_grid_hands_the_cell_back(tmp_path, capsys, monkeypatch, small_disk):
    """vapo-ablate with its output (SQLite database included) on a full disk: one line, the claimed
    cell WAITING again (not Optuna's StorageInternalError and a cell left RUNNING); after freeing
    space the rerun resumes it."""
    from vapo_lit.ablate.store import CellStore
    from vapo_lit.cli.ablate import main

    argv = [
        "--seeds",
        "1",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--drop",
        "clip_higher",
        "--steps",
        "6",
        "--checkpoint_every",
        "1",
        "--no-report",
        "--out",
        str(small_disk / "out"),
        "--cache_dir",
        str(tmp_path / "cache"),
    ]
    filler = small_disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(small_disk).free - 700 * 1024))
    code, err = here(main, argv, capsys, monkeypatch)
    assert code == 1, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("vapo-ablate")]
    assert (
        len(line) == 1 and line[0].startswith("vapo-ablate: error: disk full") and "Traceback" not in err
    ), err
    url = f"sqlite:///{small_disk / 'out' / 'ablate.db'}"
    assert "RUNNING" not in [t.state.name for t in CellStore(url).trials()]
    filler.unlink()
    code, err = here(main, argv, capsys, monkeypatch)
    assert code == 0, err[-3000:]
    assert sorted(t.state.name for t in CellStore(url).trials()) == ["COMPLETE", "COMPLETE"]


def test_disk_full_is_recognised_in_what_the_libraries_raise():
    import errno
    import sqlite3

    from optuna.exceptions import StorageInternalError

    from vapo_lit.faults import is_disk_full, is_storage_error

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise StorageInternalError("An exception is raised during the commit.") from e
    except StorageInternalError as e:
        assert is_disk_full(e) and is_storage_error(e)
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied")) and not is_storage_error(
        ValueError("x")
    )
