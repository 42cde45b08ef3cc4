"""vapo-sweep: a seeded TPE study on SQLite with one completed and one pruned trial (pruning on eval
score through the Lightning callback), continued by rerunning with more trials; bad files rejected.

    .venv/bin/python -m pytest tests/test_sweep.py
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from vapo_lit.ablate.sweep import load_sweep
from vapo_lit.cli.sweep import main

ROOT = Path(__file__).resolve().parents[1]


def _sweep_file(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": "tiny",
                "preset": "smoke",
                "objective": "final",
                "n_trials": 2,
                "base": {"components": ["clip_higher", "token_level_loss"], "eval_every": 2},
                "sampler": {"name": "tpe", "seed": 0},
                # random-init models score ~0: a threshold of 0.5 prunes any trial that reports at update >= 2
                "pruner": {"name": "threshold", "lower": 0.5, "n_warmup_steps": 2},
                "space": {
                    "steps": {"type": "categorical", "choices": [1, 4]},
                    "vapo.eps_high": {"type": "float", "low": 0.2, "high": 0.4},
                },
                "enqueue": [{"steps": 1, "vapo.eps_high": 0.28}, {"steps": 4, "vapo.eps_high": 0.3}],
            }
        )
    )
    return path


def _args(tmp_path, *extra):
    return [
        str(_sweep_file(tmp_path)),
        "--model",
        "random",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "sw"),
        "--heartbeat",
        "1",
        *extra,
    ]


def _study(tmp_path):
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'sw' / 'sweeps.db'}")


def test_sweep_prunes_completes_and_resumes(tmp_path, capsys):
    assert main(_args(tmp_path)) == 0
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    done, pruned = trials
    assert done.params["steps"] == 1 and pruned.params["steps"] == 4
    assert min(pruned.intermediate_values) >= 2 and all(v < 0.5 for v in pruned.intermediate_values.values())
    assert done.value == pytest.approx(0.0, abs=0.5)
    # the pruned trial's logs stay on disk and stop at the update where it was pruned
    rows = pd.read_csv(Path(pruned.user_attrs["run_dir"]) / "metrics.csv")
    assert rows["train/ppo_update"].max() == min(pruned.intermediate_values)
    out = capsys.readouterr().out
    assert "optuna-dashboard sqlite:///" in out
    # same command again: nothing to do; with --n-trials 3: exactly one more trial (TPE-sampled)
    assert main(_args(tmp_path)) == 0
    assert len(_study(tmp_path).trials) == 2
    assert main(_args(tmp_path, "--n-trials", "3")) == 0
    trials = _study(tmp_path).trials
    assert len(trials) == 3 and trials[2].state.name in ("COMPLETE", "PRUNED")
    assert [t.params for t in trials[:2]] == [done.params, pruned.params]


def test_bad_sweep_files(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    for data, msg in (
        ({"space": {"vapo.nope": {"type": "float", "low": 0, "high": 1}}}, "not a config field"),
        ({"space": {"vapo.mu": {"type": "beta"}}}, "type must be one of"),
        (
            {"space": {"vapo.mu": {"type": "float", "low": 0, "high": 1}}, "pruner": {"name": "x"}},
            "pruner.name",
        ),
        ({"space": {}}, "empty search space"),
        ({"colour": 1}, "unknown key"),
    ):
        bad.write_text(yaml.safe_dump(data))
        assert main([str(bad), "--out", str(tmp_path / "o")]) == 2
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    spec = load_sweep(ROOT / "sweeps" / "vapo_alpha.yaml")
    assert set(spec.space) == {
        "vapo.alpha",
        "vapo.mu",
        "vapo.eps_high",
        "vapo.value_pretrain_steps",
        "ppo.critic_lr",
    }


@pytest.mark.slow
def test_killed_sweep_trial_is_retried_and_resumes_from_its_checkpoint(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "long.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": "long",
                "preset": "smoke",
                "objective": "best",
                "n_trials": 1,
                "base": {"components": ["clip_higher"], "eval_every": 5, "checkpoint_every": 2, "steps": 30},
                "pruner": {"name": "none"},
                "space": {"vapo.eps_high": {"type": "float", "low": 0.2, "high": 0.4}},
                "enqueue": [{"vapo.eps_high": 0.3}],
            }
        )
    )
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.sweep",
        str(path),
        "--model",
        "random",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--out",
        str(tmp_path / "sw"),
        "--heartbeat",
        "1",
        "--grace",
        "2",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmp_path / "sw" / "trials" / "long-t0"
    deadline = time.time() + 180
    while time.time() < deadline and not (run / "checkpoints" / "last.ckpt").is_file():
        time.sleep(0.2)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "summary.json").is_file()
    time.sleep(3.5)  # past the grace period: the next worker fails the trial and retries it
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    study = optuna.load_study(study_name="long", storage=f"sqlite:///{tmp_path / 'sw' / 'sweeps.db'}")
    states = [t.state.name for t in study.trials]
    assert states == ["FAIL", "COMPLETE"], states
    assert study.trials[1].params == study.trials[0].params == {"vapo.eps_high": 0.3}
    assert study.trials[1].user_attrs["run_dir"] == str(run)  # the retry continued the same folder
    steps = pd.read_csv(run / "metrics.csv")["step"].tolist()
    assert steps == list(
        range(0, 31)
    )  # base eval row, then every iteration once (resumed from the checkpoint)


def test_a_search_range_outside_the_valid_one_is_refused_before_any_trial(tmp_path, capsys):
    """Failed trials do not count towards n_trials: a range that leaves the valid one used to fail
    trial after trial, each with a traceback, for ever."""
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": "bad",
                "preset": "smoke",
                "n_trials": 1,
                "space": {"ppo.eps": {"type": "float", "low": 0.1, "high": 1.5}},
            }
        )
    )
    assert main([str(path), "--model", "random", "--wandb", "disabled", "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "vapo-sweep: error: bad: space ppo.eps: the value 1.5 gives an invalid run "
        "(ppo.eps=1.5 is out of range; valid range: [0.0, 1.0))"
    )
    assert not (tmp_path / "sw").exists()
