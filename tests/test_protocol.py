"""The confirmatory protocol (vapo_lit/protocol.py): a grid's endpoint and tuning seeds are fixed
before it runs and recorded in its manifest; the report computes every paired statistic on that
endpoint, states the eval's standard error against the deltas and warns where a row rests on tuning
seeds. Scores are synthetic, so every expected number is computed here by hand.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from report_synth import K, write_manifest, write_run

from vapo_lit import protocol
from vapo_lit.ablate import runner
from vapo_lit.ablate.grid import load_grid
from vapo_lit.cli.ablate import main as ablate
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.report import write_report

T975_2 = 4.302652729749462  # t quantile, 2 degrees of freedom


def test_endpoints_and_seeds_parse_and_bad_ones_are_one_line():
    assert protocol.parse_endpoint("final") == protocol.Endpoint(1) == protocol.parse_endpoint("mean-last-1")
    end = protocol.parse_endpoint("mean-last-3")
    assert (end.name, end.label, end.last) == ("mean-last-3", "last-3", 3)
    assert end.score([10.0, 20.0, 30.0, 50.0]) == pytest.approx(100 / 3)
    assert end.score([40.0]) == 40.0 and math.isnan(end.score([]))
    for bad in ("last3", "mean-last-0", "mean-last-x", 3, None):
        with pytest.raises(ValueError, match="valid: final .* or mean-last-K"):
            protocol.parse_endpoint(bad, "--endpoint")
    assert protocol.parse_seeds("0-2,5") == [0, 1, 2, 5] and protocol.parse_seeds("none") == []
    assert protocol.parse_seeds([2, 0]) == [0, 2]
    for bad in ("2-0", "a", [-1], [True]):
        with pytest.raises(ValueError, match="seeds >= 0"):
            protocol.parse_seeds(bad, "--tuning-seeds")


def _grid_file(tmp_path, **extra):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "rows": [{}, {"drop": ["clip_higher"]}], **extra}))
    return path


def test_the_manifest_records_the_protocol_and_a_rerun_cannot_change_it(tmp_path):
    base = merge(RunConfig(), {**PRESETS["smoke"], "model": "random", "wandb": "disabled"})
    out = tmp_path / "out"
    grid = load_grid(str(_grid_file(tmp_path, endpoint="mean-last-2", tuning_seeds=[0])))
    p = runner.plan(grid, base, range(3), out)
    assert (p.endpoint, p.tuning_seeds) == ("mean-last-2", [0])
    data = json.loads(runner.write_manifest(p).read_text())
    assert data["endpoint"] == "mean-last-2" and data["tuning_seeds"] == [0]
    assert {(c["seed"], c["role"]) for c in data["cells"]} == {
        (0, "tuning"),
        (1, "confirmation"),
        (2, "confirmation"),
    }
    # the same grid again: the recorded protocol; another endpoint or other tuning seeds: refused
    again = load_grid(str(_grid_file(tmp_path)))
    assert runner.plan(again, base, range(3), out).endpoint == "mean-last-2"
    again.endpoint = "final"
    with pytest.raises(ValueError, match="was started with endpoint mean-last-2"):
        runner.plan(again, base, range(3), out)
    again.endpoint, again.tuning_seeds = None, [0, 1]
    with pytest.raises(ValueError, match=r"was started with tuning seeds \[0\]"):
        runner.plan(again, base, range(3), out)
    # a manifest from before the protocol (no endpoint) keeps the last eval
    data.pop("endpoint")
    (out / "grids" / "g.json").write_text(json.dumps(data))
    assert runner.plan(load_grid(str(_grid_file(tmp_path))), base, range(3), out).endpoint == "final"
    # a new grid without any protocol named: the default endpoint, no tuning seeds
    fresh = runner.plan(load_grid(str(_grid_file(tmp_path))), base, range(3), tmp_path / "fresh")
    assert (fresh.endpoint, fresh.tuning_seeds) == (protocol.DEFAULT_ENDPOINT, [])


def test_bad_protocol_input_is_one_line_before_anything_is_written(tmp_path, capsys):
    flags = ["--preset", "smoke", "--model", "random", "--seeds", "1", "--wandb", "disabled"]
    for extra, msg in (
        (["--endpoint", "last"], "--endpoint: 'last' is not an endpoint"),
        (["--tuning-seeds", "x"], "--tuning-seeds: 'x' is not a seed"),
    ):
        out = tmp_path / "o"
        assert ablate(["--drop", "clip_higher", "--out", str(out), *flags, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1 and not out.exists()
    with pytest.raises(ValueError, match="endpoint: 'best' is not an endpoint"):
        load_grid(str(_grid_file(tmp_path, endpoint="best")))


EVALS = {  # row -> seed -> {ppo update: score}; the endpoint averages updates 4, 6 and 8
    "vapo": {s: {0: 0.2, 2: 0.3, 4: 0.4 + 0.02 * s, 6: 0.5, 8: 0.6 - 0.01 * s} for s in range(3)},
    "vapo-no-clip_higher": {
        s: {0: 0.2, 2: 0.3, 4: 0.3 + 0.03 * s, 6: 0.35, 8: 0.7 - 0.05 * s} for s in range(3)
    },
}


def _synthetic(tmp_path, endpoint, tuning):
    out = tmp_path / "syn"
    cells = []
    for row, per_seed in EVALS.items():
        for seed, evals in per_seed.items():
            d = out / "runs" / f"{row}-s{seed}"
            write_run(d, row, seed, evals, steps=8)
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            (d / "config.yaml").write_text(yaml.safe_dump({**cfg, "eval_problems": 32}, sort_keys=False))
            cells.append((row, seed, d))
    path = write_manifest(out, "syn", list(EVALS), cells)
    data = json.loads(path.read_text())
    data.update({k: v for k, v in (("endpoint", endpoint), ("tuning_seeds", tuning)) if v is not None})
    path.write_text(json.dumps(data))
    write_report(out, grid_id="syn", figures=False)
    return out / "reports" / "syn"


def _by_hand(last: int):
    score = {
        row: [100 * sum(list(e.values())[-last:]) / last for e in per.values()] for row, per in EVALS.items()
    }
    d = [a - b for a, b in zip(score["vapo-no-clip_higher"], score["vapo"])]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    return score, mean, (mean - T975_2 * sd / math.sqrt(3), mean + T975_2 * sd / math.sqrt(3))


def test_the_report_is_computed_on_the_recorded_endpoint(tmp_path):
    folder = _synthetic(tmp_path, "mean-last-3", [0])
    score, mean, (lo, hi) = _by_hand(3)
    seeds = pd.read_csv(folder / "seeds.csv")
    for row in EVALS:
        got = seeds[seeds["row"] == row].sort_values("seed")
        assert list(got["final"]) == pytest.approx(score[row], abs=1e-6)  # seeds.csv keeps 10 digits
        assert list(got["last_eval"]) == pytest.approx([100 * e[8] for e in EVALS[row].values()], abs=1e-6)
    table = pd.read_csv(folder / "table.csv").set_index("row")
    rec = table.loc["vapo-no-clip_higher"]
    assert (rec["delta_final"], rec["delta_final_ci_lo"], rec["delta_final_ci_hi"]) == pytest.approx(
        (mean, lo, hi)
    )
    # the last eval alone gives another delta: the endpoint is not a label over the old number
    last, last_mean, _ = _by_hand(1)
    assert abs(last_mean - mean) > 1.0
    md = (folder / "table.md").read_text()
    assert "Endpoint: **the mean of the last 3 evals** after training started (`mean-last-3`; fixed" in md
    assert "| Δ last-3 (paired, 95% CI) |" in md and "Δ final" not in md
    # the binomial standard error of one run's endpoint at the reference's mean, 32 problems x K samples
    p = sum(score["vapo"]) / 300
    se = 100 * math.sqrt(p * (1 - p) / (32 * K * 3))
    assert (
        f"One eval scores {32 * K} responses; at the reference score ({100 * p:.1f}) the binomial standard "
        f"error of one run's endpoint is ±{se:.1f} points, against a median |Δ last-3| of {abs(mean):.1f} points "
        f"({abs(mean) / se:.1f} x)." in md
    )
    assert "Tuning seeds: 0 (settings were chosen on them). ⚠ Rows whose numbers include tuning seeds" in md
    assert "VAPO (full) (0); w/o clip_higher (0)" in md


def test_a_manifest_without_an_endpoint_is_reported_on_the_last_eval(tmp_path):
    folder = _synthetic(tmp_path, None, None)
    score, mean, _ = _by_hand(1)
    seeds = pd.read_csv(folder / "seeds.csv")
    assert "last_eval" not in seeds.columns
    assert list(seeds[seeds["row"] == "vapo"].sort_values("seed")["final"]) == pytest.approx(score["vapo"])
    assert pd.read_csv(folder / "table.csv").set_index("row").loc[
        "vapo-no-clip_higher", "delta_final"
    ] == pytest.approx(mean)
    md = (folder / "table.md").read_text()
    assert (
        "Endpoint: **the last eval** after training started (`final`; the manifest records no endpoint" in md
    )
    assert "Tuning seeds: not recorded" in md and "| Δ final (paired, 95% CI) |" in md


def test_no_warning_when_every_seed_is_a_confirmation_seed(tmp_path):
    md = (_synthetic(tmp_path, "mean-last-3", [5, 6]) / "table.md").read_text()
    assert "Tuning seeds: 5, 6 (settings were chosen on them). No row includes them" in md and "⚠" not in md


def _edit_card(run_dir, **entries):
    path = run_dir / "run_card.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **entries}))


def test_a_grid_run_on_two_kinds_of_cpu_or_from_two_base_policies_is_named(tmp_path):
    """Float32 results differ between CPU instruction sets (the built-in models' builds among them),
    so a grid whose runs computed on several, or whose runs of one model_seed started from different
    policy weights, says so under its protocol; one that did not says nothing more."""
    folder = _synthetic(tmp_path, "mean-last-3", [5, 6])
    runs = sorted((tmp_path / "syn" / "runs").iterdir())
    cpu = {"accelerator": "cpu"}
    for d in runs:
        _edit_card(
            d,
            software={"torch_cpu_capability": "AVX512"},
            hardware=cpu,
            base_models={"policy": {"cache": "policy-x", "weights_sha256": "a" * 64}},
        )

    def report() -> str:
        write_report(tmp_path / "syn", grid_id="syn", figures=False)
        return (folder / "table.md").read_text()

    assert "⚠" not in report()
    # a GPU run's card names the host's CPU too: it is not a CPU run, so it is not counted
    _edit_card(runs[0], software={"torch_cpu_capability": "AVX2"}, hardware={"accelerator": "cuda"})
    assert "⚠" not in report()
    # one run resumed on another kind of CPU: its attempts name both
    _edit_card(runs[0], hardware=cpu)
    with open(runs[1] / "attempts.jsonl", "a") as f:
        f.write(json.dumps({"trial": 9, "event": "start", "mode": "resume", "cpu_capability": "AVX2"}) + "\n")
    md = report()
    assert (
        "⚠ The runs computed on CPUs whose torch kernels differ (runs per instruction set: AVX2 2, AVX512 5;"
        in md
    )
    assert "different built-in policy weights" not in md
    # one run of model_seed 0 started from other weights
    _edit_card(runs[2], base_models={"policy": {"cache": "policy-x", "weights_sha256": "b" * 64}})
    md = report()
    assert "⚠ Runs of the same model_seed started from different built-in policy weights (model_seed 0)" in md


def test_a_grid_held_to_one_instruction_set_says_so(tmp_path):
    """Run cards that record the same pin (vapo_lit/cpu_pin.py) on every run: the protocol names it;
    one unpinned run, or two pins, and it does not."""
    folder = _synthetic(tmp_path, "mean-last-3", [5, 6])
    runs = sorted((tmp_path / "syn" / "runs").iterdir())
    pinned = {"torch_cpu_capability": "AVX2", "cpu_pin": "avx2"}
    for d in runs:
        _edit_card(d, software=pinned, hardware={"accelerator": "cpu"})

    def report() -> str:
        write_report(tmp_path / "syn", grid_id="syn", figures=False)
        return (folder / "table.md").read_text()

    sentence = "Every run was held to one instruction set (avx2: torch's, MKL's and oneDNN's kernels)"
    assert sentence in report()
    assert sentence + ", whichever CPU ran it." in report()  # no run records its CPU model
    for d in runs:
        _edit_card(d, software=pinned, hardware={"accelerator": "cpu", "cpu": "Model A"})
    assert sentence + ", on one CPU model (Model A)." in report()
    # CPUs of one instruction set can still differ in the last bits: a second model is named, with
    # the models the attempts record (a resumed run counts under each) and the runs that record none
    _edit_card(runs[-1], software=pinned, hardware={"accelerator": "cpu"})
    with (runs[-1] / "attempts.jsonl").open("a") as f:
        f.write(json.dumps({"event": "start", "cpu_capability": "AVX2", "cpu": "Model B"}) + "\n")
    assert (
        f"{sentence}; the CPU models they computed on (runs per model: Model A {len(runs) - 1}; Model B 1;"
        in report()
    )
    _edit_card(runs[-1], software=pinned, hardware={"accelerator": "cpu", "cpu": "Model A"})
    assert f"(runs per model: Model A {len(runs)}; Model B 1; a resumed run" in report()
    (runs[-1] / "attempts.jsonl").unlink()
    _edit_card(runs[-1], software=pinned, hardware={"accelerator": "cpu"})
    assert f"(runs per model: Model A {len(runs) - 1}; not recorded 1; a resumed run" in report()
    _edit_card(runs[0], software={"torch_cpu_capability": "AVX2"})
    assert "held to one instruction set" not in report()
    _edit_card(runs[0], software={**pinned, "cpu_pin": "default"})
    assert "held to one instruction set" not in report()
