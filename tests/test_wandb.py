"""What reaches W&B, read back from the offline run files (tests/wandb_offline.py), not from a mock:
the axes of a training run, the grid run (its table equal to table.csv, one run after two report
runs), the study run of a sweep, the workspace specification, and that no secret is recorded and
no network connection is attempted offline.

    .venv/bin/python -m pytest tests/test_wandb.py
"""

from __future__ import annotations

import csv
import json
import math
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from vapo_lit.cli.ablate import main as ablate
from vapo_lit.cli.report import main as report
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.train import train
from vapo_lit.samples import COLUMNS, table_row
from vapo_lit.wandb_runs import AXES, PPO_AXIS, PRETRAIN_AXIS, SAMPLES_KEY, stable_id
from report_synth import write_manifest, write_run
from wandb_offline import read_run, wait_complete

SECRET_PW = "Sup3rSecretPw"  # in sys.argv, as a storage URL's password
SECRET_KEY = "0123456789abcdef0123456789abcdef01234567"  # WANDB_API_KEY, with the mode forced offline


def offline_runs(folder: Path) -> list[Path]:
    files = sorted(Path(folder).glob("offline-run-*/run-*.wandb"))
    for f in files:
        wait_complete(f)
    return files


def table_of(run_file: Path, key: str) -> dict:
    """The wandb.Table logged under `key` (the last one), as {'columns', 'data'}."""
    paths = [
        h[f"{key}/path"] for h in read_run(run_file)["history"] if f"{key}/path" in h
    ]  # (a nested value)
    assert paths, f"{run_file}: no {key} logged"
    return json.loads((run_file.parent / "files" / paths[-1]).read_text())


def csv_values(path: Path) -> tuple[list[str], list[list]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def same(logged, text: str) -> bool:
    """A table cell as logged equals the CSV field it came from."""
    if text == "":
        return logged is None
    try:
        want = float(text)
    except ValueError:
        return logged == text
    if not math.isfinite(want):
        return logged == text
    return isinstance(logged, (int, float)) and math.isclose(float(logged), want, rel_tol=0, abs_tol=0)


class Listener:
    """A local TCP server that counts connections: set as proxy and W&B base URL, any request an
    offline run makes lands here."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.hits, self.stop = 0, False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.hits += 1
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline with a (fake) API key in the environment, every proxy and the W&B URL pointing at
    a listener, a storage password in sys.argv; yields the listener."""
    lst = Listener()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for k in ("WANDB_MODE", "WANDB_QUIET", "WANDB_SILENT", "NO_PROXY", "no_proxy", "VAPO_LIT_WANDB_SUMMARY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", SECRET_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", lst.url)
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(k, lst.url)
    monkeypatch.setattr(sys, "argv", [sys.argv[0], f"postgresql://u:{SECRET_PW}@db.invalid/x"])
    yield lst
    lst.close()


def test_training_run_axes(tmp_path, offline):
    """Every PPO metric is stepped on ppo/update (0 = the base policy, 1 = the first update, value
    pretraining does not move it); value pretraining is under value_pretrain/ on its own axis."""
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "model": "random",
            "wandb": "offline",
            "steps": 3,
            "eval_every": 1,
            "out_dir": str(tmp_path / "runs"),
            "name": "r",
            "cache_dir": str(tmp_path / "cache"),
            "threads": 1,
            "vapo": {"value_pretrain_steps": 2},
        },
    )
    train(cfg)
    (run_file,) = offline_runs(tmp_path / "runs" / "r" / "wandb")
    run = read_run(run_file)
    history = [h for h in run["history"] if not any(k.startswith(f"{SAMPLES_KEY}/") for k in h)]
    samples, axes = [h for h in run["history"] if h not in history], run["metrics"]
    with open(tmp_path / "runs" / "r" / "metrics.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    # the samples table: one row of its own per iteration (the base eval's first), the lines of samples.jsonl
    lines = [json.loads(line) for line in open(tmp_path / "runs" / "r" / "samples.jsonl")]
    assert len(samples) == len(csv_rows) and axes[SAMPLES_KEY] == PPO_AXIS
    tables = [json.loads((run_file.parent / "files" / h[f"{SAMPLES_KEY}/path"]).read_text()) for h in samples]
    assert [row for t in tables for row in t["data"]] == [table_row(line) for line in lines]
    assert all(t["columns"] == list(COLUMNS) for t in tables)
    assert [h[PPO_AXIS] for h in samples] == [t["data"][0][1] for t in tables]
    assert len(history) == len(csv_rows) == 1 + 2 + 3  # base eval, 2 value-pretraining, 3 PPO iterations
    pre = [h for h in history if PRETRAIN_AXIS in h]
    ppo = [h for h in history if PPO_AXIS in h]
    assert [h[PRETRAIN_AXIS] for h in pre] == [1, 2] and [h[PPO_AXIS] for h in ppo] == [0, 1, 2, 3]
    assert all(not any(k.startswith(("value/", "policy/", "eval/", "rollout/")) for k in h) for h in pre)
    assert "value_pretrain/value/loss" in pre[0] and "value/loss" in ppo[1]
    for h, row in zip(history, csv_rows):  # the compute axes are the logged cumulative columns
        assert math.isclose(h["tokens/generated"], float(row["perf/cumulative_tokens"]))
        assert math.isclose(h["time/wall_seconds"], float(row["perf/cumulative_seconds"]))
    logged = {k for h in history for k in h if not k.startswith("_")}
    for key in logged - set(AXES) - {PRETRAIN_AXIS}:
        want = PRETRAIN_AXIS if key.startswith("value_pretrain/") and key.count("/") > 1 else PPO_AXIS
        assert axes.get(key) == want, (key, axes.get(key))
    assert axes["value_pretrain/steps"] == PPO_AXIS  # the phase's summary is logged in the first PPO row
    assert offline.hits == 0


def _grid(tmp_path, *extra) -> list[str]:
    return [
        "--seeds",
        "2",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--wandb",
        "offline",
        "--threads",
        "1",
        "--steps",
        "2",
        "--eval_every",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--drop",
        "positive_lm_loss",
        *extra,
    ]


def check_grid_run(folder: Path, group: str, project: str, cell_ids: list) -> Path:
    """The one grid run in FOLDER/wandb holds the report folder: its tables equal the CSVs."""
    (run_file,) = offline_runs(folder / "wandb")
    run = read_run(run_file)
    assert run["run"].run_id == stable_id("report", project, group)
    assert run["run"].run_group == group and run["run"].job_type == "report"
    assert sorted(run["config"]["cell_run_ids"]) == sorted(cell_ids)
    for name in ("table", "seeds", "calibration"):  # every column, every row, every value of the CSV
        header, rows = csv_values(folder / f"{name}.csv")
        logged = table_of(run_file, f"grid/{name}")
        assert logged["columns"] == header, name
        assert len(logged["data"]) == len(rows), name
        for got, want in zip(logged["data"], rows):
            assert all(same(g, w) for g, w in zip(got, want)), (name, got, want)
    assert {"delta_final", "delta_final_p_holm", "delta_auc_p_holm"} <= set(
        table_of(run_file, "grid/table")["columns"]
    )
    links = table_of(run_file, "grid/cells")
    assert sorted(r[links["columns"].index("wandb_id")] for r in links["data"]) == sorted(cell_ids)
    caveats = [r[0] for r in table_of(run_file, "grid/caveats")["data"]]
    assert any("need not add up" in c for c in caveats)
    figures = {k.rsplit("/", 1)[0] for h in run["history"] for k in h if k.startswith("figures/")}
    assert figures == {f"figures/{p.stem}" for p in folder.glob("*.png")}
    return run_file


def no_secret_in(folder: Path) -> None:
    for path in Path(folder).rglob("*"):  # no secret in any logged config, history or file
        if path.is_file():
            data = path.read_bytes()
            assert SECRET_PW.encode() not in data and SECRET_KEY.encode() not in data, path


def test_grid_run_holds_the_report_and_is_one_run_after_two_reports(tmp_path, offline, capsys):
    """Synthetic logs (tests/report_synth.py) whose run cards say the cells were logged offline."""
    out = tmp_path / "o"
    cells = []
    for row in ("vapo", "vapo-no-clip_higher"):
        for seed in range(3):
            evals = {
                u: 0.1 + 0.05 * u + (0.02 if row == "vapo" else 0.0) + 0.01 * seed * (u > 0)
                for u in range(0, 5, 2)
            }
            d = write_run(out / "runs" / f"{row}-s{seed}", row, seed, evals, steps=4, wandb="offline")
            card = json.loads((d / "run_card.json").read_text())
            card["wandb"].update({"id": f"{row[-4:]}{seed}", "project": "proj", "group": "syn"})
            (d / "run_card.json").write_text(json.dumps(card))
            cells.append((row, seed, d))
    write_manifest(out, "syn", ["vapo", "vapo-no-clip_higher"], cells)
    ids = [json.loads((d / "run_card.json").read_text())["wandb"]["id"] for *_, d in cells]
    folder = out / "reports" / "syn"
    assert report([str(out), "--grid", "syn"]) == 0  # with figures
    printed = capsys.readouterr().out
    assert f"W&B grid run {stable_id('report', 'proj', 'syn')} (group syn, offline)" in printed
    assert "wandb sync " in printed and not [
        line for line in printed.splitlines() if line.startswith("wandb:")
    ]
    check_grid_run(folder, "syn", "proj", ids)
    before = time.time()
    assert report([str(out), "--grid", "syn", "--no-figures"]) == 0
    second = check_grid_run(folder, "syn", "proj", ids)  # still one grid run, the same id, written anew
    assert second.stat().st_mtime >= before - 1
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("wandb:")]
    no_secret_in(out)
    assert offline.hits == 0


@pytest.mark.slow
def test_ablate_logs_cells_on_the_ppo_axis_and_the_grid_run(tmp_path, offline, capsys):
    """End to end: vapo-ablate's cells (real training, offline W&B) and the grid run it logs at the end."""
    assert ablate(_grid(tmp_path)) == 0
    printed = capsys.readouterr().out
    assert not [line for line in printed.splitlines() if line.startswith("wandb:")]  # W&B's own lines: none
    grid = "drop-positive_lm_loss"
    assert (
        f"[{grid}] W&B grid run {stable_id('report', 'vapo-lit', grid)}" in printed
        and "wandb sync " in printed
    )
    cards = sorted((tmp_path / "out" / "runs").glob("*/run_card.json"))
    cell_ids = [json.loads(c.read_text())["wandb"]["id"] for c in cards]
    assert len(cell_ids) == 4
    for card in cards:  # every PPO metric of every cell run on the ppo/update axis
        (run_file,) = offline_runs(card.parent / "wandb")
        axes = read_run(run_file)["metrics"]
        ppo = {
            k: v
            for k, v in axes.items()
            if k.startswith(("policy/", "value/", "eval/", "objective/", "rollout/"))
        }
        assert ppo and set(ppo.values()) == {PPO_AXIS}
    check_grid_run(tmp_path / "out" / "reports" / grid, grid, "vapo-lit", cell_ids)
    no_secret_in(tmp_path / "out")
    assert offline.hits == 0


def test_report_grid_run_follows_the_cells(tmp_path, offline, capsys):
    """Cells without W&B: no grid run; cells offline but `--wandb disabled`: none either."""
    for name, mode, flags in (("none", None, []), ("off", "offline", ["--wandb", "disabled"])):
        out = tmp_path / name
        for seed in range(2):
            write_run(out / "runs" / f"vapo-s{seed}", "vapo", seed, {0: 0.1, 2: 0.3}, steps=2, wandb=mode)
        assert report([str(out), "--no-figures", *flags]) == 0
        assert not list(out.rglob("offline-run-*")) and "W&B grid run" not in capsys.readouterr().out
    assert offline.hits == 0


def test_workspace_command_needs_an_online_account(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "o").mkdir()
    assert report([str(tmp_path / "o"), "--wandb-workspace"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs an online account" in err and "wandb login" in err
    assert report([str(tmp_path / "o"), "--wandb-entity", "me"]) == 2
    assert "--wandb-entity is a --wandb-workspace flag" in capsys.readouterr().err


def test_workspace_spec_offline():
    pytest.importorskip("wandb_workspaces")
    from vapo_lit.report.workspace import PANELS, workspace_spec

    ws = workspace_spec("me", "vapo-lit", "table1", 8, figures=("score", "entropy"))
    spec = ws._to_model().model_dump(by_alias=True, exclude_none=True)  # what save() would send
    assert spec["entity"] == "me" and spec["project"] == "vapo-lit"
    text = json.dumps(spec)
    sections = spec["spec"]["section"]["panelBankConfig"]["sections"]
    rows = sections[0]
    plots = [p["config"] for p in rows["panels"]]
    assert len(plots) == len(PANELS) == 7 and all(p["xAxis"] == PPO_AXIS for p in plots)
    assert [p["metrics"] for p in plots] == [
        ["eval/avg@8"],
        ["objective/score"],
        ["policy/entropy"],
        ["rollout/response_length"],
        ["value/explained_variance"],
        ["value/bias"],
        ["policy/clipfrac_low", "policy/clipfrac_high"],
    ]
    assert all(p["groupAgg"] == "mean" for p in plots)
    pre = [p["config"] for p in sections[2]["panels"]]
    assert all(p["xAxis"] == PRETRAIN_AXIS for p in pre)
    assert '"table1"' in text and "jobType" in text  # filtered to the group, grouped by job_type
    assert "grid/table" in text and "figures/score" in text


def test_sweep_study_run(tmp_path, offline, capsys):
    from vapo_lit.cli.sweep import main as sweep

    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": "tiny",
                "preset": "smoke",
                "objective": "final",
                "n_trials": 2,
                "base": {"components": ["clip_higher", "token_level_loss"], "eval_every": 1, "steps": 1},
                "sampler": {"name": "random", "seed": 0},
                "pruner": {"name": "none"},
                "space": {"vapo.eps_high": {"type": "float", "low": 0.2, "high": 0.4}},
            }
        )
    )
    argv = [
        str(path),
        "--model",
        "random",
        "--wandb",
        "offline",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "sw"),
        "--heartbeat",
        "1",
    ]
    assert sweep(argv) == 0
    printed = capsys.readouterr().out
    assert "W&B study run" in printed and not [ln for ln in printed.splitlines() if ln.startswith("wandb:")]
    (run_file,) = offline_runs(tmp_path / "sw" / "wandb")
    run = read_run(run_file)
    assert run["run"].run_id == stable_id("study", "vapo-lit", "tiny") and run["run"].job_type == "study"
    trials = table_of(run_file, "study/trials")
    assert trials["columns"][:4] == ["number", "state", "value", "vapo.eps_high"] and len(trials["data"]) == 2
    import optuna

    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'sw' / 'sweeps.db'}")
    best = study.best_trial
    assert [r[0] for r in trials["data"]] == [t.number for t in study.trials]
    assert [r[2] for r in trials["data"]] == [t.value for t in study.trials]
    ids = {json.loads((Path(r[-2]) / "run_card.json").read_text())["wandb"]["id"] for r in trials["data"]}
    assert ids == {r[-1] for r in trials["data"]}
    summary = {}
    from wandb_offline import records

    for rec in records(run_file):
        if rec.WhichOneof("record_type") == "summary":
            summary.update(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update}
            )
    assert summary["best/number"] == best.number and summary["best/value"] == best.value
    imp = table_of(run_file, "study/importances")
    assert [r[0] for r in imp["data"]] == ["vapo.eps_high"] and math.isclose(imp["data"][0][1], 1.0)
    assert sweep([*argv, "--n-trials", "2"]) == 0  # continued: the same study run, not a second one
    assert len(offline_runs(tmp_path / "sw" / "wandb")) == 1
    for p in (tmp_path / "sw").rglob("*"):
        if p.is_file():
            assert SECRET_PW.encode() not in p.read_bytes() and SECRET_KEY.encode() not in p.read_bytes(), p
    assert offline.hits == 0
