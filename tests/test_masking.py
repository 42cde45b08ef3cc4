"""The storage password never reaches a file, W&B or the terminal, and can be kept out of `ps`.

W&B records `sys.argv` (its run metadata "args"), so a password typed into `--storage` used to land
in every offline `run-*.wandb` file and be uploaded by `wandb sync`. These tests grep every file a
run writes (run folders, W&B's files, attempts.jsonl, the grid manifest, the report, HOME and TMPDIR
of the process) and its stdout/stderr for the secret.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy
from lightning.pytorch.callbacks import Callback
from wandb_offline import wait_complete

from vapo_lit.ablate.urls import PASSWORD_ENV, with_password
from vapo_lit.masking import mask_url
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.train import train

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cret9Pw7kq"


def files_holding(secret: str, *roots) -> list[str]:
    """Every regular file under `roots` whose bytes contain `secret` (symlinks not followed)."""
    needle = secret.encode()
    hits = []
    for root in roots:
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                    hits.append(str(path))
    return hits


class RecordedArgs(Callback):
    """What W&B records as the run's command line (its settings' `_args`, sent to wandb-core as
    the metadata "args"), read while the run is live."""

    def __init__(self):
        self.args = None

    def on_train_start(self, trainer, pl_module):
        from lightning.pytorch.loggers import WandbLogger

        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                self.args = list(lg.experiment.settings._args)


def test_wandb_records_no_password_from_the_command_line(tmp_path, monkeypatch):
    """In-process: a command line with a password in its storage URL, a run with W&B offline.
    (Whether wandb-core gets to write its metadata into the run file before a short run ends is a
    race, so the recorded args are read from W&B's settings; the files are grepped as well.)"""
    url = f"postgresql://vapo:{SECRET}@db.example:5432/vapo"
    monkeypatch.setattr(sys, "argv", ["vapo-ablate", "--drop", "clip_higher", "--storage", url])
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
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
    recorded = RecordedArgs()
    train(cfg, extra_callbacks=[recorded])
    assert recorded.args == ["--drop", "clip_higher", "--storage", mask_url(url)]
    run_files = list((tmp_path / "runs" / "r" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert run_files, "W&B wrote no offline run file"
    for f in run_files:
        wait_complete(f)  # W&B may still be writing when train() returns
    assert files_holding(SECRET, tmp_path) == []


def test_password_from_file_or_environment_goes_into_the_url(tmp_path, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    pw = tmp_path / "pw"
    pw.write_text("p@ss:w/rd\n")
    url = with_password("postgresql://vapo@127.0.0.1:5432/db", pw)
    assert (
        sqlalchemy.engine.make_url(url).password == "p@ss:w/rd"
    )  # escaped in the URL, intact for the driver
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    assert sqlalchemy.engine.make_url(with_password("postgresql://vapo@h/db")).password == SECRET
    with pytest.raises(ValueError, match="already holds a password; give it once"):
        with_password(f"postgresql://vapo:{SECRET}@h/db")
    with pytest.raises(ValueError, match="the file is empty"):
        (tmp_path / "empty").write_text("")
        with_password("postgresql://vapo@h/db", tmp_path / "empty")
    with pytest.raises(ValueError, match="needs --storage"):
        with_password(None, pw)
    assert with_password("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


def _grid_cmd(tmp_path, out, url):
    grid = tmp_path / "one.yaml"
    grid.write_text("name: one\nrows: [{}]\n")  # one cell: the full recipe
    return [
        sys.executable,
        "-m",
        "vapo_lit.cli.ablate",
        "--grid",
        str(grid),
        "--seeds",
        "1",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--steps",
        "2",
        "--threads",
        "1",
        "--wandb",
        "offline",
        "--storage",
        url,
        "--out",
        str(tmp_path / out),
        "--cache_dir",
        str(tmp_path / "cache"),
    ]


def _env(tmp_path, **extra):
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in (PASSWORD_ENV, "VAPO_LIT_TEST_PG_URL")}
    return {
        **env,
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "WANDB_MODE": "offline",
        "PYTHONWARNINGS": "ignore",
        **extra,
    }


@pytest.mark.slow
def test_no_file_or_output_of_a_grid_holds_the_database_password(tmp_path, pg_url):
    """A real grid on PostgreSQL with W&B offline: the password typed into --storage is nowhere in
    what the run writes or prints; given through VAPO_LIT_STORAGE_PASSWORD it is not in `ps` either."""
    u = sqlalchemy.engine.make_url(pg_url)
    secret = u.password
    assert secret and len(secret) >= 6
    typed = _grid_cmd(tmp_path, "typed", pg_url)
    r = subprocess.run(typed, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert secret not in r.stdout + r.stderr
    run_files = list((tmp_path / "typed").glob("runs/*/wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1 and list((tmp_path / "typed").rglob("attempts.jsonl"))
    assert (tmp_path / "typed" / "grids").is_dir() and (tmp_path / "typed" / "reports").is_dir()

    bare = sqlalchemy.engine.URL.create(
        u.drivername, username=u.username, host=u.host, port=u.port, database=u.database
    ).render_as_string(hide_password=False)
    assert secret not in bare
    proc = subprocess.Popen(
        _grid_cmd(tmp_path, "env", bare),
        cwd=ROOT,
        env=_env(tmp_path, **{PASSWORD_ENV: secret}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cmdlines = []
    while proc.poll() is None:  # what `ps` shows, sampled while it runs
        try:
            cmdlines.append(Path(f"/proc/{proc.pid}/cmdline").read_bytes())
        except OSError:
            break
        time.sleep(0.2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert cmdlines and not any(secret.encode() in c for c in cmdlines)
    assert secret not in out + err
    for f in [*run_files, *(tmp_path / "env").glob("runs/*/wandb/offline-run-*/run-*.wandb")]:
        wait_complete(f)  # every W&B file complete before it is searched
    assert files_holding(secret, tmp_path) == []
