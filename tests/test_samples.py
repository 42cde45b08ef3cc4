"""What the model wrote reaches the run folder: samples.jsonl holds a few episodes of every iteration
and every evaluation (prompt, response, reward, verdict; a multi-turn episode's observations and tool
calls), a resumed run neither loses nor repeats a line, no secret is written, and vapo-train prints
one every N iterations. (The W&B table: tests/test_wandb.py, test_training_run_axes.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_multiturn import run_script

from vapo_lit.config import RunConfig, merge
from vapo_lit.experience import Experience, score
from vapo_lit.presets import PRESETS
from vapo_lit.samples import FILE, SamplesFile, experience_rows
from vapo_lit.tasks import get_task
from vapo_lit.train import train

ROOT = Path(__file__).resolve().parents[1]
TOOLCHAIN = {"task": "toolchain", "task_options": {"max_n": 3, "eval_per_bucket": 2}}


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / FILE).read_text().splitlines()]


def smoke(tmp_path, **delta):
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "model": "random",
            "wandb": "disabled",
            "steps": 2,
            "eval_every": 1,
            "out_dir": str(tmp_path / "runs"),
            "name": "r",
            "cache_dir": str(tmp_path / "cache"),
            "threads": 1,
            **delta,
        },
    )
    train(cfg)
    return tmp_path / "runs" / "r"


def test_a_single_turn_run_writes_its_episodes(tmp_path, capsys):
    run = smoke(tmp_path, print_sample_every=2)
    rows = lines(run)
    metrics = [r.split(",") for r in (run / "metrics.csv").read_text().splitlines()]
    iterations = len(metrics) - 2  # the header and the base eval's row
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert [r["iteration"] for r in train_rows] == [i for i in range(1, iterations + 1) for _ in range(4)]
    assert [r["value_pretraining"] for r in train_rows[:8]] == [
        True
    ] * 8 and "value_pretraining" not in train_rows[8]
    evals = [(r["iteration"], r["ppo_update"]) for r in rows if r["phase"] == "eval"]
    assert evals == [(0, 0)] * 4 + [(3, 1)] * 4 + [(4, 2)] * 4  # the base policy's, then one per PPO update
    task = get_task("chain", **PRESETS["smoke"]["task_options"])
    for r in rows:
        assert r["prompt"].startswith("chain ") and isinstance(r["response"], str)
        assert r["reward"] == r["verdict"]["reward"] in (0.0, 1.0) and r["verdict"]["error"] is None
        assert r["response_tokens"] >= 1 and "tool_calls" not in r
        problem = task.problem_from_prompt(r["prompt"]) if hasattr(task, "problem_from_prompt") else None
        if problem is not None:
            assert task.verify(problem, r["response"]).reward == r["reward"]
    assert [r["index"] for r in train_rows[:4]] == [0, 4, 8, 12]  # spread over the batch's 16 responses
    out = capsys.readouterr().out
    assert out.count("--- sample: iteration") == 2  # iterations 2 and 4 of 4
    assert (
        "--- sample: iteration 2 · ppo 0 · train" in out and f"response: {train_rows[4]['response']}" in out
    )


def test_samples_per_iteration_zero_writes_no_file(tmp_path):
    run = smoke(tmp_path, samples_per_iteration=0, steps=1)
    assert (run / "metrics.csv").is_file() and not (run / FILE).exists()


def test_a_multi_turn_run_writes_observations_and_tool_calls(tmp_path):
    run = smoke(tmp_path, **TOOLCHAIN, samples_per_iteration=8)
    rows = lines(run)
    assert rows and all("observations" in r and "tool_calls" in r for r in rows)
    called = [r for r in rows if r["observations"]]
    assert called, "no episode called a tool"
    for r in called:
        assert len(r["tool_calls"]) == len(r["observations"])  # every observation answers the turn before it
        assert all(o["text"] in r["response"] and o["end"] > o["start"] for o in r["observations"])
        assert all(c["text"] in r["response"] for c in r["tool_calls"])


def test_an_episodes_line_names_its_calls_and_the_tools_answers():
    """A scripted toolchain episode: its line holds each call (tool name, arguments) and each
    observation at its token columns."""
    task = get_task("toolchain")
    problem = task.make_problem(4, 3, "519")
    ro = run_script(task, [problem], ["call look 3: ? 3: 1 call key ? => 2"])
    exp = Experience.from_rollout(ro, [problem])
    score(exp, task.verify_batch(exp.problems, exp.texts))
    (row,) = experience_rows(exp, task, task.tokenizer, iteration=7, ppo_update=5, limit=4)
    answer = task.tools["look"].fn(problem, ["3:"])
    assert row["response"] == f"call look 3: ? {answer} 3: 1 call key ? error unknown tool => 2"
    assert [(c["name"], c["arguments"]) for c in row["tool_calls"]] == [("look", ["3:"]), ("key", [])]
    assert [o["text"] for o in row["observations"]] == [answer, "error unknown tool"]
    tokens = exp.response_ids[0].tolist()
    for o in row["observations"]:
        assert task.tokenizer.decode(tokens[o["start"] : o["end"]]) == o["text"]
        assert exp.obs_mask[0, o["start"] : o["end"]].all() and not exp.mask[0, o["start"] : o["end"]].any()
    assert row["reward"] == float(exp.scores[0]) and (row["iteration"], row["ppo_update"], row["phase"]) == (
        7,
        5,
        "train",
    )


def test_no_secret_reaches_the_file(tmp_path, monkeypatch):
    """A prompt holding a database URL with its password and a response holding a secret from the
    environment: both masked in the line."""
    from vapo_lit.samples import episode_row

    monkeypatch.setenv("WANDB_API_KEY", "k3yK3yK3y")
    row = episode_row(
        None,
        iteration=1,
        ppo_update=1,
        phase="train",
        index=0,
        prompt="connect to postgresql://vapo:pw9Secret@db/x",
        response="the key is k3yK3yK3y",
        reward=0.0,
        error=None,
        strict=None,
        truncated=False,
        tokens=3,
    )
    f = SamplesFile(tmp_path / FILE, None)
    f.append([row])
    text = (tmp_path / FILE).read_text()
    assert "pw9Secret" not in text and "k3yK3yK3y" not in text and "postgresql://vapo:***@db/x" in text


def test_resume_keeps_the_lines_up_to_the_checkpoint(tmp_path):
    """Lines past the checkpoint's iteration go (they are written again), a line a crash cut short
    goes with a warning, a damaged line elsewhere is refused naming the file and line."""
    path = tmp_path / FILE
    rows = [{"iteration": i, "phase": "train"} for i in (0, 1, 1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 4, "pha')
    with pytest.warns(RuntimeWarning, match="dropped a partial last line"):
        SamplesFile(path, keep_until=1)
    assert [json.loads(line)["iteration"] for line in path.read_text().splitlines()] == [0, 1, 1]
    path.write_text('{"iteration": 0}\nnot json\n{"iteration": 1}\n')
    with pytest.raises(ValueError, match=r"samples.jsonl, line 2: not a sample"):
        SamplesFile(path, keep_until=1)
    SamplesFile(path, keep_until=None)  # a fresh run starts the file over
    assert not path.exists()


def test_a_run_killed_mid_checkpoint_resumes_to_the_uninterrupted_runs_lines(tmp_path):
    """A multi-turn run killed while writing its second checkpoint (its samples up to that iteration on
    disk, the checkpoint two iterations back) and resumed: the same lines as a run never killed."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "VAPO_LIT_FAULT"},
        "WANDB_MODE": "offline",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    base = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--task",
        "toolchain",
        "--task_options",
        json.dumps(TOOLCHAIN["task_options"]),
        "--steps",
        "3",
        "--checkpoint_every",
        "2",
        "--eval_every",
        "1",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--out_dir",
        str(tmp_path / "runs"),
    ]
    ref = subprocess.run(
        base + ["--name", "ref", "--cache_dir", str(tmp_path / "c1")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    killed = subprocess.run(
        base + ["--name", "killed", "--cache_dir", str(tmp_path / "c2")],
        env={**env, "VAPO_LIT_FAULT": "checkpoint:2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    cut = lines(tmp_path / "runs" / "killed")
    assert max(r["iteration"] for r in cut) == 4  # iterations 3 and 4 are past the checkpoint (iteration 2)
    resumed = subprocess.run(
        [sys.executable, "-m", "vapo_lit.cli.train", "--resume", str(tmp_path / "runs" / "killed")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert lines(tmp_path / "runs" / "killed") == lines(tmp_path / "runs" / "ref")
