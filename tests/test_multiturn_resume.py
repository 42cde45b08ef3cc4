"""A multi-turn run, and a grid of them, resume after SIGKILL like single-turn ones: the
killed run continues from its checkpoint to the uninterrupted run's metric history (perf/ timings
aside), and a killed grid's rerun skips finished cells and resumes the killed one."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from test_ablate import _worker, numeric_table, starts, write_grid

ROOT = Path(__file__).resolve().parents[1]
TASK = ["--task", "toolchain", "--task_options", json.dumps({"max_n": 3, "eval_per_bucket": 2})]


def _rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in csv.DictReader(f)]


@pytest.mark.slow
def test_sigkilled_multi_turn_run_resumes_to_the_same_history(tmp_path):
    env = {
        "WANDB_MODE": "offline",
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    common = [
        "--preset",
        "smoke",
        "--model",
        "random",
        *TASK,
        "--observations",
        "step",
        "--steps",
        "12",
        "--checkpoint_every",
        "2",
        "--eval_every",
        "4",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--out_dir",
        str(tmp_path / "runs"),
    ]
    base = [sys.executable, "-m", "vapo_lit.cli.train", *common]
    ref = subprocess.run(
        base + ["--name", "ref", "--cache_dir", str(tmp_path / "c1")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_rows = _rows(tmp_path / "runs" / "ref" / "metrics.csv")
    assert any(
        r.get("rollout/observation_tokens") not in (None, "", "0.0") for r in ref_rows
    )  # tools were called
    proc = subprocess.Popen(
        base + ["--name", "killed", "--cache_dir", str(tmp_path / "c2")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = tmp_path / "runs" / "killed" / "metrics.csv"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(_rows(metrics)) >= 7:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 7 <= len(_rows(metrics)) < 14
    resumed = subprocess.run(
        [sys.executable, "-m", "vapo_lit.cli.train", "--resume", str(tmp_path / "runs" / "killed")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _rows(metrics) == ref_rows


@pytest.mark.slow
def test_sigkill_mid_multi_turn_grid_then_rerun_resumes_and_matches_uninterrupted(tmp_path, storage_url):
    rows = [
        {"only": []},
        {"drop": ["value_pretraining"], "set": {"observations": "zero"}},
        {"drop": ["value_pretraining"]},
    ]
    grid = write_grid(tmp_path, "killmt", rows)
    extra = (
        "--grid",
        grid,
        *TASK,
        "--steps",
        "12",
        "--eval_every",
        "6",
        "--checkpoint_every",
        "2",
        "--heartbeat",
        "1",
        "--grace",
        "2",
        "--storage",
        storage_url,
    )
    out = tmp_path / "killed"
    proc = _worker(tmp_path, "killed", *extra, start_new_session=True)
    victim = None
    deadline = time.time() + 240
    while time.time() < deadline and victim is None:
        time.sleep(0.2)
        runs = out / "runs"
        if not runs.is_dir():
            continue
        done = [d for d in runs.iterdir() if (d / "summary.json").is_file()]
        mid = [
            d
            for d in runs.iterdir()
            if (d / "checkpoints" / "last.ckpt").is_file() and not (d / "summary.json").is_file()
        ]
        if done and mid:
            victim = mid[0]
    assert victim is not None, "never saw a finished cell and a checkpointed unfinished one"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished_before = {d.name for d in (out / "runs").iterdir() if (d / "summary.json").is_file()}
    assert victim.name not in finished_before

    rerun = _worker(tmp_path, "killed", *extra)
    log = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, log
    runs = starts(out)
    for name in finished_before:
        assert len(runs[name]) == 1, (name, runs[name])  # finished cells not rerun
    assert [a["mode"] for a in runs[victim.name]] == ["fresh", "resume"]

    clean = _worker(tmp_path, "clean", *extra, "--study", "clean")
    log = clean.communicate(timeout=300)[0]
    assert clean.returncode == 0, log
    pd.testing.assert_frame_equal(
        numeric_table(out, "killmt"),
        numeric_table(tmp_path / "clean", "killmt"),
        check_exact=False,
        rtol=1e-9,
    )
    ma = pd.read_csv(victim / "metrics.csv")
    mb = pd.read_csv(tmp_path / "clean" / "runs" / victim.name / "metrics.csv")
    assert "rollout/observation_tokens" in ma.columns
    cols = [c for c in ma.columns if not c.startswith("perf/")]
    pd.testing.assert_frame_equal(ma[cols], mb[cols], check_exact=False, rtol=1e-9)
