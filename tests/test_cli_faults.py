"""Every fault is one line with the fix and a stable exit code (2 bad input, 130 interrupted with the
command that continues, 1 runtime failure), never a traceback: a corrupt checkpoint on --resume,
Ctrl-C in vapo-train, a full disk and a failing database in vapo-ablate (the claimed cell handed
back, not left RUNNING), an unwritable --out with PostgreSQL storage (no study created first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vapo_lit.ablate.store import CellStore
from vapo_lit.cli.ablate import main as ablate_main
from vapo_lit.cli.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SMOKE = ["--preset", "smoke", "--model", "random", "--wandb", "disabled", "--threads", "1"]


def one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.startswith(("vapo-train", "vapo-ablate"))]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_corrupt_checkpoint_on_resume_is_one_line_with_what_to_do(tmp_path, capsys):
    run = tmp_path / "runs" / "r"
    assert (
        train_main(
            [
                *SMOKE,
                "--steps",
                "2",
                "--checkpoint_every",
                "1",
                "--out_dir",
                str(tmp_path / "runs"),
                "--name",
                "r",
                "--cache_dir",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    ckpt = run / "checkpoints" / "last.ckpt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])  # e.g. a copy that stopped half way
    capsys.readouterr()
    assert train_main(["--resume", str(run)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"checkpoint {ckpt} is unreadable" in line and "start the run over under another --name" in line


def test_ctrl_c_exits_130_with_the_resume_command(tmp_path):
    """A real SIGINT to a real vapo-train process, as a terminal's Ctrl-C sends it."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "vapo_lit.cli.train",
            *SMOKE,
            "--steps",
            "200",
            "--checkpoint_every",
            "1",
            "--out_dir",
            str(runs),
            "--name",
            "r",
            "--cache_dir",
            str(tmp_path / "c"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    deadline = time.time() + 240
    while time.time() < deadline and not (runs / "r" / "checkpoints" / "last.ckpt").is_file():
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert (
        one_line(err) == f"vapo-train: interrupted (SIGINT); continue with: vapo-train --resume {runs / 'r'}"
    )


def test_sigterm_is_treated_like_ctrl_c(tmp_path, capsys, monkeypatch):
    """SIGTERM (what a scheduler or `kill` sends) arriving mid-run, here from inside the run."""
    from lightning.pytorch.callbacks import Callback

    import vapo_lit.train

    class Terminate(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if pl_module.iteration == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    real = vapo_lit.train.train
    monkeypatch.setattr(
        vapo_lit.train, "train", lambda cfg, **kw: real(cfg, extra_callbacks=[Terminate()], **kw)
    )
    before = signal.getsignal(signal.SIGTERM)
    runs = tmp_path / "runs"
    assert (
        train_main(
            [
                *SMOKE,
                "--steps",
                "50",
                "--checkpoint_every",
                "1",
                "--out_dir",
                str(runs),
                "--name",
                "r",
                "--cache_dir",
                str(tmp_path / "c"),
            ]
        )
        == 130
    )
    assert (
        one_line(capsys.readouterr().err)
        == f"vapo-train: interrupted (SIGTERM); continue with: vapo-train --resume {runs / 'r'}"
    )
    assert signal.getsignal(signal.SIGTERM) is before  # the command put the handlers back


# ----------------------------------------------------------------------------- vapo-ablate
def _grid(tmp_path, out="out", *extra):
    return [
        *SMOKE,
        "--seeds",
        "1",
        "--drop",
        "clip_higher",
        "--steps",
        "3",
        "--checkpoint_every",
        "1",
        "--out",
        str(tmp_path / out),
        "--cache_dir",
        str(tmp_path / "c"),
        "--no-report",
        *extra,
    ]


def test_disk_full_in_a_cell_hands_it_back_and_the_rerun_resumes(tmp_path, capsys, monkeypatch):
    """Injected ENOSPC while the first cell writes a checkpoint: the worker stops with one line, the
    cell is WAITING again (not RUNNING until the grace period, not a used retry); the rerun finishes
    it from its last checkpoint."""
    from vapo_lit import faults

    monkeypatch.setattr(faults, "_seen", {})
    monkeypatch.setenv(faults.ENV, "checkpoint:3:enospc")
    assert ablate_main(_grid(tmp_path)) == 1
    line = one_line(capsys.readouterr().err)
    assert (
        line.startswith("vapo-ablate: error: disk full in cell ")
        and "rerun the same command to continue" in line
    )
    url = f"sqlite:///{tmp_path / 'out' / 'ablate.db'}"
    states = sorted(t.state.name for t in CellStore(url).trials())
    assert "RUNNING" not in states and "FAIL" not in states, states
    monkeypatch.delenv(faults.ENV)
    assert ablate_main(_grid(tmp_path)) == 0
    assert sorted(t.state.name for t in CellStore(url).trials()) == ["COMPLETE", "COMPLETE"]
    handed = [
        d
        for d in (tmp_path / "out" / "runs").iterdir()
        if any(
            json.loads(x).get("outcome") == "handed back"
            for x in (d / "attempts.jsonl").read_text().splitlines()
        )
    ]
    assert len(handed) == 1
    modes = [
        json.loads(x)["mode"]
        for x in (handed[0] / "attempts.jsonl").read_text().splitlines()
        if json.loads(x)["event"] == "start"
    ]
    assert modes == ["fresh", "resume"]


def test_a_failing_database_mid_grid_is_one_line_and_the_cell_is_handed_back(tmp_path, capsys, monkeypatch):
    import sqlalchemy.exc

    def broken(self, *a, **kw):
        raise sqlalchemy.exc.OperationalError(
            "UPDATE trials ...", {}, Exception("server closed the connection")
        )

    monkeypatch.setattr(CellStore, "complete", broken)
    assert ablate_main(_grid(tmp_path)) == 1
    line = one_line(capsys.readouterr().err)
    assert (
        line.startswith("vapo-ablate: error: storage error in cell ") and "check the database server" in line
    )
    states = [t.state.name for t in CellStore(f"sqlite:///{tmp_path / 'out' / 'ablate.db'}").trials()]
    assert sorted(states) == ["WAITING", "WAITING"]  # the claimed one handed back, the other never claimed


def test_unwritable_out_with_postgresql_storage_creates_no_study(tmp_path, capsys, pg_url):
    import sqlalchemy

    (tmp_path / "afile").write_text("x")
    assert ablate_main(_grid(tmp_path, "afile/out", "--storage", pg_url)) == 2
    line = one_line(capsys.readouterr().err)
    assert "--out" in line and "is a file, not a folder" in line
    engine = sqlalchemy.create_engine(pg_url)
    assert sqlalchemy.inspect(engine).get_table_names() == []  # nothing was created in the database
    engine.dispose()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            [
                "--drop",
                "clip_higher",
                "--storage-password-file",
                "/no/such/file",
                "--storage",
                "postgresql://u@h/d",
            ],
            "--storage-password-file /no/such/file: cannot read it",
        ),
        (["--drop", "clip_higher", "--seeds", "0"], "--seeds must be >= 1"),
    ],
)
def test_ablate_bad_input_is_exit_2(tmp_path, capsys, argv, needle):
    assert ablate_main([*SMOKE, "--out", str(tmp_path / "o"), *argv]) == 2
    assert needle in one_line(capsys.readouterr().err)


def test_a_cell_with_an_unreadable_checkpoint_starts_over_instead_of_failing_every_retry(tmp_path, capsys):
    from vapo_lit.cli.ablate import build_parser, make_plans

    cells = make_plans(build_parser().parse_args(_grid(tmp_path)))(1).cells
    run = cells[0].run_dir
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 not a whole zip file")
    (run / "metrics.csv").write_text("step\n0\n")
    assert ablate_main(_grid(tmp_path)) == 0
    starts = [
        a for a in map(json.loads, (run / "attempts.jsonl").read_text().splitlines()) if a["event"] == "start"
    ]
    assert [a["mode"] for a in starts] == ["fresh"]
    assert list((tmp_path / "out" / "runs" / ".partial").iterdir())  # the unreadable attempt kept aside
