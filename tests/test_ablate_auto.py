"""`vapo-ablate --seeds auto`: the loop reads what the cells logged, hands the paired differences to
the report's `decide_seeds`, adds seeds until the rows are resolved or unreachable or the cap is
reached, and reuses finished cells.

    .venv/bin/python -m pytest tests/test_ablate_auto.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from report_synth import write_run
from vapo_lit.ablate import auto, runner
from vapo_lit.ablate.grid import grid_from_drop
from vapo_lit.cli.ablate import main as ablate
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.seed_stats import SeedDecision

ROW = "vapo-no-clip_higher"
D = [-4.0, 0.0, -2.0, -3.0, -1.0, -2.0, -2.0]  # per-seed row - reference (points); first 3: mean -2, sd 2


def _fake_run(ran: list):
    """Stands in for runner.run: 'trains' each cell without a summary.json by writing its logs."""

    def run(p, **kw):
        fresh = []
        for c in p.cells:
            if (c.run_dir / "summary.json").is_file():
                continue
            ref = 0.5 + 0.01 * c.seed
            final = ref + (D[c.seed] / 100 if c.row == ROW else 0.0)
            write_run(c.run_dir, c.row, c.seed, {0: 0.2, 2: (0.2 + final) / 2, 4: final}, steps=4)
            (c.run_dir / "summary.json").write_text("{}")
            fresh.append((c.row, c.seed))
        ran.append(fresh)
        return 0

    return run


def _plans(tmp_path, endpoint: str | None = "final"):
    base = merge(
        RunConfig(), {**PRESETS["smoke"], "eval_k": 4, "out_dir": str(tmp_path), "wandb": "disabled"}
    )
    grid = grid_from_drop(["clip_higher"])
    grid.endpoint = endpoint
    return lambda n: runner.plan(grid, base, range(n), tmp_path / "out")


def test_adds_seeds_until_resolved_and_reuses_finished_cells(tmp_path, monkeypatch):
    ran, logs = [], []
    monkeypatch.setattr(runner, "run", _fake_run(ran))
    code = auto.run_auto(_plans(tmp_path), rows=[ROW], min_seeds=3, max_seeds=10, log=logs.append)
    assert code == 0
    # round 1: 3 seeds, mean -2 sd 2 -> 7 pairs needed; round 2 runs only the 4 new seeds; resolved at 7
    assert [sorted({s for _, s in r}) for r in ran] == [[0, 1, 2], [3, 4, 5, 6]]
    assert "needs 7 pairs" in logs[0] and "next: 7 seeds" in logs[0]
    assert "stop" in logs[1] and f"{ROW}: resolved" in logs[1]


def test_stops_when_unreachable_within_the_cap(tmp_path, monkeypatch):
    ran, logs = [], []
    monkeypatch.setattr(runner, "run", _fake_run(ran))
    auto.run_auto(_plans(tmp_path), rows=[ROW], min_seeds=3, max_seeds=5, log=logs.append)
    assert len(ran) == 1 and f"{ROW}: unreachable" in logs[-1]


@pytest.mark.parametrize("endpoint,share", [("final", 1.0), (None, 0.75)])
def test_logged_scores_match_the_report(tmp_path, monkeypatch, endpoint, share):
    """The 'final' score is the grid's endpoint: the last eval, or by default the mean of the last 3
    (here the two trained evals, whose deltas are D/2 and D: 0.75 D on average)."""
    monkeypatch.setattr(runner, "run", _fake_run([]))
    p = _plans(tmp_path, endpoint)(3)
    runner.run(p)
    assert auto.paired_diffs(p, [ROW], "final")[ROW] == pytest.approx(
        [share * d / 100 for d in D[:3]], abs=1e-12
    )
    from vapo_lit.report import write_report

    runner.write_manifest(p)
    write_report(p.out, grid_id=p.grid.grid_id, figures=False)
    table = pd.read_csv(p.out / "reports" / p.grid.grid_id / "table.csv").set_index("row")
    for m in ("final", "peak", "auc"):
        diffs = auto.paired_diffs(p, [ROW], m)[ROW]
        assert abs(100 * sum(diffs) / len(diffs) - table.loc[ROW, f"delta_{m}"]) < 1e-9


def test_real_grid_auto_reuses_cells_and_validates_flags(tmp_path, monkeypatch, capsys):
    """Real runs (smoke preset, random model): a scripted decision asks for one more seed; the
    first two seeds' cells are not run again; the report has n = 3. Bad flags: exit 2 before compute."""
    calls = []

    def scripted(diffs, seeds, max_seeds, level=0.95):
        calls.append((seeds, {r: list(v) for r, v in diffs.items()}))
        return SeedDecision(3 if seeds == 2 else None, {r: "scripted" for r in diffs}, "scripted")

    monkeypatch.setattr(auto, "decide_seeds", scripted)
    flags = [
        "--preset",
        "smoke",
        "--model",
        "random",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--vapo.value_pretrain_steps",
        "1",
        "--steps",
        "2",
        "--wandb",
        "disabled",
        "--drop",
        "clip_higher",
    ]
    assert ablate(flags + ["--seeds", "auto", "--min-seeds", "2", "--max-seeds", "3"]) == 0
    assert [s for s, _ in calls] == [2, 3]
    assert [len(d[ROW]) for _, d in calls] == [2, 3]  # paired differences read from the logs
    runs = tmp_path / "out" / "runs"
    for d in runs.iterdir():
        events = [json.loads(x) for x in (d / "attempts.jsonl").read_text().splitlines()]
        starts = [e for e in events if e["event"] == "start"]
        assert len(starts) == 1 and starts[0]["mode"] == "fresh", d.name  # each cell ran once
    assert len(list(runs.iterdir())) == 6
    table = pd.read_csv(tmp_path / "out" / "reports" / "drop-clip_higher" / "table.csv")
    assert list(table["n"]) == [3, 3]
    capsys.readouterr()
    for bad, say in (
        (["--seeds", "auto", "--rows", "vanilla_ppo"], "--rows vanilla_ppo"),
        (["--seeds", "auto", "--min-seeds", "4", "--max-seeds", "3"], "--min-seeds"),
        (["--seeds", "2", "--rows", ROW], "--rows is a --seeds auto flag"),
    ):
        assert ablate(flags + bad) == 2
        assert say in capsys.readouterr().err
    assert Path(tmp_path / "out").is_dir() and len(list(runs.iterdir())) == 6  # nothing new was run
