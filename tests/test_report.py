"""vapo-report: the table equals an independent pandas recomputation from the CSV logs; paper row
order; Markdown/LaTeX/CSV and PNGs written; n=1 has no CI; W&B group and `wandb sync` for offline runs.

    .venv/bin/python -m pytest tests/test_report.py
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from vapo_lit.config import row_order
from vapo_lit.cli.ablate import main as ablate
from vapo_lit.cli.report import main as report
from vapo_lit.config import COMPONENTS
from vapo_lit.report.stats import summarize, t_ppf

T975 = {1: 12.706204736174707, 2: 4.302652729749464, 3: 3.182446305284263, 10: 2.228138851986274}
LAST_N = 2


def _flags(tmp, out, *extra):
    return ["--preset", "smoke", "--model", "random", "--threads", "1", "--cache_dir", str(tmp / "cache"),
            "--out", str(tmp / out), "--vapo.value_pretrain_steps", "1", "--last-n", str(LAST_N), *extra]


@pytest.fixture(scope="module")
def grid_out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    path = tmp / "mini.yaml"
    path.write_text(yaml.safe_dump({"name": "mini", "description": "three rows", "rows": [
        {"only": []}, {"drop": ["clip_higher"]}, {}]}))
    assert ablate(_flags(tmp, "out", "--grid", str(path), "--seeds", "2", "--wandb", "disabled", "--steps", "4",
                         "--eval_every", "2")) == 0
    return tmp / "out"


def recompute(out: Path) -> pd.DataFrame:
    """The table, from metrics.csv and config.yaml only, written independently of vapo_lit.report."""
    per = []
    for run in sorted((out / "runs").iterdir()):
        if not (run / "metrics.csv").is_file():
            continue
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        m = pd.read_csv(run / "metrics.csv")
        key = f"eval/avg@{cfg['eval_k']}"
        ev = m[key].dropna().to_numpy()
        ppo = m[m["train/value_pretraining"] == 0]
        rec = {"row": cfg["wandb_job_type"], "base": 100 * ev[0], "final": 100 * ev[-1], "peak": 100 * ev[1:].max()}
        for name, col in (("entropy", "policy/entropy"), ("response_length", "rollout/response_length"),
                          ("explained_variance", "value/explained_variance")):
            s = ppo[col].dropna().to_numpy()
            rec[f"{name}_final"], rec[f"{name}_last"] = (s[-1], s[-LAST_N:].mean()) if len(s) else (np.nan, np.nan)
        per.append(rec)
    per = pd.DataFrame(per)
    rows = []
    for row, g in per.groupby("row"):
        n = len(g)
        rec = {"row": row, "n": n, "base_mean": g["base"].mean()}
        for s in ("final", "peak"):
            mean, std = g[s].mean(), g[s].std(ddof=1)
            half = T975[n - 1] * std / math.sqrt(n)
            rec.update({f"{s}_mean": mean, f"{s}_std": std, f"{s}_ci_lo": mean - half, f"{s}_ci_hi": mean + half})
        for name in ("entropy", "response_length", "explained_variance"):
            for kind in ("final", "last"):
                rec[f"{name}_{kind}_mean"] = g[f"{name}_{kind}"].mean()
                rec[f"{name}_{kind}_std"] = g[f"{name}_{kind}"].std(ddof=1)
        rows.append(rec)
    t = pd.DataFrame(rows).set_index("row")
    for s in ("final", "peak"):
        t[f"delta_{s}"] = t[f"{s}_mean"] - t.loc["vapo", f"{s}_mean"]
    return t


def test_table_equals_independent_recomputation(grid_out):
    written = pd.read_csv(grid_out / "reports" / "mini" / "table.csv").set_index("row")
    expected = recompute(grid_out)
    assert list(written.index) == ["vapo", "vapo-no-clip_higher", "vanilla_ppo"]  # paper order
    assert set(expected.columns) <= set(written.columns)
    pd.testing.assert_frame_equal(written.loc[expected.index, expected.columns].astype(float), expected.astype(float),
                                  check_exact=False, rtol=1e-9, atol=1e-12)
    assert (written["n"] == 2).all()


def test_outputs_and_text(grid_out):
    folder = grid_out / "reports" / "mini"
    md = (folder / "table.md").read_text()
    lines = [x for x in md.splitlines() if x.startswith("| ")]
    assert [x.split(" | ")[0] for x in lines[1:]] == ["| VAPO (full)", "| w/o clip_higher", "| vanilla PPO"]
    assert "95% CI" in md and "Δ final" in md and "What these deltas do and do not support" in md
    assert "single-drop deltas are not independent effects" in md and "critic-free GRPO" in md
    assert "W&B" in md and "`mini`" in md
    tex = (folder / "table.tex").read_text()
    assert "\\toprule" in tex and "w/o clip\\_higher" in tex and "$\\pm$" in tex
    for name in ("score", "response_length", "entropy", "explained_variance"):
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    seeds = pd.read_csv(folder / "seeds.csv")
    assert len(seeds) == 6


def test_report_cli_rewrites_from_logs_only(grid_out, capsys):
    before = (grid_out / "reports" / "mini" / "table.csv").read_text()
    (grid_out / "reports" / "mini" / "table.csv").unlink()
    assert report([str(grid_out), "--grid", "mini", "--last-n", str(LAST_N)]) == 0
    assert (grid_out / "reports" / "mini" / "table.csv").read_text() == before
    assert "| VAPO (full) | 2 |" in capsys.readouterr().out
    # a plain folder of run folders (no grid manifest): rows come from the runs' configs
    assert report([str(grid_out / "runs"), "--last-n", str(LAST_N)]) == 0
    plain = pd.read_csv(grid_out / "runs" / "reports" / "runs" / "table.csv")
    assert list(plain["row"]) == ["vapo", "vapo-no-clip_higher", "vanilla_ppo"]
    assert report([str(grid_out), "--grid", "nope"]) == 2
    assert report([str(grid_out / "missing")]) == 2


def test_offline_wandb_group_sync_command_and_n1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert ablate(_flags(tmp_path, "out", "--drop", "positive_lm_loss", "--wandb", "offline", "--steps", "2")) == 0
    md = (tmp_path / "out" / "reports" / "drop-positive_lm_loss" / "table.md").read_text()
    assert "W&B group: `drop-positive_lm_loss`" in md
    assert "wandb sync " in md and "/wandb/offline-run-" in md
    sync = md.split("wandb sync ", 1)[1].split("\n")[0].split()
    assert len(sync) == 2 and all(Path(p).is_dir() for p in sync)
    assert "n=1, no CI" in md and "(n=1)" in md


def test_row_order_is_the_papers():
    labels = {"vanilla_ppo": [], "vapo": list(COMPONENTS)}
    for c in COMPONENTS:
        labels[f"vapo-no-{c}"] = [x for x in COMPONENTS if x != c]
    labels["vapo-no-decoupled_gae+clip_higher"] = [x for x in COMPONENTS if x not in ("decoupled_gae", "clip_higher")]
    labels["grpo+token_level_loss+clip_higher+group_sampling"] = ["token_level_loss", "clip_higher", "group_sampling"]
    est = {k: "grpo" if k.startswith("grpo") else "gae" for k in labels}
    got = sorted(labels, key=lambda k: row_order(labels[k], est[k], k))
    assert got == (["vapo"] + [f"vapo-no-{c}" for c in COMPONENTS] + ["vapo-no-decoupled_gae+clip_higher",
                   "vanilla_ppo", "grpo+token_level_loss+clip_higher+group_sampling"])


def test_t_quantiles_and_summary():
    for df, q in T975.items():
        assert t_ppf(0.975, df) == pytest.approx(q, abs=1e-8)
    s = summarize([1.0, 2.0, 4.0])
    assert s["n"] == 3 and s["mean"] == pytest.approx(7 / 3) and s["std"] == pytest.approx(np.std([1, 2, 4], ddof=1))
    assert s["ci_hi"] - s["mean"] == pytest.approx(T975[2] * s["std"] / math.sqrt(3))
    one = summarize([0.5, float("nan")])
    assert one["n"] == 1 and math.isnan(one["std"]) and math.isnan(one["ci_lo"])
