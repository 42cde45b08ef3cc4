"""vapo-report: the table equals an independent recomputation from the logs (real runs and a
synthetic grid whose every number is known); paired deltas, Holm, seeds needed, sample efficiency,
compute-matched scores; row order and labels from the grid manifest; byte-identical regeneration;
bad logs refused with the file and line; truncated runs flagged; W&B section from the run cards.

    .venv/bin/python -m pytest tests/test_report.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from report_synth import write_manifest, write_run
from vapo_lit.cli.ablate import main as ablate
from vapo_lit.cli.report import main as report
from vapo_lit.config import COMPONENTS
from vapo_lit.labels import row_order
from vapo_lit import seed_stats as stats
from vapo_lit.report.figures import NAMES as FIGURES

T975 = {1: 12.706204736174694, 2: 4.302652729749462, 3: 3.1824463052837078, 4: 2.7764451051977934}
LAST_N = 2
TEXT_FILES = ("table.md", "table.tex", "table.csv", "seeds.csv", "calibration.csv")


def _flags(tmp, out, *extra):
    return [
        "--seeds",
        "1",
        "--preset",
        "smoke",
        "--model",
        "random",
        "--threads",
        "1",
        "--cache_dir",
        str(tmp / "cache"),
        "--out",
        str(tmp / out),
        "--vapo.value_pretrain_steps",
        "1",
        "--last-n",
        str(LAST_N),
        *extra,
    ]


# ============================================================================ real runs
@pytest.fixture(scope="module")
def grid_out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    path = tmp / "mini.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "mini",
                "description": "three rows",
                "rows": [{"only": []}, {"drop": ["clip_higher"]}, {}],
            }
        )
    )
    assert (
        ablate(
            _flags(
                tmp,
                "out",
                "--grid",
                str(path),
                "--seeds",
                "2",
                "--wandb",
                "disabled",
                "--steps",
                "4",
                "--eval_every",
                "2",
            )
        )
        == 0
    )
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
        # the grid's endpoint (the default: the mean of the last 3 evals after training started)
        rec = {
            "row": cfg["wandb_job_type"],
            "seed": cfg["seed"],
            "base": 100 * ev[0],
            "final": 100 * ev[1:][-3:].mean(),
            "peak": 100 * ev[1:].max(),
        }
        for name, col in (
            ("entropy", "policy/entropy"),
            ("response_length", "rollout/response_length"),
            ("ev_mc", "value/explained_variance"),
        ):
            s = ppo[col].dropna().to_numpy()
            last = (np.median(s[-LAST_N:]) if name == "ev_mc" else s[-LAST_N:].mean()) if len(s) else np.nan
            rec[f"{name}_final"], rec[f"{name}_last"] = (s[-1] if len(s) else np.nan), last
        per.append(rec)
    per = pd.DataFrame(per)
    rows = []
    for row, g in per.groupby("row"):
        n = len(g)
        rec = {"row": row, "n": n, "base_mean": g["base"].mean()}
        for s in ("final", "peak"):
            mean, std = g[s].mean(), g[s].std(ddof=1)
            half = T975[n - 1] * std / math.sqrt(n)
            rec.update(
                {f"{s}_mean": mean, f"{s}_std": std, f"{s}_ci_lo": mean - half, f"{s}_ci_hi": mean + half}
            )
        for name in ("entropy", "response_length", "ev_mc"):
            for kind in ("final", "last"):
                rec[f"{name}_{kind}_mean"] = g[f"{name}_{kind}"].mean()
                rec[f"{name}_{kind}_std"] = g[f"{name}_{kind}"].std(ddof=1)
        rows.append(rec)
    t = pd.DataFrame(rows).set_index("row")
    ref = per[per["row"] == "vapo"].set_index("seed")
    for row in t.index:
        if row == "vapo":
            continue
        for s in ("final", "peak"):
            d = per[per["row"] == row].set_index("seed")[s] - ref[s]
            t.loc[row, f"delta_{s}"] = d.mean()
    return t


def test_table_equals_independent_recomputation(grid_out):
    written = pd.read_csv(grid_out / "reports" / "mini" / "table.csv").set_index("row")
    expected = recompute(grid_out)
    assert list(written.index) == ["vapo", "vapo-no-clip_higher", "vanilla_ppo"]  # the manifest's order
    assert set(expected.columns) <= set(written.columns)
    cols = [c for c in expected.columns if not c.startswith("delta_")]
    pd.testing.assert_frame_equal(
        written.loc[expected.index, cols].astype(float),
        expected[cols].astype(float),
        check_exact=False,
        rtol=1e-9,
        atol=1e-12,
    )
    for row in ("vapo-no-clip_higher", "vanilla_ppo"):
        for s in ("final", "peak"):
            assert written.loc[row, f"delta_{s}"] == pytest.approx(expected.loc[row, f"delta_{s}"], abs=1e-9)
    assert (written["n"] == 2).all()


def test_outputs_and_text(grid_out):
    folder = grid_out / "reports" / "mini"
    md = (folder / "table.md").read_text()
    lines = [x for x in md.splitlines() if x.startswith("| ")]
    assert [x.split(" | ")[0] for x in lines[1:4]] == ["| VAPO (full)", "| w/o clip_higher", "| vanilla PPO"]
    for needle in (
        "Δ last-3 (paired, 95% CI)",
        "Endpoint: **the mean of the last 3 evals** after training started "
        "(`mean-last-3`; fixed in the grid's manifest before it ran)",
        "Tuning seeds: none declared",
        "Holm p",
        "Seeds needed",
        "## Compute-matched comparison",
        "## Diagnostics",
        "## Paired deltas against VAPO (full)",
        "EV vs MC",
        "EV vs targets",
        "What these deltas do and do not support",
        "single-drop deltas are not independent effects",
        "critic-free GRPO",
        "W&B",
        "`mini`",
        "strict final",
        "AUC",
    ):
        assert needle in md, needle
    assert (
        str(grid_out) not in md and str(grid_out) not in (folder / "seeds.csv").read_text()
    )  # no absolute paths
    tex = (folder / "table.tex").read_text()
    assert "\\toprule" in tex and "w/o clip\\_higher" in tex and "$\\pm$" in tex and "% diagnostics" in tex
    for name in FIGURES:
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    seeds = pd.read_csv(folder / "seeds.csv")
    assert len(seeds) == 6 and all((folder / r / "metrics.csv").is_file() for r in seeds["run"])


def test_report_cli_rewrites_from_logs_only(grid_out, capsys):
    before = (grid_out / "reports" / "mini" / "table.csv").read_text()
    (grid_out / "reports" / "mini" / "table.csv").unlink()
    assert report([str(grid_out), "--grid", "mini", "--last-n", str(LAST_N), "--no-figures"]) == 0
    assert (grid_out / "reports" / "mini" / "table.csv").read_text() == before
    assert "| VAPO (full) | 2 |" in capsys.readouterr().out
    # a plain folder of run folders (no grid manifest): rows labelled and ordered from the runs' configs
    assert report([str(grid_out / "runs"), "--last-n", str(LAST_N), "--no-figures"]) == 0
    plain = pd.read_csv(grid_out / "runs" / "reports" / "runs" / "table.csv")
    assert list(plain["row"]) == ["vapo", "vapo-no-clip_higher", "vanilla_ppo"]
    assert report([str(grid_out), "--grid", "nope"]) == 2
    assert report([str(grid_out / "missing")]) == 2
    assert report([str(grid_out), "--grid", "mini", "--reference", "nope"]) == 2
    assert "no such row" in capsys.readouterr().err


def test_real_grid_regenerates_byte_for_byte_elsewhere(grid_out, tmp_path, monkeypatch):
    """Issue 12: a copied grid (runs, manifest, attempts; no checkpoints needed) regenerates the
    same bytes, wherever it lies and whichever folder the command runs from."""
    first = grid_out / "reports" / "mini"
    assert report([str(grid_out), "--grid", "mini", "--last-n", str(LAST_N), "--no-figures"]) == 0
    want = {f: (first / f).read_bytes() for f in TEXT_FILES}
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(grid_out, copy, ignore=shutil.ignore_patterns("checkpoints", "reports", "*.db", "wandb"))
    monkeypatch.chdir(tmp_path)
    assert (
        report([os.path.relpath(copy, tmp_path), "--grid", "mini", "--last-n", str(LAST_N), "--no-figures"])
        == 0
    )
    for f in TEXT_FILES:
        assert (copy / "reports" / "mini" / f).read_bytes() == want[f], f


def test_offline_wandb_group_sync_command_and_n1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert (
        ablate(_flags(tmp_path, "out", "--drop", "positive_lm_loss", "--wandb", "offline", "--steps", "2"))
        == 0
    )
    folder = tmp_path / "out" / "reports" / "drop-positive_lm_loss"
    md = (folder / "table.md").read_text()
    assert "W&B group: `drop-positive_lm_loss`" in md
    assert "wandb sync " in md and "/wandb/offline-run-*" in md
    sync = md.split("wandb sync ", 1)[1].split("\n")[0].split()
    assert len(sync) == 2 and all(
        len(list(folder.glob(p))) == 1 and next(folder.glob(p)).is_dir() for p in sync
    )
    assert "(n=1)" in md and "(1 pair, no CI)" in md and "needs 2 paired seeds" in md


def test_row_order_is_the_papers():
    labels = {"vanilla_ppo": [], "vapo": list(COMPONENTS)}
    for c in COMPONENTS:
        labels[f"vapo-no-{c}"] = [x for x in COMPONENTS if x != c]
    labels["vapo-no-decoupled_gae+clip_higher"] = [
        x for x in COMPONENTS if x not in ("decoupled_gae", "clip_higher")
    ]
    labels["grpo+token_level_loss+clip_higher+group_sampling"] = [
        "token_level_loss",
        "clip_higher",
        "group_sampling",
    ]
    est = {k: "grpo" if k.startswith("grpo") else "gae" for k in labels}
    got = sorted(labels, key=lambda k: row_order(labels[k], est[k], k))
    assert got == (
        ["vapo"]
        + [f"vapo-no-{c}" for c in COMPONENTS]
        + [
            "vapo-no-decoupled_gae+clip_higher",
            "vanilla_ppo",
            "grpo+token_level_loss+clip_higher+group_sampling",
        ]
    )


# ============================================================================ a synthetic grid
ROWS = ["vapo", "vapo-no-value_pretraining", "vanilla_ppo"]
RATE = {"vapo": 0.07, "vapo-no-value_pretraining": 0.06, "vanilla_ppo": 0.04}  # score gained per PPO update
SEED_EFFECT = [0.0, 0.08, -0.06]  # shared by every row of a seed
OWN = {"vapo": [0, 0, 0], "vapo-no-value_pretraining": [0.0, 0.01, -0.004], "vanilla_ppo": [0.01, -0.02, 0.0]}
SECONDS = {"vapo": 2.0, "vapo-no-value_pretraining": 1.5, "vanilla_ppo": 1.0}
PRETRAIN = {"vapo": 2, "vapo-no-value_pretraining": 0, "vanilla_ppo": 0}
STEPS, EVERY = 10, 2
EV = [0.2, float("nan"), -23.0, 0.4, 0.5]


def evals_of(row, seed) -> dict:
    return {
        u: (0.2 if u == 0 else 0.2 + RATE[row] * u + SEED_EFFECT[seed] + OWN[row][seed])
        for u in range(0, STEPS + 1, EVERY)
    }


def make_synthetic(out: Path, manifest: bool = True) -> Path:
    cells = []
    for row in ROWS:
        for seed in range(3):
            d = write_run(
                out / "runs" / f"{row}-s{seed}",
                row,
                seed,
                evals_of(row, seed),
                steps=STEPS,
                pretrain=PRETRAIN[row],
                seconds_per_iter=SECONDS[row],
                cumulative=(row, seed) == ("vapo", 0),
                ev=EV,
                ev_target=[0.9],
                memory=100.0 * (1 + ROWS.index(row)),
                bias={
                    "first": 0.4 if row == "vanilla_ppo" else 0.1,
                    "1-7": 0.2,
                    "8-31": 0.1,
                    "32-127": 0.0,
                    "ge128": -0.1,
                },
                attempts=("failed", "done") if (row, seed) == ("vanilla_ppo", 1) else ("done",),
            )
            cells.append((row, seed, d))
    if manifest:
        write_manifest(out, "syn", ROWS, cells)
    return out


@pytest.fixture()
def syn(tmp_path):
    out = make_synthetic(tmp_path / "syn")
    assert report([str(out), "--grid", "syn", "--last-n", "3", "--no-figures"]) == 0
    folder = out / "reports" / "syn"
    return out, folder, pd.read_csv(folder / "table.csv").set_index("row"), pd.read_csv(folder / "seeds.csv")


def _per_seed(row, metric) -> np.ndarray:
    """The per-run numbers, from the generating values (points)."""
    out = []
    for seed in range(3):
        ev = evals_of(row, seed)
        trained = [100 * ev[u] for u in sorted(ev) if u > 0]
        ups = sorted(ev)
        if metric == "final":
            out.append(trained[-1])
        elif metric == "peak":
            out.append(max(trained))
        elif metric == "auc":
            ys = [100 * ev[u] for u in ups]
            out.append(
                sum((b - a) * (ya + yb) / 2 for a, b, ya, yb in zip(ups, ups[1:], ys, ys[1:]))
                / (ups[-1] - ups[0])
            )
    return np.array(out)


def test_synthetic_paired_deltas_holm_and_seeds_needed(syn):
    _, folder, table, _ = syn
    assert list(table.index) == ROWS
    ps = []
    for row in ROWS[1:]:
        for metric in ("final", "peak", "auc"):
            d = _per_seed(row, metric) - _per_seed("vapo", metric)
            mean, sd = d.mean(), d.std(ddof=1)
            half = T975[2] * sd / math.sqrt(3)
            assert table.loc[row, f"delta_{metric}"] == pytest.approx(mean, abs=1e-8)
            assert table.loc[row, f"delta_{metric}_ci_lo"] == pytest.approx(mean - half, abs=1e-7)
            assert table.loc[row, f"delta_{metric}_ci_hi"] == pytest.approx(mean + half, abs=1e-7)
            assert table.loc[row, f"delta_{metric}_pairs"] == 3
            if metric == "final":
                ps.append(table.loc[row, "delta_final_p"])
                assert table.loc[row, "delta_final_p"] == pytest.approx(
                    stats.t_sf2(mean / (sd / math.sqrt(3)), 2), rel=1e-6
                )
                need = stats.seeds_needed(mean, sd, cap=20)
                got = table.loc[row, "seeds_needed_final"]
                assert (math.isnan(got) and need is None) or got == need
    assert list(table.loc[ROWS[1:], "delta_final_p_holm"]) == pytest.approx(stats.holm(ps), rel=1e-6)
    # the shared seed effect (+-5 points) hides a 10-point delta from the unpaired comparison
    row = "vapo-no-value_pretraining"
    assert table.loc[row, "delta_final_ci_hi"] < 0
    assert table.loc[row, "delta_final_unpaired_ci_lo"] < 0 < table.loc[row, "delta_final_unpaired_ci_hi"]
    md = (folder / "table.md").read_text()
    assert (
        "Multiple comparisons (Δ final, Holm over the 2 rows" in md and "survive: w/o value_pretraining" in md
    )


def test_synthetic_sample_efficiency_strict_and_compute_matched(syn):
    _, folder, table, seeds = syn
    peak_ref = _per_seed("vapo", "peak").mean()
    threshold = math.floor(0.9 * peak_ref)
    md = (folder / "table.md").read_text()
    assert f"updates to {threshold:g} |" in md
    token_budget = STEPS * 80.0  # vanilla: 10 iterations x 80 tokens, no pretraining
    time_budget = 0.5 + STEPS * SECONDS["vanilla_ppo"]
    for r in seeds.to_dict("records"):
        ev = evals_of(r["row"], r["seed"])
        hit = [u for u in sorted(ev) if 100 * ev[u] >= threshold]
        assert (math.isnan(r["updates_to_threshold"]) and not hit) or r["updates_to_threshold"] == hit[0]
        assert r["strict_final"] == pytest.approx(100 * (ev[STEPS] - 0.05))
        tok = [u for u in sorted(ev) if (PRETRAIN[r["row"]] + u) * 80.0 <= token_budget]
        assert r["score_at_tokens"] == pytest.approx(100 * ev[tok[-1]])
        sec = [
            u for u in sorted(ev) if 0.5 + (PRETRAIN[r["row"]] + u) * SECONDS[r["row"]] <= time_budget + 1e-9
        ]
        assert r["score_at_seconds"] == pytest.approx(100 * ev[sec[-1]])
        assert r["cost_source"] == ("logged" if (r["row"], r["seed"]) == ("vapo", 0) else "reconstructed")
        assert r["peak_memory_mb"] == 100.0 * (1 + ROWS.index(r["row"])) + PRETRAIN[r["row"]] + STEPS
    assert table.loc["vapo", "updates_to_threshold_reached"] == 3
    assert (
        "1 run(s)" in md and "8 run(s) logged before the cumulative columns" in md
    )  # which cost source was used
    assert "800 tokens" in md and "10.5 s" in md


def test_strict_peak_is_the_best_strict_eval_of_the_trained_policy(tmp_path):
    """strict_peak: the highest strict-format eval after a PPO update, in points. Not the last one
    (strict_final), not the lenient peak, not the base policy's (here above every trained eval)."""
    out = tmp_path / "peaks"
    curves = [{0: 0.9, 2: 0.3, 4: 0.7, 6: 0.5}, {0: 0.8, 2: 0.6, 4: 0.4, 6: 0.3}]  # peaks mid-run
    cells = [
        (
            "vapo",
            seed,
            write_run(out / "runs" / f"vapo-s{seed}", "vapo", seed, ev, steps=6, strict_offset=0.05),
        )
        for seed, ev in enumerate(curves)
    ]
    write_manifest(out, "peaks", ["vapo"], cells)
    assert report([str(out), "--grid", "peaks", "--no-figures"]) == 0
    folder = out / "reports" / "peaks"
    seeds = pd.read_csv(folder / "seeds.csv").set_index("seed")
    assert seeds["strict_peak"].tolist() == pytest.approx([65.0, 55.0])  # 100 * (peak - 0.05)
    assert seeds["strict_final"].tolist() == pytest.approx([45.0, 25.0])  # the last strict eval
    assert seeds["peak"].tolist() == pytest.approx([70.0, 60.0])  # the lenient one
    table = pd.read_csv(folder / "table.csv").set_index("row")
    assert table.loc["vapo", "strict_peak_mean"] == pytest.approx(60.0)
    assert table.loc["vapo", "strict_peak_std"] == pytest.approx(math.sqrt(50.0))


def test_identical_nonzero_paired_differences_show_no_p_value_and_say_why(tmp_path):
    """A row whose Δ peak is the same nonzero number in every seed (one eval sample of 128 more,
    as a quantised score gives it): its p is undefined, so table.csv holds NaN, the Holm p cell
    reads "n/a ‡" (not "<0.001") and a footnote gives the reason; a row identical to the reference
    (every difference 0) keeps p = 1; a column with spread keeps its p."""
    out = tmp_path / "flat"
    q = 1 / 128  # the eval's quantum: one sample of 128
    evals = {
        "vapo": lambda s: {0: 16 * q, 2: (70 + s) * q, 4: (60 + 3 * s) * q},
        "vapo-no-group_sampling": lambda s: {0: 16 * q, 2: (71 + s) * q, 4: (62 + s * s) * q},
        "vapo-no-clip_higher": lambda s: {0: 16 * q, 2: (70 + s) * q, 4: (60 + 3 * s) * q},
    }
    cells = [
        (row, seed, write_run(out / "runs" / f"{row}-s{seed}", row, seed, make(seed), steps=4))
        for row, make in evals.items()
        for seed in range(3)
    ]
    write_manifest(out, "flat", list(evals), cells)
    assert report([str(out), "--grid", "flat", "--no-figures"]) == 0
    folder = out / "reports" / "flat"
    table = pd.read_csv(folder / "table.csv").set_index("row")
    flat, same = table.loc["vapo-no-group_sampling"], table.loc["vapo-no-clip_higher"]
    assert flat["delta_peak"] == flat["delta_peak_ci_lo"] == flat["delta_peak_ci_hi"] == 100 * q
    assert math.isnan(flat["delta_peak_p"]) and math.isnan(flat["delta_peak_p_holm"])
    assert (
        0 < flat["delta_final_p"] < 1 and flat["delta_final_ci_lo"] < flat["delta_final_ci_hi"]
    )  # spread: a p
    assert same["delta_peak"] == 0.0 and same["delta_peak_p"] == 1.0
    md = (folder / "table.md").read_text()
    paired = md[md.index("## Paired deltas") :]
    line = next(x for x in paired.splitlines() if x.startswith("| w/o group_sampling |")).split(" | ")
    assert line[4:6] == ["+0.8 [+0.8, +0.8]", "n/a ‡"], line
    line = next(x for x in paired.splitlines() if x.startswith("| w/o clip_higher |")).split(" | ")
    assert line[4:6] == ["+0.0 [+0.0, +0.0]", "1.000"], line
    assert "<0.001" not in md
    assert md.count("‡ n/a: zero spread: every seed's difference is the same") == 1
    assert (
        "paired t statistic (the mean over its standard error, here 0) is undefined and no p-value" in paired
    )
    assert "w/o group_sampling (Δ peak +0.8 in all 3 pairs)." in paired
    assert "n/a $^\\ddagger$" in (folder / "table.tex").read_text()
    from vapo_lit.report.render import Context, holm_note

    ctx = Context(
        k=4, last_n=10, threshold=50.0, reference="vapo", token_budget=1.0, time_budget=1.0, max_seeds=20
    )
    assert holm_note(table.reset_index(), ctx, "peak", "Δ peak") == (
        "Multiple comparisons (Δ peak, Holm over the 1 rows compared with VAPO (full), family-wise 5%): survive: none; "
        "do not: w/o clip_higher (p=1.000); no p-value (zero spread, ‡): w/o group_sampling."
    )


def test_synthetic_diagnostics_nan_robust_crashes_and_calibration(syn):
    _, folder, table, seeds = syn
    # EV over the last 3 PPO rows (updates 8, 9, 10 -> EV[2], EV[3], EV[4] = -23, 0.4, 0.5): median 0.4
    assert (seeds["ev_mc_last"] == 0.4).all() and (seeds["ev_mc_final"] == 0.5).all()
    assert (seeds["ev_target_final"] == 0.9).all()
    assert table.loc["vanilla_ppo", "crashes"] == 1 and table.loc["vanilla_ppo", "attempts"] == 4
    assert table.loc["vapo", "crashes"] == 0
    cal = pd.read_csv(folder / "calibration.csv")
    early = cal[(cal["phase"] == "early") & (cal["bucket"] == "first")].set_index("row")["bias_mean"]
    # bias / update, mean over PPO updates 1..5 = b * mean(1, 1/2, ..., 1/5)
    h5 = sum(1 / u for u in range(1, 6)) / 5
    assert early["vanilla_ppo"] == pytest.approx(0.4 * h5) and early["vapo"] == pytest.approx(0.1 * h5)
    assert set(cal[cal["row"] == "vapo"]["value_pretraining"]) == {1}
    out, _, _, _ = syn
    assert (
        report([str(out), "--grid", "syn", "--last-n", "3"]) == 0
    )  # figures from logs with NaN, -23, every column
    for name in FIGURES:
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_synthetic_regenerates_byte_for_byte(syn, tmp_path, monkeypatch):
    out, folder, _, _ = syn
    want = {f: (folder / f).read_bytes() for f in TEXT_FILES}
    assert report([str(out), "--grid", "syn", "--last-n", "3", "--no-figures"]) == 0  # in place, again
    assert {f: (folder / f).read_bytes() for f in TEXT_FILES} == want
    copy = tmp_path / "a" / "b" / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("reports"))
    monkeypatch.chdir(copy / "runs")
    assert report(["..", "--grid", "syn", "--last-n", "3", "--no-figures"]) == 0
    for f in TEXT_FILES:
        assert (copy / "reports" / "syn" / f).read_bytes() == want[f], f
    # --to: a report folder of one's own; run folders are written relative to it
    assert (
        report([str(copy), "--grid", "syn", "--last-n", "3", "--to", str(copy / "mine"), "--no-figures"]) == 0
    )
    assert (copy / "mine" / "table.csv").read_bytes() == want["table.csv"]
    assert pd.read_csv(copy / "mine" / "seeds.csv")["run"].str.startswith("../runs/").all()


def test_a_new_column_is_one_tracked_metric_and_one_spec_line(tmp_path, monkeypatch):
    """docs/guides/extending.md's "Adding a report column": TRACKED gets the metric, DIAGNOSTICS the column."""
    from vapo_lit.report import collect, render

    monkeypatch.setitem(collect.TRACKED, "prompts", "rollout/prompts")
    monkeypatch.setitem(
        render.TABLES,
        "diagnostics",
        [*render.DIAGNOSTICS, ("prompts (final / last {n})", lambda r, c: render.pair_of(r, "prompts", 1))],
    )
    out = make_synthetic(tmp_path / "syn")
    assert report([str(out), "--grid", "syn", "--last-n", "3", "--no-figures"]) == 0
    folder = out / "reports" / "syn"
    table = pd.read_csv(folder / "table.csv").set_index("row")
    assert (table["prompts_final_mean"] == 4).all() and (table["prompts_last_mean"] == 4).all()
    md = (folder / "table.md").read_text()
    diag = md[md.index("## Diagnostics") :]
    diag = (
        diag[: diag.find("\n## ")] if "\n## " in diag else diag
    )  # the section alone: later ones have tables too
    head = next(line for line in diag.splitlines() if line.startswith("| row"))
    assert head.endswith("| attempts / crashes | prompts (final / last 3) |")
    lines = [line for line in diag.splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert len(lines) == len(ROWS) and all(line.endswith("| 4.0 / 4.0 |") for line in lines)
    assert "prompts (final / last 3)" in (folder / "table.tex").read_text()


def test_manifest_sets_order_and_labels_without_it_configs_do(tmp_path):
    out = make_synthetic(tmp_path / "o", manifest=False)
    cells = [(r, s, out / "runs" / f"{r}-s{s}") for r in ROWS for s in range(3)]
    write_manifest(out, "mine", ["vanilla_ppo", "vapo", "vapo-no-value_pretraining"], cells)
    assert report([str(out), "--grid", "mine", "--no-figures"]) == 0
    assert list(pd.read_csv(out / "reports" / "mine" / "table.csv")["row"]) == [
        "vanilla_ppo",
        "vapo",
        "vapo-no-value_pretraining",
    ]
    shutil.rmtree(out / "grids")
    assert report([str(out), "--no-figures"]) == 0  # no manifest: labels.run_label and labels.row_order
    assert list(pd.read_csv(out / "reports" / "runs" / "table.csv")["row"]) == ROWS


def test_missing_cell_unpaired_seed_and_reference_flag(tmp_path):
    out = make_synthetic(tmp_path / "o", manifest=False)
    cells = [(r, s, out / "runs" / f"{r}-s{s}") for r in ROWS for s in range(3)]
    gone = out / "runs" / "vanilla_ppo-s2"
    (gone / "metrics.csv").unlink()  # a failed cell: attempts, no log
    (gone / "attempts.jsonl").write_text(
        "".join('{"event": "start"}\n{"event": "end", "outcome": "failed"}\n' for _ in range(3))
    )
    write_manifest(out, "g", ROWS, cells)
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    t = pd.read_csv(out / "reports" / "g" / "table.csv", dtype={"unpaired_seeds_final": str}).set_index("row")
    assert t.loc["vanilla_ppo", "n"] == 2 and t.loc["vanilla_ppo", "missing_cells"] == 1
    assert (
        t.loc["vanilla_ppo", "delta_final_pairs"] == 2 and t.loc["vanilla_ppo", "unpaired_seeds_final"] == "2"
    )
    assert t.loc["vanilla_ppo", "crashes"] == 4
    md = (out / "reports" / "g" / "table.md").read_text()
    assert "vanilla PPO: no log for seed(s) 2 (missing or failed cells); seed(s) 2 unpaired" in md
    assert report([str(out), "--grid", "g", "--reference", "vanilla_ppo", "--no-figures"]) == 0
    t = pd.read_csv(out / "reports" / "g" / "table.csv").set_index("row")
    assert math.isnan(t.loc["vanilla_ppo", "delta_final"]) and t.loc["vapo", "delta_final_pairs"] == 2
    for seed in (0, 1):  # now every vanilla cell failed: named, not tabled
        (out / "runs" / f"vanilla_ppo-s{seed}" / "metrics.csv").unlink()
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    assert list(pd.read_csv(out / "reports" / "g" / "table.csv")["row"]) == ROWS[:2]
    md = (out / "reports" / "g" / "table.md").read_text()
    assert (
        "Rows without any run log, left out of the tables: vanilla PPO (seed(s) 0 1 2; 4 crashed attempt(s))"
        in md
    )


def test_a_grids_declared_reference_row(tmp_path):
    """A manifest's `reference` (a grid file's `reference:` key) is the row the deltas are taken
    against when --reference is not given; --reference overrides it; a declared row without logs
    gives no deltas rather than an error."""
    out = make_synthetic(tmp_path / "o", manifest=False)
    cells = [(r, s, out / "runs" / f"{r}-s{s}") for r in ROWS for s in range(3)]
    path = write_manifest(out, "g", ROWS, cells)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "reference": "vanilla_ppo"}))
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    t = pd.read_csv(out / "reports" / "g" / "table.csv").set_index("row")
    assert math.isnan(t.loc["vanilla_ppo", "delta_final"]) and t.loc["vapo", "delta_final_pairs"] == 3
    by_hand = t.loc["vapo", "final_mean"] - t.loc["vanilla_ppo", "final_mean"]
    assert t.loc["vapo", "delta_final"] == pytest.approx(by_hand, abs=1e-6)  # table.csv keeps 8 decimals
    assert report([str(out), "--grid", "g", "--reference", "vapo", "--no-figures"]) == 0
    t = pd.read_csv(out / "reports" / "g" / "table.csv").set_index("row")
    assert math.isnan(t.loc["vapo", "delta_final"]) and not math.isnan(t.loc["vanilla_ppo", "delta_final"])
    for seed in range(3):
        (out / "runs" / f"vanilla_ppo-s{seed}" / "metrics.csv").unlink()
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    t = pd.read_csv(out / "reports" / "g" / "table.csv").set_index("row")
    assert t["delta_final"].isna().all()


def test_every_grid_is_checked_before_any_report_is_written(tmp_path, capsys):
    """Several grids without --grid: a --reference that one grid lacks is a one-line error, and no
    grid's report is written, not even the grids listed before it."""
    out = make_synthetic(tmp_path / "o", manifest=False)
    cells = [(r, s, out / "runs" / f"{r}-s{s}") for r in ROWS for s in range(3)]
    write_manifest(out, "a", ROWS, cells)  # has vanilla_ppo
    write_manifest(out, "b", ROWS[:2], [c for c in cells if c[0] in ROWS[:2]])  # does not
    err = _one_line_error(capsys, [str(out), "--reference", "vanilla_ppo", "--no-figures"])
    assert "--reference 'vanilla_ppo': no such row" in err
    assert not (out / "reports").exists()
    assert report([str(out), "--reference", "vapo", "--no-figures"]) == 0  # valid in both: both written
    assert sorted(p.name for p in (out / "reports").iterdir()) == ["a", "b"]


def test_contrasts_from_the_manifest_and_the_flag(tmp_path, capsys):
    """Further contrasts (a grid's `contrasts:` in its manifest, and --contrast ROW:AGAINST) are paired
    by seed like the table's deltas, checked here against float64 numpy on seeds.csv; Holm runs over
    the contrasts alone. A contrast naming no row is a one-line error before anything is written."""
    import numpy as np

    out = make_synthetic(tmp_path / "o", manifest=False)
    cells = [(r, s, out / "runs" / f"{r}-s{s}") for r in ROWS for s in range(3)]
    path = write_manifest(out, "g", ROWS, cells)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "contrasts": [["vanilla_ppo", "vapo-no-value_pretraining"]]}))
    assert (
        report([str(out), "--grid", "g", "--no-figures", "--contrast", "vapo-no-value_pretraining:vapo"]) == 0
    )
    folder = out / "reports" / "g"
    frame = pd.read_csv(folder / "contrasts.csv")
    assert [tuple(x) for x in frame[["row", "against"]].values] == [
        ("vanilla_ppo", "vapo-no-value_pretraining"),
        ("vapo-no-value_pretraining", "vapo"),
    ]
    seeds = pd.read_csv(folder / "seeds.csv")
    t975 = 4.302652729749464  # scipy.stats.t.ppf(0.975, 2) (scipy 1.17.1)
    ps = []
    for _, r in frame.iterrows():
        for m in ("final", "auc", "peak"):
            a = seeds[seeds["row"] == r["row"]].sort_values("seed")[m].to_numpy(np.float64)
            b = seeds[seeds["row"] == r["against"]].sort_values("seed")[m].to_numpy(np.float64)
            d = a - b
            half = t975 * d.std(ddof=1) / np.sqrt(len(d))
            assert r[f"delta_{m}_pairs"] == 3
            assert r[f"delta_{m}"] == pytest.approx(d.mean(), abs=1e-6)  # the CSV keeps 10 significant digits
            assert r[f"delta_{m}_ci_lo"] == pytest.approx(d.mean() - half, abs=1e-6)
            assert r[f"delta_{m}_ci_hi"] == pytest.approx(d.mean() + half, abs=1e-6)
        ps.append(r["delta_final_p"])
    lo, hi = sorted(ps)
    holm = sorted(frame["delta_final_p_holm"])
    assert holm == pytest.approx([min(1, 2 * lo), max(min(1, 2 * lo), min(1, hi))], abs=1e-6)
    md = (folder / "table.md").read_text()
    section = md[md.index("## Further contrasts") :]
    assert "| vanilla PPO | w/o value_pretraining | 3 |" in section
    assert "further contrasts in `contrasts.csv`" in md
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0  # the manifest's pair alone
    assert len(pd.read_csv(folder / "contrasts.csv")) == 1
    shutil.rmtree(out / "reports")
    for bad, says in (
        ("vapo:nope", "'nope' is not a row; rows: vapo, vapo-no-value_pretraining, vanilla_ppo"),
        ("vapo", "expected ROW:AGAINST"),
        ("vapo:vapo", "expected ROW:AGAINST"),
        ("vapo-no-value_pretraining:vanilla_ppo", "is given twice (a reversed pair is the same test)"),
    ):
        assert (
            _one_line_error(capsys, [str(out), "--grid", "g", "--no-figures", "--contrast", bad]).count(says)
            == 1
        )
        assert not (out / "reports").exists()
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    for seed in range(3):  # a declared row without any run log (yet): the pair is left out and named
        (out / "runs" / f"vanilla_ppo-s{seed}" / "metrics.csv").unlink()
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    assert not (out / "reports" / "g" / "contrasts.csv").exists()  # the earlier report's file is gone too
    md = (out / "reports" / "g" / "table.md").read_text()
    assert "## Further contrasts" not in md
    assert (
        "Declared contrasts left out (a row has no run log yet): vanilla PPO against w/o value_pretraining."
        in md
    )
    write_manifest(out, "h", ROWS, cells)  # a second grid: --contrast needs --grid
    assert "--contrast names rows of one grid; add --grid (one of g, h)" in _one_line_error(
        capsys, [str(out), "--no-figures", "--contrast", "vapo:vapo-no-value_pretraining"]
    )


def test_a_contrast_with_the_same_difference_in_every_pair_has_no_p_value():
    """Zero spread (identical nonzero per-seed differences): no t statistic, shown n/a ‡ as in the table."""
    from vapo_lit.report import contrasts as contrast

    seeds = pd.DataFrame(
        {
            "row": ["a"] * 3 + ["b"] * 3,
            "seed": [0, 1, 2] * 2,
            "final": [50.0, 60.0, 70.0, 40.0, 50.0, 60.0],
            "auc": [1.0, 2.0, 4.0, 1.0, 1.0, 1.0],
            "peak": [50.0, 60.0, 70.0, 50.0, 60.0, 70.0],
        }
    )
    frame = contrast.contrast_frame(seeds, [("a", "b")])
    r = frame.iloc[0]
    assert r["delta_final"] == 10.0 and math.isnan(r["delta_final_p"]) and r["delta_final_ci_lo"] == 10.0
    assert r["delta_peak"] == 0.0 and r["delta_peak_p"] == 1.0  # identical rows: no difference, p 1
    line = contrast.markdown_table(frame).splitlines()[-1]
    assert line.startswith("| a | b | 3 | +10.0 [+10.0, +10.0] | n/a ‡ | n/a ‡ | +1.3 [")


# ============================================================================ bad and truncated logs
def _one_line_error(capsys, argv) -> str:
    assert report(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vapo-report: error: ") and "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "damage, where",
    [
        (lambda p: p.write_text(""), "line 1: empty file"),
        (lambda p: p.write_text(p.read_text().splitlines(True)[0]), "line 2: no complete data row"),
        (
            lambda p: p.write_text(
                "".join(l if i != 3 else "1,2\r\n" for i, l in enumerate(p.read_text().splitlines(True)))
            ),
            "line 4: 2 fields",
        ),
        (
            lambda p: p.write_text(p.read_text().replace("\n3,3,", "\n3,three,", 1)),
            "line 5: column 'train/iteration'",
        ),
        (lambda p: p.write_text("a,b\r\n1,2\r\n"), "line 1: header has no 'step'"),
    ],
)
def test_malformed_metrics_refused_with_file_and_line(tmp_path, capsys, damage, where):
    out = make_synthetic(tmp_path / "o")
    path = out / "runs" / "vapo-s1" / "metrics.csv"
    damage(path)
    err = _one_line_error(capsys, [str(out), "--grid", "syn"])
    assert str(path) in err and where in err


def test_other_bad_inputs_refused(tmp_path, capsys):
    out = make_synthetic(tmp_path / "o")
    (out / "runs" / "vapo-s0" / "config.yaml").write_text("seed: [1,\n  steps: 3\n")
    assert "config.yaml line" in _one_line_error(capsys, [str(out), "--grid", "syn"])
    out2 = make_synthetic(tmp_path / "o2")
    (out2 / "grids" / "syn.json").write_text('{"cells": [\n')
    assert "syn.json line" in _one_line_error(capsys, [str(out2), "--grid", "syn"])
    good = json.loads((out / "grids" / "syn.json").read_text())
    for key, bad, says in (
        ("contrasts", [["vapo"]], "'contrasts' must be a list of [row, against] label pairs"),
        ("contrasts", "vapo:vanilla_ppo", "'contrasts' must be a list"),
        ("contrasts", {}, "'contrasts' must be a list"),
        ("reference", ["vapo"], "'reference' must be a row label"),
        ("reference", "", "'reference' must be a row label"),
    ):
        (out2 / "grids" / "syn.json").write_text(json.dumps({**good, key: bad}))
        assert f"syn.json line 1: {says}" in _one_line_error(capsys, [str(out2), "--grid", "syn"])
        assert not (out2 / "reports").exists()
    (tmp_path / "empty").mkdir()
    assert "no run logs" in _one_line_error(capsys, [str(tmp_path / "empty")])
    out3 = make_synthetic(tmp_path / "o3")
    for m in (out3 / "runs").glob("*/metrics.csv"):
        m.unlink()
    assert "none with a metrics.csv" in _one_line_error(capsys, [str(out3), "--grid", "syn"])
    with pytest.raises(SystemExit):
        report([str(out), "--threshold", "150"])


def test_truncated_runs_are_reported_and_flagged(tmp_path):
    out = make_synthetic(tmp_path / "o", manifest=False)
    write_run(
        out / "runs" / "vapo-no-value_pretraining-s1",
        "vapo-no-value_pretraining",
        1,
        evals_of("vapo-no-value_pretraining", 1),
        steps=STEPS,
        updates=6,
    )  # killed after 6 of 10 updates
    cut = out / "runs" / "vanilla_ppo-s0" / "metrics.csv"
    text = cut.read_text()
    cut.write_text(text[: len(text) - 25])  # the last line cut mid-number
    cells = [(r, s, out / "runs" / f"{r}-s{s}") for r in ROWS for s in range(3)]
    write_manifest(out, "g", ROWS, cells)
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    md = (out / "reports" / "g" / "table.md").read_text()
    assert "| w/o value_pretraining † |" in md and "| vanilla PPO † |" in md and "| VAPO (full) |" in md
    assert "`../../runs/vapo-no-value_pretraining-s1` (6 of 10 PPO updates)" in md
    assert "`../../runs/vanilla_ppo-s0` (9 of 10 PPO updates; last line of metrics.csv cut (left out))" in md
    seeds = pd.read_csv(out / "reports" / "g" / "seeds.csv").set_index("run")
    # the cut line (update 10, with the last eval) is left out: final is update 8's eval
    assert seeds.loc["../../runs/vanilla_ppo-s0", "final"] == pytest.approx(
        100 * evals_of("vanilla_ppo", 0)[8]
    )
    assert seeds.loc["../../runs/vapo-no-value_pretraining-s1", "final"] == pytest.approx(
        100 * evals_of("vapo-no-value_pretraining", 1)[6]
    )


def test_report_reads_logs_only_and_its_statistics_load_without_pandas():
    """The report imports nothing of the runner (DESIGN.md); `--seeds auto` imports only the
    report's statistics, which load without pandas or matplotlib."""
    import ast
    import subprocess
    import sys

    for path in (Path(__file__).resolve().parents[1] / "vapo_lit" / "report").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [m for m in names if m.startswith("vapo_lit.ablate")], path
    code = "import sys, vapo_lit.seed_stats; print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_paper_note_counts_directions_holm_survivors_and_the_rank_correlation():
    import pandas as pd

    from vapo_lit import seed_stats as stats
    from vapo_lit.report import render
    from vapo_lit.report.table import PAPER_DROPS

    nan = float("nan")
    rows = [
        ("vapo", nan, nan),
        ("vapo-no-value_pretraining", -10.0, 0.01),
        ("vapo-no-clip_higher", 2.0, 0.5),
        ("vapo-no-token_level_loss", -1.0, nan),
        ("vapo-no-group_sampling", nan, nan),
        ("grpo+token_level_loss+clip_higher+group_sampling", 9.0, 0.02),
        ("vanilla_ppo", -30.0, 0.001),
    ]
    table = pd.DataFrame([{"row": r, "delta_final": d, "delta_final_p_holm": p} for r, d, p in rows])
    ctx = render.Context(
        k=4, last_n=10, threshold=50, reference="vapo", token_budget=1, time_budget=1, max_seeds=20
    )
    note = render.paper_note(table, ctx)
    rho = stats.spearman(
        [-10.0, 2.0, -1.0], [PAPER_DROPS[c] for c in ("value_pretraining", "clip_higher", "token_level_loss")]
    )
    assert (
        "2 of the 3 single drops move in the paper's direction (Δ < 0): w/o value_pretraining, "
        "w/o token_level_loss;" in note
    )
    assert (
        "surviving Holm: w/o value_pretraining (Δ -10.0, p=0.010)." in note
    )  # GRPO and vanilla PPO are not single drops
    assert f"with the paper's: {rho:+.2f}." in note
    assert (
        render.paper_note(
            table, render.Context(4, 10, 50, "grpo+token_level_loss+clip_higher+group_sampling", 1, 1, 20)
        )
        == ""
    )


def test_the_caveats_name_what_a_delta_is_against_the_reference():
    import pandas as pd

    from vapo_lit.report.write import caveats

    table = pd.DataFrame([{"row": "vapo", "n": 3}, {"row": "vapo-no-clip_higher", "n": 3}])
    assert "removing that component *from this full recipe*" in caveats(table, "vapo")
    other = caveats(table, "grpo+token_level_loss+clip_higher+group_sampling")
    assert (
        "paired difference of a row from critic-free GRPO" in other and "removing" not in other.split("\n")[2]
    )
    assert "no reference row, so no Δ" in caveats(table, None)


def test_each_row_keeps_one_colour_and_eleven_rows_never_share_one():
    """A row's colour is fixed by its place in the row order (the same in every figure, also when
    a row has nothing to draw in one); the first ten are matplotlib's defaults, and up to twenty
    rows (a Table 1 grid has eleven) all differ."""
    import matplotlib

    from vapo_lit.report.figures import COLOURS, colour

    order = [f"row{i}" for i in range(20)]
    assert len({colour(order, r) for r in order}) == 20
    defaults = [
        matplotlib.colors.to_hex(c) for c in matplotlib.rcParamsDefault["axes.prop_cycle"].by_key()["color"]
    ]
    assert list(COLOURS[:10]) == defaults
    assert colour(order, "row3") == colour(["x", "y", "z", "row3"], "row3") == COLOURS[3]
    assert colour(order + ["row20"], "row20") == COLOURS[0]  # past twenty the colours repeat


def test_figures_draw_each_of_eleven_rows_in_its_own_colour():
    """The figures' lines (mean curves with their bands, calibration lines) take the row's colour:
    eleven rows, eleven colours, and a row keeps its colour when an earlier row has nothing to draw."""
    from types import SimpleNamespace

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vapo_lit.report.figures import _calibration_panel, _lines, colour

    order = [f"row{i}" for i in range(11)]
    logs = [SimpleNamespace(row=r, i=i) for i, r in enumerate(order) for _ in range(2)]
    fig, ax = plt.subplots()
    assert _lines(ax, logs, order, lambda log: pd.Series([1.0 * log.i, 2.0 * log.i], index=[0, 1]))
    assert [matplotlib.colors.to_hex(line.get_color()) for line in ax.lines] == [
        colour(order, r) for r in order
    ]
    assert len({matplotlib.colors.to_hex(line.get_color()) for line in ax.lines}) == 11
    ax.cla()  # the first row has nothing to draw: the others keep their colours
    _lines(
        ax, logs, order, lambda log: pd.Series([1.0, 2.0]) if log.row != "row0" else pd.Series(dtype=float)
    )
    assert [matplotlib.colors.to_hex(line.get_color()) for line in ax.lines] == [
        colour(order, r) for r in order[1:]
    ]
    ax.cla()
    calibration = {
        "buckets": ["first", "1-7"],
        "vp": {r: True for r in order},
        "bias": {r: {("late", "first"): 0.1, ("late", "1-7"): 0.2} for r in order[1:]},
    }
    assert _calibration_panel(ax, order, calibration, "late")
    assert [matplotlib.colors.to_hex(line.get_color()) for line in ax.lines][:10] == [
        colour(order, r) for r in order[1:]
    ]
    plt.close(fig)


def test_an_attempt_started_over_without_an_end_counts_as_lost(tmp_path):
    """A worker killed outright never writes its attempt's end; when the ledger shows the cell
    started again after it, that attempt was lost (a crash), not a silent extra attempt. The last
    start with no end is the attempt in progress: no outcome yet."""
    from vapo_lit.report.logs import attempt_counts, read_attempts

    path = tmp_path / "attempts.jsonl"
    lines = [
        {"trial": 1, "event": "start"},  # killed: no end
        {"trial": 2, "event": "start"},
        {"trial": 2, "event": "end", "outcome": "interrupted"},
        {"trial": 3, "event": "start"},
        {"trial": 3, "event": "end", "outcome": "lost"},  # ended by the worker that failed it as stale
        {"trial": 4, "event": "start"},  # killed: no end
        {"trial": 5, "event": "start"},
        {"trial": 5, "event": "end", "outcome": "done"},
        {"trial": 6, "event": "start"},  # running now
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    counts = read_attempts(path)
    assert counts["attempts"] == 6 and counts["lost"] == 3 and counts["done"] == 1
    assert attempt_counts(counts) == {"attempts": 6, "crashes": 3, "interrupted": 1}
    path.write_text("".join(json.dumps(r) + "\n" for r in lines[:1]))
    assert read_attempts(path)["lost"] == 0


def test_a_finished_run_a_grid_reused_counts_no_attempt_and_no_cpu(tmp_path):
    """A grid that claims a cell whose run already finished (its storage rebuilt, say) records a
    'reused' start and end: nothing was computed, so that is neither an attempt nor a CPU the run
    computed on."""
    from vapo_lit.report.logs import attempt_counts, read_attempts

    path = tmp_path / "attempts.jsonl"
    ran = {"mode": "fresh", "cpu_capability": "AVX2", "cpu": "Model A"}
    reused = {"mode": "reused", "cpu_capability": "AVX512", "cpu": "Model B"}
    lines = [
        {**ran, "event": "start"},
        {**ran, "event": "end", "outcome": "done"},
        {**reused, "event": "start"},
        {**reused, "event": "end", "outcome": "done"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    counts = read_attempts(path)
    assert attempt_counts(counts) == {"attempts": 1, "crashes": 0, "interrupted": 0} and counts["done"] == 1
    assert counts["cpu_capabilities"] == {"AVX2"} and counts["cpus"] == {"Model A"}
