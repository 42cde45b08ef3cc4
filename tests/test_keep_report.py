"""tools/keep_report.py (keeping a grid's study under reports/): it copies the manifest and each
cell's logs, never checkpoints; the kept folder gives back the committed report byte for byte; a
cell that has not finished is left out and named; bad input writes nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from keep_report import LOGS, WARMUP, main  # noqa: E402

STUDY = ROOT / "reports" / "vllm-vs-hf"  # a committed study stands in for an output folder
GRID = "vllm_vs_hf"


def output_folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(STUDY / "grids", out / "grids")
    shutil.copytree(STUDY / "runs", out / "runs")
    for run in (out / "runs").iterdir():  # what a real run folder also holds, never kept
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    return out


def test_the_kept_study_gives_back_the_committed_report(tmp_path, capsys):
    out, to = output_folder(tmp_path), tmp_path / "kept"
    assert main([str(out), "--grid", GRID, "--to", str(to), "--no-figures"]) == 0
    for name in ("table.md", "table.csv", "seeds.csv"):
        assert (to / name).read_bytes() == (STUDY / name).read_bytes(), name
    kept = {p.relative_to(to).as_posix() for p in (to / "runs").rglob("*") if p.is_file()}
    want = {p.relative_to(STUDY).as_posix() for p in (STUDY / "runs").rglob("*") if p.is_file()}
    assert kept == want and all(Path(k).name in LOGS for k in kept)


def test_a_run_started_from_a_warmed_up_model_keeps_the_warm_up_record(tmp_path):
    """vapo-warmup writes WARMUP.json beside the model; the kept run carries it, the model never."""
    out, to = output_folder(tmp_path), tmp_path / "kept"
    warm, other = sorted((out / "runs").iterdir())[:2]
    model = tmp_path / "models" / "warm-12"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / WARMUP).write_text(json.dumps({"settings": {"steps": 12}, "loss": [1.2, 0.09]}))
    card = json.loads((warm / "run_card.json").read_text())
    card["base_models"] = {"policy": {"model": str(model), "loaded_from": str(model)}}
    (warm / "run_card.json").write_text(json.dumps(card))
    card = json.loads((other / "run_card.json").read_text())  # loaded from a folder with no record
    card["base_models"] = {"policy": {"model": str(tmp_path), "loaded_from": str(tmp_path)}}
    (other / "run_card.json").write_text(json.dumps(card))
    assert main([str(out), "--grid", GRID, "--to", str(to), "--no-figures"]) == 0
    assert (to / "runs" / warm.name / WARMUP).read_bytes() == (model / WARMUP).read_bytes()
    assert not (to / "runs" / other.name / WARMUP).exists()
    assert not any(p.name == "model.safetensors" for p in to.rglob("*"))


def test_a_cell_that_has_not_finished_is_left_out_and_named(tmp_path, capsys):
    """A cell still running has a metrics.csv but no summary.json yet: a grid's finished cells are
    kept as they complete, never a run cut part-way."""
    out, to = output_folder(tmp_path), tmp_path / "kept"
    lost, running = sorted((out / "runs").iterdir())[:2]
    (lost / "metrics.csv").unlink()
    (lost / "summary.json").unlink()
    (running / "summary.json").unlink()
    assert main([str(out), "--grid", GRID, "--to", str(to), "--no-figures"]) == 0
    text = capsys.readouterr().out
    for run in (lost, running):
        assert f"{run} has not finished (no summary.json); left out" in text
        assert not (to / "runs" / run.name).exists()
    assert (to / "table.md").is_file() and "no log for seed(s)" in (to / "table.md").read_text()


def test_bad_input_writes_nothing(tmp_path, capsys):
    out, to = output_folder(tmp_path), tmp_path / "kept"
    assert main([str(out), "--grid", "nope", "--to", str(to)]) == 2
    assert (
        f"no grid manifest {out / 'grids' / 'nope.json'}; grids in {out}: {GRID}" in capsys.readouterr().err
    )
    assert not to.exists()
    to.mkdir()
    (to / "notes.md").write_text("kept")
    assert main([str(out), "--grid", GRID, "--to", str(to)]) == 2
    assert "exists; add --replace" in capsys.readouterr().err
    assert [p.name for p in to.iterdir()] == ["notes.md"]
    assert main([str(out), "--grid", GRID, "--to", str(to), "--replace", "--no-figures"]) == 0
    assert (to / "notes.md").read_text() == "kept" and (to / "table.md").is_file()
