"""What a user sees while vapo-train runs: one status line redrawn in place in a terminal, plain lines
in a log file, nothing unless the command asks; W&B's end-of-run sparklines only when asked, with
every metric still in the offline run file."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from wandb_offline import read_run, wait_complete

from vapo_lit import progress_line
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.progress_line import ProgressLine, fmt_eta
from vapo_lit.train import train


class Terminal(io.StringIO):
    def isatty(self):
        return True


def drive(stream, every=None, steps=6, pretrain=2):
    """Feed a ProgressLine the states of a run: `pretrain` critic-only iterations, then `steps` PPO ones."""
    cfg = merge(merge(RunConfig(), PRESETS["smoke"]), {"steps": steps, "eval_every": 2})
    m = SimpleNamespace(
        cfg=cfg,
        iteration=0,
        ppo_updates=0,
        pretrain=SimpleNamespace(active=True),
        last_metrics={},
        last_eval=None,
        trainer=SimpleNamespace(default_root_dir="/x/runs/vapo-s0"),
    )
    trainer = SimpleNamespace(should_stop=False, is_global_zero=True)
    cb = ProgressLine(stream=stream, every=every)
    cb.on_train_start(trainer, m)
    for it in range(1, steps + pretrain + 1):
        m.iteration = it
        m.pretrain.active = it <= pretrain
        m.ppo_updates = max(0, it - pretrain)
        m.last_metrics = {"objective/score": 0.25, "value/explained_variance": 0.3}
        if m.ppo_updates and m.ppo_updates % 2 == 0:
            m.last_eval = SimpleNamespace(iteration=it, ppo_update=m.ppo_updates, score=0.5)
        trainer.should_stop = it == steps + pretrain
        cb.on_train_batch_end(trainer, m, None, None, it)
    cb.on_train_end(trainer, m)
    return stream.getvalue()


def test_in_a_terminal_it_is_one_line_redrawn_in_place():
    with progress_line.enabled():
        text = drive(Terminal())
    assert text.count("\r") == 8 and text.count("\n") == 1 and text.endswith("\n")
    last = text.rstrip("\n").split("\r")[-1]
    for part in (
        "vapo-s0",
        "it 8/8",
        "ppo 6/6",
        "phase ppo",
        "score 0.25",
        "eval avg@2 0.50 @6",
        "EV 0.30",
        "ETA 0s",
    ):
        assert part in last, (part, last)
    assert "phase value-pretrain" in text.split("\r")[1]


def test_in_a_log_file_it_is_plain_lines():
    with progress_line.enabled():
        text = drive(io.StringIO(), every=4)
    lines = text.splitlines()
    assert "\r" not in text and all(line.startswith("vapo-s0  it ") for line in lines)
    # every 4th iteration, every eval (PPO updates 2, 4, 6 = iterations 4, 6, 8) and the end
    assert [line.split()[2] for line in lines] == ["4/8", "6/8", "8/8"]


def test_silent_unless_the_command_asks(monkeypatch):
    monkeypatch.delenv(progress_line.ENV, raising=False)
    assert drive(Terminal()) == ""
    monkeypatch.setenv(progress_line.ENV, "0")
    with progress_line.enabled():
        assert drive(Terminal()) == ""


def test_eta_format():
    assert (fmt_eta(5), fmt_eta(125), fmt_eta(7300), fmt_eta(float("nan"))) == ("5s", "2m05s", "2h01m", "?")


@pytest.mark.parametrize("loud", [False, True])
def test_wandb_summary_only_when_asked_and_metrics_still_recorded(tmp_path, capfd, monkeypatch, loud):
    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("WANDB_QUIET", "WANDB_SILENT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VAPO_LIT_WANDB_SUMMARY", "1" if loud else "0")
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "model": "random",
            "wandb": "offline",
            "steps": 2,
            "out_dir": str(tmp_path / "runs"),
            "name": "r",
            "cache_dir": str(tmp_path / "cache"),
            "threads": 1,
        },
    )
    train(cfg)
    printed = capfd.readouterr()
    assert ("Run history:" in printed.err + printed.out) == loud
    (run_file,) = (tmp_path / "runs" / "r" / "wandb").glob("offline-run-*/run-*.wandb")
    wait_complete(run_file)
    history = read_run(run_file)["history"]
    scores = [row["objective/score"] for row in history if "objective/score" in row]
    pretrain = [
        row["value_pretrain/objective/score"] for row in history if "value_pretrain/objective/score" in row
    ]
    assert len(pretrain) == 2 and len(scores) == 2  # 2 value-pretraining + 2 PPO iterations, each logged
