"""vapo-train as a user meets it: validation before compute, --print-config, a real smoke run."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from vapo_lit.cli.train import main
from vapo_lit.config import COMPONENTS


def test_unknown_component_fails_fast_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    assert main(["--drop=not_a_component", "--out_dir", str(tmp_path / "runs")]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert "unknown component(s) 'not_a_component'" in err
    assert all(name in err for name in COMPONENTS)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--ppo.eps", "1.5"], "ppo.eps=1.5 is out of range; valid range: [0.0, 1.0)"),
        (["--vapo.alpha", "0"], "vapo.alpha=0.0 is out of range; valid range: > 0.0"),
        (["--steps", "many"], "--steps='many' is not valid; expected an integer"),
        (["--preset", "huge"], "--preset 'huge' is not valid; choose one of: default, long, smoke, paper"),
        (
            ["--wandb", "sometimes"],
            "wandb='sometimes' is not valid; choose one of: auto, online, offline, disabled",
        ),
        (["--only", "clip_higher", "--drop", "clip_higher"], "use either --only or --drop"),
        (["--ppo.mini_batch_size", "256"], "exceeds ppo.responses_per_step=128"),
        (["--config", "missing.yaml"], "--config missing.yaml: file not found"),
    ],
)
def test_bad_values_name_the_valid_range(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_print_config_resolves_preset_file_flags_and_drop(tmp_path, capsys):
    delta = tmp_path / "exp.yaml"
    delta.write_text("vapo:\n  alpha: 0.5\nppo:\n  actor_lr: 3.0e-5\n")
    assert (
        main(
            [
                "--config",
                str(delta),
                "--ppo.actor_lr",
                "2e-5",
                "--drop",
                "clip_higher,group_sampling",
                "--print-config",
            ]
        )
        == 0
    )
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["vapo"]["alpha"] == 0.5 and cfg["ppo"]["actor_lr"] == 2e-5  # flag beats file
    assert cfg["components"] == [c for c in COMPONENTS if c not in ("clip_higher", "group_sampling")]
    assert main(["--only", "none", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["components"] == []


@pytest.mark.slow
def test_smoke_run_then_resume_in_a_subprocess(tmp_path):
    """The real command line end to end: a run, a refusal to overwrite it, a resume."""
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--out_dir",
        str(tmp_path / "runs"),
        "--name",
        "r",
        "--wandb",
        "offline",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
    ]
    env = {"WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "r  it 5/5  ppo 3/3  phase ppo" in done.stdout  # the status line, as plain lines in a pipe
    assert "Run history:" not in done.stderr  # W&B's sparklines only when asked (VAPO_LIT_WANDB_SUMMARY=1)
    rows = list(csv.DictReader(open(tmp_path / "runs" / "r" / "metrics.csv")))
    assert len(rows) == 1 + 2 + 3  # base eval (step 0), 2 value-pretraining iterations, 3 PPO iterations
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 2 and "already holds a run" in again.stderr
    resumed = subprocess.run(
        [sys.executable, "-m", "vapo_lit.cli.train", "--resume", str(tmp_path / "runs" / "r")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(list(csv.DictReader(open(tmp_path / "runs" / "r" / "metrics.csv")))) == 6


def _rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in csv.DictReader(f)]


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_history(tmp_path):
    """SIGKILL a real vapo-train process mid-run; --resume gives the uninterrupted run's metrics."""
    env = {"WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    common = [
        "--preset",
        "smoke",
        "--model",
        "random",
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
    assert _rows(metrics) == _rows(tmp_path / "runs" / "ref" / "metrics.csv")
