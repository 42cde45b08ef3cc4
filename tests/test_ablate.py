"""vapo-ablate: validation writes nothing, grids and cell identity, reuse of finished cells, two real
worker processes on one SQLite file, SIGKILL + rerun resumes from the checkpoint with the same
table, crashing cells retried then failed, storage passwords masked.

    .venv/bin/python -m pytest tests/test_ablate.py            # all (a minute or two)
    .venv/bin/python -m pytest tests/test_ablate.py -m "not slow"
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from vapo_lit import cpu_pin
from vapo_lit.ablate.grid import (
    BOOKKEEPING,
    available_grids,
    cell_identity,
    cells_of,
    grid_from_drop,
    load_grid,
)
from vapo_lit.ablate.progress import eta_seconds, line
from vapo_lit.ablate.store import CellStore, Status, mask_text, mask_url
from vapo_lit.cli.ablate import main
from vapo_lit.config import COMPONENTS, RunConfig, merge
from vapo_lit.labels import run_label
from vapo_lit.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def flags(tmp_path, out="out", *extra):
    return [
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
        "--cache_dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / out),
        *extra,
    ]


def attempts(run_dir) -> list[dict]:
    path = Path(run_dir) / "attempts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def starts(out) -> dict:
    return {
        d.name: [a for a in attempts(d) if a["event"] == "start"]
        for d in sorted((Path(out) / "runs").iterdir())
        if d.is_dir() and not d.name.startswith(".")
    }


def write_grid(tmp_path, name, rows) -> str:
    import yaml

    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "rows": rows}))
    return str(path)


def numeric_table(out, grid):
    """table.csv's results: less wall time and memory (never equal between two runs) and the
    attempt counts (how the runs went: a killed cell has one attempt more)."""
    t = pd.read_csv(Path(out) / "reports" / grid / "table.csv")
    t = t.set_index("row").select_dtypes("number")
    return t[
        [
            c
            for c in t.columns
            if "second" not in c
            and "peak_memory" not in c
            and c not in ("attempts", "crashes", "interrupted")
        ]
    ]


# ----------------------------------------------------------------------------- validation
def test_bad_drop_exits_fast_and_writes_nothing(tmp_path):
    t0 = time.time()
    r = subprocess.run(
        [PY, "-m", "vapo_lit.cli.ablate", "--drop=not_a_component", "--out", str(tmp_path / "o")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and time.time() - t0 < 10
    assert "not_a_component" in r.stderr and ", ".join(COMPONENTS) in r.stderr
    assert list(tmp_path.iterdir()) == []  # no output folder, no database


def test_unknown_grid_lists_valid_grids(tmp_path, capsys):
    assert main(flags(tmp_path, "o", "--grid", "nope")) == 2
    err = capsys.readouterr().err
    assert "no such grid" in err and all(g in err for g in ("table1", "pairwise", "critic_free"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "url, expect",
    [
        ("not a url", "not a valid database URL"),
        ("sqlite:////no/such/folder/x.db", "does not exist"),
        ("mysql+nosuchdriver://alice:s3cretpw@127.0.0.1:1/vapo", "not a valid database URL"),
    ],
)
def test_bad_storage_url_masked_and_nothing_written(tmp_path, capsys, url, expect):
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--storage", url)) == 2
    captured = capsys.readouterr()
    assert expect in captured.err
    assert "s3cretpw" not in captured.err + captured.out
    assert not (tmp_path / "o").exists()


def test_sqlite_storage_may_sit_in_the_output_folder_it_creates(tmp_path):
    """--storage sqlite:///OUT/grid.db with an OUT not yet made: the grid makes OUT, then the database."""
    from vapo_lit.ablate.grid import grid_from_drop
    from vapo_lit.ablate.runner import open_store, plan

    out = tmp_path / "new"
    p = plan(grid_from_drop(["clip_higher"]), RunConfig(model="random"), [0], out, f"sqlite:///{out}/grid.db")
    assert not out.exists()  # validated, nothing written
    open_store(p)
    assert (out / "grid.db").is_file()
    with pytest.raises(ValueError, match=r"does not exist \(only --out .* is created\)"):
        plan(
            grid_from_drop(["clip_higher"]),
            RunConfig(model="random"),
            [0],
            out / "b",
            f"sqlite:///{out}/c/x.db",
        )


@pytest.mark.parametrize(
    "url, package",
    [
        (
            "postgresql://alice:s3cretpw@127.0.0.1:1/vapo",
            'pip install "psycopg[binary]" (or "vapo-lit[postgres]")',
        ),
        ("postgresql+psycopg://alice:s3cretpw@127.0.0.1:1/vapo", 'pip install "psycopg[binary]"'),
        ("postgresql+psycopg2://alice:s3cretpw@127.0.0.1:1/vapo", "pip install psycopg2-binary"),
        ("mysql+pymysql://alice:s3cretpw@127.0.0.1:1/vapo", "pip install pymysql"),
    ],
)
def test_missing_database_driver_names_the_package(tmp_path, capsys, monkeypatch, url, package):
    for module in ("psycopg", "psycopg2", "pymysql"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--storage", url)) == 2
    err = capsys.readouterr().err
    assert "database driver" in err and "is not installed" in err and package in err, err
    assert "s3cretpw" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_plain_postgresql_url_falls_back_to_psycopg2(monkeypatch):
    """SQLAlchemy 2.1 maps postgresql:// to psycopg 3; with only psycopg2 installed we open it with that."""
    import importlib.util

    from vapo_lit.ablate.urls import engine_url

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "psycopg" else object() if name == "psycopg2" else real(name, *a),
    )
    assert engine_url("postgresql://u:p@h/d") == "postgresql+psycopg2://u:p@h/d"
    assert (
        engine_url("postgresql+psycopg://u:p@h/d") == "postgresql+psycopg://u:p@h/d"
    )  # explicit: left alone
    assert engine_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_unreachable_server_is_one_masked_line_and_nothing_written(tmp_path, capsys):
    pytest.importorskip("psycopg", reason='needs the PostgreSQL driver (pip install "vapo-lit[postgres]")')
    url = "postgresql://alice:s3cretpw@127.0.0.1:1/vapo"
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--storage", url)) == 2
    err = capsys.readouterr().err
    assert (
        "cannot open storage postgresql://alice:***@127.0.0.1:1/vapo" in err
        and len(err.strip().splitlines()) == 1
    )
    assert "s3cretpw" not in err
    assert not (tmp_path / "o").exists()


def test_mask_url():
    assert mask_url("postgresql://bob:pa:ss@db.example/vapo") == "postgresql://bob:***@db.example/vapo"
    assert (
        mask_url("mysql+pymysql://u:x%40y@h:3306/d?charset=utf8")
        == "mysql+pymysql://u:***@h:3306/d?charset=utf8"
    )
    assert (
        mask_url("postgresql://h/d?user=u&password=hunter2&x=1") == "postgresql://h/d?user=u&password=***&x=1"
    )
    assert mask_url("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"
    url = "postgresql://bob:hunter2@db/vapo"
    assert "hunter2" not in mask_text(f"could not connect to {url}: password hunter2 rejected", url)


def test_other_flag_errors(tmp_path, capsys):
    assert main(flags(tmp_path, "o")) == 2  # neither --drop nor --grid
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--grid", "table1")) == 2
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--only", "none")) == 2
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--ppo.eps", "2")) == 2
    assert "ppo.eps=2.0 is out of range" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- grids and cells
def test_one_label_for_run_folders_wandb_and_reports(tmp_path):
    """Every row of every shipped grid (critic-free rows included): the label the grid gives the
    row is the one train() names the run folder and W&B job type with, and the one the report
    derives from the run's config when no grid manifest is there."""
    from vapo_lit.report.collect import label_of
    from vapo_lit.train import run_dir_of

    base = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random"})
    seen = 0
    for name in available_grids():
        for row in load_grid(name).rows:
            cfg = row.config(base)
            assert row.label == run_label(
                cfg.components, cfg.advantage_estimator, cfg.observations, cfg.gae_values
            ), (name, row.label)
            assert run_dir_of(merge(cfg, {"out_dir": "x"})).name == f"{row.label}-s0"
            assert (
                label_of(
                    {
                        "components": cfg.components,
                        "advantage_estimator": cfg.advantage_estimator,
                        "observations": cfg.observations,
                        "gae_values": cfg.gae_values,
                    }
                )
                == row.label
            )
            seen += 1
    assert seen >= 9 + 29 + 3
    assert run_label([], "grpo") == "grpo+" and run_label(list(COMPONENTS)) == "vapo"
    assert run_label(["token_level_loss", "group_sampling"], "grpo") == "grpo+token_level_loss+group_sampling"


def test_shipped_grids_validate_with_the_smoke_preset(tmp_path):
    base = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random"})
    sizes = {
        "table1": 10,
        "pairwise": 29,
        "critic_free": 4,
        "agentic": 7,
        "critic_pilot": 3,
        "table1_long": 11,
    }
    for name, n in sizes.items():
        grid = load_grid(name)
        cells = cells_of(grid, base, [0, 1], tmp_path / "runs")
        assert len(cells) == 2 * n and len({c.cell_id for c in cells}) == 2 * n
        assert {c.cfg.wandb_group for c in cells} == {grid.grid_id}
        assert all(c.cfg.wandb_job_type == c.row for c in cells)
    table1 = [r.label for r in load_grid("table1").rows]
    assert table1[0] == "vapo" and table1[8] == "vanilla_ppo"
    assert table1[1:8] == [f"vapo-no-{c}" for c in COMPONENTS]
    assert table1[9] == "grpo+token_level_loss+clip_higher+group_sampling"  # the critic-free row
    grpo = [
        c
        for c in cells_of(load_grid("critic_free"), base, [0], tmp_path)
        if c.cfg.advantage_estimator == "grpo"
    ]
    full = [c for c in cells_of(load_grid("critic_free"), base, [0], tmp_path) if c.row == "vapo"][0]
    assert grpo and all(
        c.cfg.ppo.responses_per_step == full.cfg.ppo.responses_per_step for c in grpo
    )  # same budget
    assert not (tmp_path / "runs").exists()


def test_tools_grids_validate_with_the_long_preset(tmp_path):
    """The measurement grids in tools/ (rows differing in settings, with their own labels) load and
    validate against the preset they are run with, one distinct cell per row and seed."""
    root = Path(__file__).resolve().parents[1] / "tools"
    base = merge(merge(RunConfig(), PRESETS["long"]), {"model": "random"})
    sizes = {"critic_fit.yaml": 10, "critic_alpha.yaml": 7, "vllm_vs_hf.yaml": 2}
    for name, n in sizes.items():
        grid = load_grid(str(root / name))
        cells = cells_of(grid, base, [0, 1], tmp_path / "runs")
        assert len(cells) == 2 * n and len({c.cell_id for c in cells}) == 2 * n, name
        assert len({c.row for c in cells}) == n, name
    alpha = {c.row: c.cfg for c in cells_of(load_grid(str(root / "critic_alpha.yaml")), base, [0], tmp_path)}
    assert (
        alpha["vapo"].vapo.alpha == PRESETS["long"]["vapo"]["alpha"]
        and alpha["vapo-alpha0.05"].vapo.alpha == 0.05
    )
    assert alpha["vapo-oracle-alpha0.05"].gae_values == "oracle" and alpha["vapo"].gae_values != "oracle"
    # every row pins its critic, so the rows mean the same under any preset
    assert all(
        (c.ppo.critic_lr, c.ppo.critic_epochs, c.vapo.value_pretrain_critic_lr) == (3e-4, 4, None)
        for r, c in alpha.items()
        if "ppo-critic" not in r
    )
    soft = alpha["vapo-ppo-critic6e-5"]
    assert (soft.ppo.critic_lr, soft.ppo.critic_epochs) == (6e-5, 1)
    assert (soft.vapo.value_pretrain_critic_lr, soft.vapo.value_pretrain_critic_epochs) == (3e-4, 4)
    assert load_grid(str(root / "vllm_vs_hf.yaml")).reference == "vapo-hf"
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows:\n  - {}\n  - drop: [clip_higher]\nreference: nope\n")
    with pytest.raises(ValueError, match=r"reference: 'nope' is not a row; rows: vapo, vapo-no-clip_higher"):
        load_grid(str(bad))
    assert not (tmp_path / "runs").exists()


def test_a_grids_contrasts_load_checked_and_reach_the_manifest(tmp_path):
    """`contrasts:` [row, against] pairs: checked against the rows when the grid loads (one-line
    errors naming the file), and written into the manifest the report reads."""
    from vapo_lit.ablate.runner import plan, write_manifest

    long = load_grid("table1_long")
    assert long.contrasts == [("vapo-oracle", "grpo+token_level_loss+clip_higher+group_sampling")]
    assert load_grid("table1").contrasts == []
    rows = "rows:\n  - {}\n  - drop: [clip_higher]\n  - only: []\n"
    for text, says in (
        (
            "contrasts: [[vapo, nope]]",
            "contrast ['vapo', 'nope']: 'nope' is not a row; rows: vapo, vapo-no-clip_higher, vanilla_ppo",
        ),
        ("contrasts: [[vapo, vapo]]", "compares a row with itself"),
        ("contrasts: [vapo]", "a contrast is a pair [row, against] of row labels; got 'vapo'"),
        ("contrasts: {vapo: vanilla_ppo}", "contrasts: expected a list of [row, against] pairs"),
        ("contrasts: [[vapo, vanilla_ppo], [vapo, vanilla_ppo]]", "is given twice"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(rows + text + "\n")
        with pytest.raises(ValueError) as e:
            load_grid(str(bad))
        assert str(e.value).startswith(str(bad)) and says in str(e.value), str(e.value)
    good = tmp_path / "good.yaml"
    good.write_text(rows + "contrasts: [[vapo-no-clip_higher, vanilla_ppo]]\n")
    p = plan(load_grid(str(good)), merge(RunConfig(), {"model": "random"}), [0], tmp_path / "out")
    data = json.loads(write_manifest(p).read_text())
    assert data["contrasts"] == [["vapo-no-clip_higher", "vanilla_ppo"]]


def test_models_are_prepared_once_per_distinct_build_critic_free_rows_apart(tmp_path, monkeypatch):
    """vapo-ablate builds each distinct set of built-in models before its workers start: a critic-free
    row first does not stand in for a later row that needs the critic; seeds and drops share one."""
    import vapo_lit.build
    from vapo_lit.ablate.runner import prepare_models

    calls = []
    monkeypatch.setattr(
        vapo_lit.build, "load_models", lambda cfg, task: calls.append(cfg.advantage_estimator)
    )
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "rows:\n  - {only: [group_sampling], set: {advantage_estimator: grpo}}\n  - {}\n"
        "  - {drop: [clip_higher]}\n"
    )
    base = merge(RunConfig(), PRESETS["smoke"])
    prepare_models(cells_of(load_grid(str(grid)), base, [0, 1], tmp_path / "runs"), log=lambda _: None)
    assert calls == ["grpo", "gae"]


def test_cell_identity_ignores_bookkeeping_only():
    cfg = merge(RunConfig(), PRESETS["smoke"])
    same = merge(
        cfg,
        {
            "out_dir": "x",
            "name": "y",
            "wandb": "offline",
            "wandb_group": "g",
            "threads": 3,
            "cache_dir": "c",
            "checkpoint_every": 7,
            "wandb_job_type": "j",
            "wandb_project": "p",
        },
    )
    assert set(BOOKKEEPING) <= set(RunConfig.__dataclass_fields__)
    assert cell_identity(cfg) == cell_identity(same)
    for delta in (
        {"seed": 1},
        {"steps": 4},
        {"vapo": {"alpha": 0.5}},
        {"components": ["clip_higher"]},
        {"builtin_shape": "vllm"},
        {"builtin_shape": "default"},
    ):
        assert cell_identity(merge(cfg, delta)) != cell_identity(cfg)


def test_a_field_at_its_neutral_value_keeps_older_identities():
    """A field in NEUTRAL, at its value there, hashes as if the config had no such field: a grid
    started before the field existed keeps its cells' identities."""
    from vapo_lit.cache import config_key
    from vapo_lit.config import NEUTRAL, to_dict, without_neutral
    from vapo_lit.pretrain import cache_key

    cfg = merge(RunConfig(), PRESETS["default"])
    older = {k: v for k, v in to_dict(cfg).items() if k not in BOOKKEEPING and k not in NEUTRAL}
    for path in NEUTRAL:
        *parents, name = path.split(".")
        node, fields = cfg, RunConfig.__dataclass_fields__
        for part in parents:
            node = getattr(node, part)
            fields = type(node).__dataclass_fields__
        assert name in fields, path
        assert getattr(node, name) == NEUTRAL[path], path
        if parents:
            del older[parents[0]][name]
    assert cell_identity(cfg) == config_key(older)
    key = cache_key(cfg, steps=50, min_ev=None, samples_per_prompt=16, max_new_tokens=64, task_version="v")
    assert not set(NEUTRAL) & set(key["config"])
    resolved = to_dict(cfg)
    assert "value_pretrain_critic_lr" not in without_neutral(resolved)["vapo"]
    assert "value_pretrain_critic_lr" in resolved["vapo"]  # without_neutral leaves its input alone
    assert cell_identity(merge(cfg, {"vapo": {"value_pretrain_critic_lr": 1e-3}})) != cell_identity(cfg)
    other = cache_key(
        merge(cfg, {"builtin_shape": "vllm"}),
        steps=50,
        min_ev=None,
        samples_per_prompt=16,
        max_new_tokens=64,
        task_version="v",
    )
    assert other["config"]["builtin_shape"] == "vllm"


def test_the_long_presets_pretrained_critic_is_the_one_cached_before_it_had_its_own_rate():
    """The long preset pretrains at 3e-4 x 4 passes through vapo.value_pretrain_critic_*; its critic
    before that was ppo.critic_lr 3e-4 x 4 with the phase's settings at None. Same training, same
    cache entry; another phase rate, another entry."""
    from vapo_lit.pretrain import cache_key

    def key(cfg):
        return cache_key(
            cfg, steps=50, min_ev=None, samples_per_prompt=16, max_new_tokens=2003, task_version="v"
        )

    now = merge(RunConfig(), PRESETS["long"])
    before = merge(
        now,
        {
            "ppo": {"critic_lr": 3e-4, "critic_epochs": 4},
            "vapo": {"value_pretrain_critic_lr": None, "value_pretrain_critic_epochs": None},
        },
    )
    assert (now.ppo.critic_lr, now.vapo.value_pretrain_critic_lr) == (6e-5, 3e-4)
    assert key(now) == key(before)
    assert key(merge(now, {"vapo": {"value_pretrain_critic_epochs": 2}})) != key(now)
    assert cell_identity(now) != cell_identity(before)  # the PPO phase differs: another run


def test_progress_line_and_eta():
    st = Status(done=2, running=1, waiting=3, failed=1, total=7, mean_seconds=10.0)
    assert eta_seconds(st, workers=1) == pytest.approx(35.0)
    assert "2/7 done · 1 running · 3 waiting · 1 failed · ETA 35s" in line("g", st, 1)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_live_view_reads_each_running_cell_from_its_own_files(tmp_path, monkeypatch):
    """Issue 20: the running cells' iteration, phase, last eval and ETA, from attempts.jsonl (running
    since) and metrics.csv's last row; finished cells are not shown; plain stamped lines into a pipe,
    a block redrawn in place (erase, lines, cursor back up) on a terminal."""
    from vapo_lit.ablate.progress import CLEAR, LiveView, live_every

    cells = _cells(tmp_path, seeds=(0, 1, 2))[:3]
    busy, starting, finished = cells
    cfg = busy.cfg
    total = cfg.steps + (cfg.vapo.value_pretrain_steps if "value_pretraining" in cfg.components else 0)
    for c in cells:
        c.run_dir.mkdir(parents=True)
    for c, events in ((busy, ["start"]), (starting, ["end", "start"]), (finished, ["start", "end"])):
        (c.run_dir / "attempts.jsonl").write_text(
            "".join(json.dumps({"event": e, "mode": "fresh", "start": 100.0}) + "\n" for e in events)
        )
    key = f"eval/avg@{cfg.eval_k}"
    head = [
        "step",
        "train/iteration",
        "train/ppo_update",
        "train/value_pretraining",
        key,
        "perf/cumulative_seconds",
    ]
    rows = [[0, 1, 0, 1, 0.25, 2.0], [1, 2, 1, 0, "", 5.0], [2, 3, 2, 0, 0.5, 7.5], [3, 4, 3, 0, "", 10.0]]
    (busy.run_dir / "metrics.csv").write_text("\n".join(",".join(map(str, r)) for r in [head, *rows]) + "\n")
    view = LiveView("g", cells, stream=io.StringIO(), every=30)
    eta = f"{int(round(2.5 * (total - 4)))}s" if 2.5 * (total - 4) < 60 else None
    got = view.lines(now=165.0)
    assert len(got) == 2, got  # the finished cell is not running
    assert got[0].startswith(
        f"[g] running {cfg.name}: it 4/{total} · ppo 3/{cfg.steps} · phase ppo · "
        f"eval avg@{cfg.eval_k} 0.50 @2 · 2.5 s/it · ETA "
    ), got[0]
    if eta:
        assert got[0].endswith(f"ETA {eta}"), got[0]
    assert got[1] == f"[g] running {starting.cfg.name}: starting (models, first rollout) · 1m05s so far"
    view.draw()
    piped = view.stream.getvalue().splitlines()
    assert len(piped) == 2 and all(re.match(r"\d\d:\d\d:\d\d \[g\] running ", x) for x in piped), piped
    tty = LiveView("g", cells, stream=_Terminal(), every=30)
    tty.draw()
    drawn = tty.stream.getvalue()
    assert drawn.startswith(CLEAR) and drawn.endswith("\x1b[1F") and "\n" in drawn and tty._drawn
    tty.around(lambda text: tty.stream.write(text + "\n"))("a cell finished")
    assert (
        tty.stream.getvalue().endswith(CLEAR + "a cell finished\n") and not tty._drawn
    )  # the line replaces the block
    # only the base eval logged (step 0, no train/value_pretraining value): the phase is not known yet
    (busy.run_dir / "metrics.csv").write_text(",".join(head) + "\n0,0,0,,0.25,1.0\n")
    first = LiveView("g", cells, stream=io.StringIO(), every=30).lines(now=165.0)[0]
    assert (
        f"it 0/{total} · ppo 0/{cfg.steps} · phase base eval done · eval avg@{cfg.eval_k} 0.25 @0" in first
    ), first
    monkeypatch.delenv("VAPO_LIT_LIVE_EVERY", raising=False)
    assert live_every() == 30.0
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv("VAPO_LIT_LIVE_EVERY", bad)
        with pytest.raises(ValueError, match="VAPO_LIT_LIVE_EVERY=.*seconds > 0"):
            live_every()


def test_a_grid_piped_to_a_file_says_what_its_running_cells_do(tmp_path):
    """Issue 20: vapo-ablate printed nothing between the start and the first finished cell. Into a
    pipe it prints each running cell's line every VAPO_LIT_LIVE_EVERY seconds (30 by default)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "VAPO_LIT_LIVE_EVERY": "0.2"}
    proc = subprocess.run(
        [PY, "-m", "vapo_lit.cli.ablate", *flags(tmp_path, "out", "--drop=clip_higher", "--no-report")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    live = re.findall(
        r"^\d\d:\d\d:\d\d \[drop-clip_higher\] running (\S+): it (\d+)/(\d+) · ppo \d+/\d+ · "
        r"phase (?:ppo|value-pretrain) · eval avg@\d+ \S+(?: @\d+)? · (?:[\d.]+|-) s/it · ETA \S+$",
        proc.stdout,
        re.M,
    )
    assert live, proc.stdout[-3000:]
    names = {name for name, *_ in live}
    assert names and all(n.startswith(("vapo-s0-", "vapo-no-clip_higher-s0-")) for n in names), names


# ----------------------------------------------------------------------------- running
def test_drop_runs_two_cells_then_reuses_the_full_recipe(tmp_path, capsys):
    assert main(flags(tmp_path, "out", "--drop=value_pretraining")) == 0
    out = tmp_path / "out"
    text = capsys.readouterr().out
    assert "| VAPO (full) | 1 |" in text and "| w/o value_pretraining | 1 |" in text
    for f in (
        "table.md",
        "table.tex",
        "table.csv",
        "score.png",
        "mechanisms.csv",
        "by_length.csv",
        "clip_fractions.png",
        "loss_share.png",
    ):
        assert (out / "reports" / "drop-value_pretraining" / f).is_file(), f
    assert (
        "## Long and short responses" in (out / "reports" / "drop-value_pretraining" / "table.md").read_text()
    )
    assert main(flags(tmp_path, "out", "--drop", "clip_higher,positive_lm_loss")) == 0
    text = capsys.readouterr().out
    assert "1 queued, 1 already finished (reused)" in text
    assert "| w/o clip_higher + positive_lm_loss | 1 |" in text
    runs = starts(out)
    assert len(runs) == 3 and all(len(v) == 1 for v in runs.values()), runs  # the full recipe ran once
    import torch

    cpu = torch.backends.cpu.get_cpu_capability()  # each attempt names the CPU it computed on
    assert all(a["cpu_capability"] == cpu for v in runs.values() for a in v if a["mode"] != "reused")
    assert all(a["cpu"] == cpu_pin.cpu_model() for v in runs.values() for a in v)  # and its CPU model
    # rerunning the same command redoes nothing
    assert main(flags(tmp_path, "out", "--drop=value_pretraining")) == 0
    assert "0 queued, 2 already finished (reused)" in capsys.readouterr().out
    assert all(len(v) == 1 for v in starts(out).values())


def test_crashing_cell_is_retried_then_failed_and_the_rest_finish(tmp_path, capsys, monkeypatch):
    import vapo_lit.train

    real_train = vapo_lit.train.train

    def train(cfg, **kw):  # a row that passes every check and then crashes at run time
        if cfg.name.startswith("broken-"):
            raise RuntimeError("boom: the broken row crashed mid-run")
        return real_train(cfg, **kw)

    monkeypatch.setattr(vapo_lit.train, "train", train)
    grid = write_grid(
        tmp_path, "crashy", [{}, {"label": "broken", "only": [], "set": {"eval_k": 3}}, {"only": []}]
    )
    rc = main(flags(tmp_path, "out", "--grid", grid, "--retries", "1", "--vapo.value_pretrain_steps", "1"))
    assert rc == 1
    text = capsys.readouterr().out
    assert "FAILED broken-s0" in text and "boom" in text
    out = tmp_path / "out"
    store = CellStore(f"sqlite:///{out / 'ablate.db'}")
    by_row = {}
    for t in store.trials():
        by_row.setdefault(t.user_attrs["row"], []).append(t)
    assert [t.state.name for t in by_row["broken"]] == ["FAIL", "FAIL"]  # first try + 1 retry
    assert all("boom" in t.user_attrs["error"] for t in by_row["broken"])
    assert [t.state.name for t in by_row["vapo"]] == ["COMPLETE"]
    assert [t.state.name for t in by_row["vanilla_ppo"]] == ["COMPLETE"]
    table = pd.read_csv(out / "reports" / "crashy" / "table.csv")
    assert list(table["row"]) == ["vapo", "vanilla_ppo"]


def test_a_bad_cell_refuses_the_whole_grid_before_anything_runs(tmp_path, capsys):
    """Issue 8: a cell with an unusable input was queued and run three times before failing."""
    broken = {"task_options": {**PRESETS["smoke"]["task_options"], "no_such_option": 1}}
    grid = write_grid(tmp_path, "crashy", [{}, {"label": "broken", "only": [], "set": broken}])
    t0 = time.time()
    assert main(flags(tmp_path, "out", "--grid", grid)) == 2
    err = capsys.readouterr().err
    assert (
        "cell broken-s0-" in err
        and "row 'broken'" in err
        and "'no_such_option'" in err
        and "valid: min_n" in err
    )
    assert time.time() - t0 < 10
    assert not (tmp_path / "out").exists()  # no folder, no database, nothing queued


def _worker(tmp_path, out, *extra, **kw):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [PY, "-m", "vapo_lit.cli.ablate", *flags(tmp_path, out, *extra)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def trials_by_cell(url) -> dict:
    by = {}
    for t in CellStore(url).trials():
        by.setdefault(t.user_attrs["cell_id"], []).append(t)
    return by


def assert_each_cell_ran_once(out, url, n_cells: int) -> None:
    """What the runner promises: every cell has exactly one COMPLETE trial and one attempt that ran
    it (attempts.jsonl); any other trial is a marked duplicate (PRUNED, duplicate_of) that never ran."""
    runs = starts(out)
    assert len(runs) == n_cells, sorted(runs)
    assert all(len(v) == 1 for v in runs.values()), runs  # no cell started twice
    ran = {a["trial"] for v in runs.values() for a in v}
    by_cell = trials_by_cell(url)
    assert len(by_cell) == n_cells
    for cid, trials in by_cell.items():
        assert [t.state.name for t in trials].count("COMPLETE") == 1, (cid, [t.state.name for t in trials])
        for t in trials:
            if t.state.name != "COMPLETE":
                assert t.state.name == "PRUNED" and "duplicate_of" in t.user_attrs, (cid, t.number, t.state)
                assert t.number not in ran, f"duplicate trial {t.number} of {cid} ran"
    for run in runs:
        assert attempts(Path(out) / "runs" / run)[-1]["outcome"] == "done"


@pytest.mark.slow
def test_two_real_workers_split_a_grid_and_run_each_cell_exactly_once(tmp_path, storage_url):
    rows = [
        {"only": []},
        {"only": ["clip_higher"]},
        {"only": ["token_level_loss"]},
        {"only": ["positive_lm_loss"]},
    ]
    grid = write_grid(tmp_path, "split", rows)
    extra = ("--grid", grid, "--seeds", "2", "--storage", storage_url, "--steps", "6", "--no-report")
    procs = [_worker(tmp_path, "out", *extra) for _ in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert_each_cell_ran_once(tmp_path / "out", storage_url, 8)
    # both commands enqueued the grid at the same moment: under the study lock each cell got one trial
    assert sorted(len(v) for v in trials_by_cell(storage_url).values()) == [1] * 8
    pids = {v[0]["pid"] for v in starts(tmp_path / "out").values()}
    assert pids == {p.pid for p in procs}, (pids, logs)  # both workers took cells


def _cells(tmp_path, seeds=(0, 1)):
    base = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random"})
    return cells_of(grid_from_drop(["clip_higher"]), base, list(seeds), tmp_path / "runs")


def test_two_workers_enqueueing_at_once_add_each_cell_once(tmp_path, storage_url, monkeypatch):
    """The race of two workers started together: both read the study, both see no trial, both add every cell. The
    window between reading and adding is widened here so that, without the lock, it always opens."""
    import threading

    import optuna

    cells = _cells(tmp_path)
    stores = [CellStore(storage_url) for _ in range(2)]
    add = optuna.study.Study.enqueue_trial

    def slow_add(self, *a, **kw):
        time.sleep(0.05)
        return add(self, *a, **kw)

    monkeypatch.setattr(optuna.study.Study, "enqueue_trial", slow_add)
    gate, counts = threading.Barrier(2), []

    def enqueue(store):
        gate.wait()
        counts.append(store.enqueue(cells, "g"))

    threads = [threading.Thread(target=enqueue, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(c["new"] for c in counts) == [0, 4] and sorted(c["pending"] for c in counts) == [0, 4]
    assert sorted(len(v) for v in trials_by_cell(storage_url).values()) == [1] * 4


def test_worker_killed_mid_enqueue_leaves_the_lock_free_and_no_duplicates(tmp_path, storage_url):
    """SIGKILL after the second of four trials is added (the study lock held): the next enqueue
    gets the lock at once and adds exactly the two missing cells."""
    script = (
        "import sys; from pathlib import Path; from vapo_lit.ablate.grid import cells_of, grid_from_drop; "
        "from vapo_lit.ablate.store import CellStore; from vapo_lit.config import RunConfig, merge; "
        "from vapo_lit.presets import PRESETS; "
        "base = merge(merge(RunConfig(), PRESETS['smoke']), {'model': 'random'}); "
        "cells = cells_of(grid_from_drop(['clip_higher']), base, [0, 1], Path(sys.argv[2]) / 'runs'); "
        "CellStore(sys.argv[1]).enqueue(cells, 'g')"
    )
    env = {**os.environ, "VAPO_LIT_FAULT": "enqueue:2", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(
        [PY, "-c", script, storage_url, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert sorted(len(v) for v in trials_by_cell(storage_url).values()) == [1, 1]
    t0 = time.time()
    assert CellStore(storage_url).enqueue(_cells(tmp_path), "g") == {"new": 2, "reused": 0, "pending": 2}
    assert time.time() - t0 < 10  # no lease to wait out
    assert sorted(len(v) for v in trials_by_cell(storage_url).values()) == [1] * 4


@pytest.mark.slow
def test_sigkill_mid_grid_then_rerun_resumes_and_matches_uninterrupted(tmp_path, storage_url):
    rows = [{"only": []}, {"only": ["clip_higher", "token_level_loss"]}, {"drop": ["value_pretraining"]}]
    grid = write_grid(tmp_path, "killme", rows)
    extra = (
        "--grid",
        grid,
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
    modes = [a["mode"] for a in runs[victim.name]]
    assert modes == ["fresh", "resume"], modes  # the killed cell continued from its checkpoint

    clean = _worker(tmp_path, "clean", *extra, "--study", "clean")
    log = clean.communicate(timeout=300)[0]
    assert clean.returncode == 0, log
    a, b = numeric_table(out, "killme"), numeric_table(tmp_path / "clean", "killme")
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9)
    # and the killed run's whole metric history equals the uninterrupted one (perf/ timings aside)
    ma = pd.read_csv(victim / "metrics.csv")
    mb = pd.read_csv(tmp_path / "clean" / "runs" / victim.name / "metrics.csv")
    cols = [c for c in ma.columns if not c.startswith("perf/")]
    pd.testing.assert_frame_equal(ma[cols], mb[cols], check_exact=False, rtol=1e-9)


@pytest.mark.slow
def test_local_workers_flag_spawns_processes(tmp_path, capsys):
    grid = write_grid(tmp_path, "pair", [{"only": []}, {"only": ["clip_higher"]}])
    # rc 0 also means the spawned worker process exited cleanly (run() checks its exit code)
    assert (
        main(flags(tmp_path, "out", "--grid", grid, "--seeds", "2", "--workers", "2", "--steps", "12")) == 0
    )
    runs = starts(tmp_path / "out")
    assert len(runs) == 4 and all(len(v) == 1 for v in runs.values())
    # which process gets how many cells depends on timing (the spawned one needs seconds to import torch)
    assert 1 <= len({v[0]["pid"] for v in runs.values()}) <= 2
    assert "| vanilla PPO | 2 |" in capsys.readouterr().out


def test_store_claim_protocol_duplicates_and_stale_retry(tmp_path, storage_url):
    """The claim rules in-process: a duplicate trial of a running cell is pruned, a COMPLETE cell
    is not enqueued again, a trial without heartbeats past the grace period is failed once and
    retried (the retry copies the cell), and retries stop at the limit."""
    base = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random"})
    cells = cells_of(grid_from_drop(["clip_higher"]), base, [0], tmp_path / "runs")
    url = storage_url
    store = CellStore(url, heartbeat_interval=1, grace_period=1, retries=1)
    other = CellStore(url, heartbeat_interval=1, grace_period=1, retries=1)  # a second worker
    ids = [c.cell_id for c in cells]
    store.enqueue(cells, "g")
    store.study.enqueue_trial(
        {}, user_attrs={"cell_id": ids[0], "row": "vapo", "seed": 0}
    )  # a racing duplicate
    a = store.claim(ids[:1])
    assert a is not None and a.number == 0
    assert other.claim(ids[:1]) is None  # only the duplicate was left: pruned, not run
    dup = [t for t in store.trials() if t.number == 2][0]
    assert dup.state.name == "PRUNED" and dup.user_attrs["duplicate_of"] == 0
    assert store.status(ids).running == 1 and store.status(ids).waiting == 1
    time.sleep(2.5)  # no heartbeat from trial 0 any more: stale
    assert len(other.fail_stale()) == 1 and store.fail_stale() == []  # exactly one worker wins
    stale = [t for t in store.trials() if t.number == 0][0]
    assert stale.state.name == "FAIL" and stale.user_attrs["error"] == "worker stopped sending heartbeats"
    retry = other.claim(ids[:1])
    assert retry is not None and retry.user_attrs["cell_id"] == ids[0] and retry.number == 3
    assert other.fail(retry, "RuntimeError: boom")  # retries=1 used up: no new trial
    assert store.status(ids[:1]).failed == 1 and "boom" in store.status(ids[:1]).errors[ids[0]]
    b = store.claim(ids)
    assert store.complete(b, 0.25, mode="fresh")
    assert store.enqueue(cells, "g") == {"new": 1, "reused": 1, "pending": 0}  # failed cell: fresh retries


def test_cells_are_queued_and_taken_seed_by_seed(tmp_path, monkeypatch):
    """A grid stopped part-way holds whole seeds (every row, so they pair), not whole rows: the
    runner queues seed by seed and workers take the lowest waiting trial."""
    from vapo_lit.ablate import runner

    base = merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random"})
    grid = grid_from_drop(["clip_higher", "positive_lm_loss"])
    p = runner.plan(grid, base, [4, 2, 3], tmp_path / "out")
    assert [(c.row, c.seed) for c in p.cells][:3] == [(p.cells[0].row, s) for s in (4, 2, 3)]  # row-major
    monkeypatch.setattr(runner, "work", lambda spec, log: None)  # queue only: no cell runs
    monkeypatch.setattr(runner, "prepare_models", lambda cells, log: None)
    runner._work(p, 1, runner.progress.LiveView(grid.grid_id, p.cells), log=lambda *_: None)
    store = CellStore(p.url)
    queued = [
        (t.user_attrs["seed"], t.user_attrs["row"]) for t in sorted(store.trials(), key=lambda t: t.number)
    ]
    rows = list(dict.fromkeys(c.row for c in p.cells))
    assert queued == [(s, r) for s in (4, 2, 3) for r in rows]
    first = store.claim([c.cell_id for c in p.cells])
    assert (first.user_attrs["seed"], first.user_attrs["row"]) == (4, rows[0])


def test_a_paused_worker_whose_cell_was_taken_over_stops_training_into_its_folder(tmp_path, monkeypatch):
    """A worker paused past the grace period (SIGSTOP, a suspended laptop: every thread frozen)
    loses its cell: another worker fails the trial as stale and claims its retry. When the paused
    worker wakes up, its heartbeat sees the trial is no longer RUNNING and the run stops at the end
    of that iteration: outcome 'lost', no further row, checkpoint or summary in the run folder (the
    new owner's), and neither trial touched by the loser."""
    import threading

    from lightning.pytorch.callbacks import Callback

    import vapo_lit.train
    from vapo_lit.ablate import worker

    base = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "model": "random",
            "wandb": "disabled",
            "threads": 1,
            "steps": 4,
            "eval_every": 0,
            "checkpoint_every": 1,
            "cache_dir": str(tmp_path / "cache"),
        },
    )
    cell = cells_of(grid_from_drop(["value_pretraining"]), base, [0], tmp_path / "runs")[1]  # no pretraining
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    mine, other = (CellStore(url, heartbeat_interval=1, grace_period=1, retries=1) for _ in range(2))
    mine.enqueue([cell], "g")
    trial = mine.claim([cell.cell_id])

    beats = []  # this worker's Heartbeat

    class Recorded(worker.Heartbeat):
        def __enter__(self):
            beats.append(self)
            return super().__enter__()

    monkeypatch.setattr(worker, "Heartbeat", Recorded)
    awake, real_beat = threading.Event(), mine.heartbeat

    def frozen_beat(trial_id):  # the heartbeat thread sleeps with the rest of the process
        awake.wait(60)
        real_beat(trial_id)

    seen = {}

    class Pause(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if pl_module.iteration != 1:
                return
            monkeypatch.setattr(mine, "heartbeat", frozen_beat)
            deadline = time.time() + 30
            while not other.fail_stale() and time.time() < deadline:  # the other worker's periodic check
                time.sleep(0.2)
            seen["retry"] = other.claim([cell.cell_id])  # ... and it takes the cell over
            awake.set()  # the paused worker wakes up
            deadline = time.time() + 15
            while not beats[0].lost and time.time() < deadline:
                time.sleep(0.05)
            seen["rows"] = (cell.run_dir / "metrics.csv").read_text()
            seen["ckpt"] = (cell.run_dir / "checkpoints" / "last.ckpt").stat().st_mtime_ns

    real_train = vapo_lit.train.train
    monkeypatch.setattr(
        vapo_lit.train,
        "train",
        lambda cfg, resume=False, extra_callbacks=(): real_train(
            cfg, resume=resume, extra_callbacks=[Pause(), *extra_callbacks]
        ),
    )
    assert worker.run_cell(mine, trial, cell, url) == "lost"
    assert seen["retry"] is not None and seen["retry"].number == 1
    assert (cell.run_dir / "metrics.csv").read_text() == seen["rows"]  # step 0 and iteration 1 only
    assert len(seen["rows"].splitlines()) == 3
    assert (cell.run_dir / "checkpoints" / "last.ckpt").stat().st_mtime_ns == seen["ckpt"]
    assert not (cell.run_dir / "summary.json").exists()
    assert attempts(cell.run_dir)[-1]["outcome"] == "lost"
    assert [t.state.name for t in mine.trials()] == ["FAIL", "RUNNING"]
    assert mine.trials()[0].user_attrs["error"] == "worker stopped sending heartbeats"


def test_a_dead_workers_attempt_is_ended_in_its_ledger_and_leaves_the_live_view(tmp_path, monkeypatch):
    """A worker killed outright (SIGKILL, a lost machine) never writes its attempt's end: the live
    view showed the cell as running for the rest of the grid, with its last ETA. The worker that
    fails the trial as stale ends that attempt in the ledger (outcome 'lost'), then takes the retry."""
    from vapo_lit.ablate import worker
    from vapo_lit.ablate.progress import LiveView, running_since
    from vapo_lit.report.logs import read_attempts

    cells = _cells(tmp_path, seeds=(0,))
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    dead = CellStore(url, heartbeat_interval=1, grace_period=1)
    dead.enqueue(cells, "g")
    trial = dead.claim([c.cell_id for c in cells])
    cell = next(c for c in cells if c.cell_id == trial.user_attrs["cell_id"])
    start = {"trial": trial.number, "worker": "elsewhere:1", "pid": 1, "mode": "fresh", "start": time.time()}
    worker._ledger(cell.run_dir, {**start, "event": "start"})
    assert running_since(cell.run_dir) == start["start"]
    time.sleep(2.5)  # no heartbeat: stale

    ran, views = [], []

    def fake_run_cell(store, t, c, url=None):  # what the live view shows when the retry is taken
        views.append(LiveView("g", cells, stream=io.StringIO(), every=30).lines())
        ran.append((t.number, c.cell_id))
        store.complete(t, 0.5, mode="fresh")
        return "done"

    monkeypatch.setattr(worker, "run_cell", fake_run_cell)
    spec = worker.WorkerSpec(
        url, "vapo-ablate", "g", cells, heartbeat_interval=1, grace_period=1, poll_seconds=0.1
    )
    worker.work(spec, log=lambda *_: None)
    records = attempts(cell.run_dir)
    assert [r["event"] for r in records] == ["start", "end"]
    assert records[-1]["outcome"] == "lost" and records[-1]["trial"] == trial.number
    assert "no heartbeat for over 1 s" in records[-1]["error"]
    assert running_since(cell.run_dir) is None and views[0] == []
    assert read_attempts(cell.run_dir / "attempts.jsonl")["lost"] == 1
    assert ran[0] == (
        max(t.number for t in dead.trials() if t.user_attrs["cell_id"] == cell.cell_id),
        cell.cell_id,
    )
    # an attempt that already ended, or another trial's, is left as it is
    worker.note_stale(cell.run_dir, trial.number, 1)
    worker._ledger(cell.run_dir, {**start, "trial": 99, "event": "start"})
    worker.note_stale(cell.run_dir, trial.number, 1)
    assert len(attempts(cell.run_dir)) == 3
    worker.note_stale(tmp_path / "nowhere", 0, 1)
    assert not (tmp_path / "nowhere").exists()


def test_a_worker_told_to_stop_claims_no_more_cells(tmp_path, monkeypatch):
    """The parent of `--workers N` sets a stop Event when it stops early; a worker whose cell ends
    in the seconds before it is interrupted claims nothing more (the cell the parent handed back
    among them), and one that has not claimed yet claims nothing."""
    import threading

    from vapo_lit.ablate import worker

    cells = _cells(tmp_path, seeds=(0,))
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    CellStore(url).enqueue(cells, "g")
    ran = []

    def fake_run_cell(store, t, c, url=None):
        ran.append(c.cell_id)
        store.complete(t, 0.5, mode="fresh")
        stop.set()  # the parent stopped while this cell ran
        return "done"

    monkeypatch.setattr(worker, "run_cell", fake_run_cell)
    spec = worker.WorkerSpec(url, "vapo-ablate", "g", cells, poll_seconds=0.1)
    stop = threading.Event()
    worker.work(spec, log=lambda *_: None, stop=stop)
    assert len(ran) == 1 and len(cells) > 1
    worker.work(spec, log=lambda *_: None, stop=stop)
    assert len(ran) == 1
    assert sorted(t.state.name for t in CellStore(url).trials()).count("WAITING") == len(cells) - 1
    worker.work(spec, log=lambda *_: None)  # no stop: the rest run
    assert sorted(ran) == sorted(c.cell_id for c in cells)


@pytest.mark.slow
def test_sigterm_hands_the_cell_back_and_the_rerun_resumes_it(tmp_path, storage_url):
    grid = write_grid(tmp_path, "term", [{"only": ["clip_higher"]}])
    extra = (
        "--grid",
        grid,
        "--steps",
        "20",
        "--checkpoint_every",
        "2",
        "--grace",
        "600",
        "--storage",
        storage_url,
    )
    out = tmp_path / "out"
    proc = _worker(tmp_path, "out", *extra)
    deadline = time.time() + 180
    while time.time() < deadline and not list(out.glob("runs/*/checkpoints/last.ckpt")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, log
    (run,) = [d for d in (out / "runs").iterdir() if d.is_dir()]
    assert attempts(run)[-1]["outcome"] == "interrupted"
    assert [t.state.name for t in CellStore(storage_url).trials()] == ["WAITING"]
    t0 = time.time()
    rerun = _worker(tmp_path, "out", *extra)
    log = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, log
    assert time.time() - t0 < 120  # no waiting for the (600 s) grace period
    assert [a["mode"] for a in attempts(run) if a["event"] == "start"] == ["fresh", "resume"]
    assert pd.read_csv(run / "metrics.csv")["step"].tolist() == list(range(0, 21))  # step 0: base eval


@pytest.mark.slow
def test_sigterm_to_the_parent_alone_stops_its_local_workers_and_hands_every_cell_back(tmp_path, storage_url):
    """`kill PID` (or a scheduler's SIGTERM) reaches the `vapo-ablate` process only, not the worker
    processes `--workers 2` spawned: it waited for them to finish the whole grid, which they went on
    claiming. It stops them: both running cells are handed back, ready to resume."""
    grid = write_grid(tmp_path, "term2", [{"only": ["clip_higher"]}, {"only": []}])
    # cells far longer than the workers' settle time (runner.SETTLE_SECONDS) on any machine: neither
    # may finish before it is told to stop
    extra = ("--grid", grid, "--steps", "5000", "--checkpoint_every", "2", "--grace", "600")
    extra += ("--workers", "2", "--no-report", "--storage", storage_url)
    out = tmp_path / "out"
    proc = _worker(tmp_path, "out", *extra)
    deadline = time.time() + 240
    while time.time() < deadline and len(list(out.glob("runs/*/checkpoints/last.ckpt"))) < 2:
        time.sleep(0.2)
    assert len(list(out.glob("runs/*/checkpoints/last.ckpt"))) == 2, "both cells never ran at once"
    proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, log
    runs = [d for d in (out / "runs").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(runs) == 2
    for run in runs:
        assert attempts(run)[-1]["outcome"] == "interrupted", (run.name, attempts(run))
        assert not (run / "summary.json").exists()
    assert len({attempts(run)[0]["pid"] for run in runs}) == 2  # one cell per process
    for pid in {a["pid"] for run in runs for a in attempts(run)}:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # no worker left behind
    # handed back (not failed, no retry spent): the rerun resumes them at once, from their checkpoints
    # (what that rerun does is the single-worker test's above)
    assert sorted(t.state.name for t in CellStore(storage_url).trials()) == ["WAITING", "WAITING"]
    assert "stopping 1 local worker process(es)" in log, log[-2000:]


def test_ablate_and_report_do_not_import_each_other():
    """ablate/ runs grids and report/ reads logs; neither imports the other (the CLI joins them)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "vapo_lit"
    for here, other in (("ablate", "vapo_lit.report"), ("report", "vapo_lit.ablate")):
        for path in (root / here).glob("*.py"):
            tree = ast.parse(path.read_text())
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            assert not [m for m in names if m.startswith(other)], (path, names)
