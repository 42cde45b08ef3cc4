"""Seeds that vary the whole pipeline: a grid's `model_seed: follow` (or `vapo-ablate --model_seed
follow`) gives each seed its own built base policy and reward model (model_seed = seed); the default
shares one. The report says, from the runs' logged configs, which was used and what the intervals
over seeds therefore include."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from report_synth import write_manifest, write_run

from vapo_lit.ablate.grid import cells_of, grid_from_drop, load_grid
from vapo_lit.cli.ablate import build_parser, main, make_plans
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.report import write_report


def base() -> RunConfig:
    return merge(merge(RunConfig(), PRESETS["smoke"]), {"model": "random"})


def test_follow_gives_each_seed_its_own_model_seed_and_shared_keeps_one(tmp_path):
    grid = grid_from_drop(["clip_higher"])
    shared = cells_of(grid, merge(base(), {"model_seed": 7}), [0, 1, 2], tmp_path)
    assert [c.cfg.model_seed for c in shared] == [7] * 6
    grid.model_seed = "follow"
    follow = cells_of(grid, merge(base(), {"model_seed": 7}), [0, 1, 2], tmp_path)
    assert [(c.seed, c.cfg.model_seed) for c in follow] == [(s, s) for _ in range(2) for s in (0, 1, 2)]
    # model_seed is part of a cell's identity: a follow cell is another run (unless the seeds agree)
    assert not {c.cell_id for c in follow} & {c.cell_id for c in shared}
    again = cells_of(grid_from_drop(["clip_higher"]), base(), [0], tmp_path)  # shared, model_seed 0
    assert {c.cell_id for c in follow if c.seed == 0} == {c.cell_id for c in again}


def test_a_grid_file_may_say_model_seed_follow_and_refuses_anything_else(tmp_path):
    good = tmp_path / "g.yaml"
    good.write_text(
        yaml.safe_dump({"name": "g", "model_seed": "follow", "rows": [{}, {"drop": ["clip_higher"]}]})
    )
    assert load_grid(str(good)).model_seed == "follow"
    assert load_grid("table1").model_seed == "shared"
    bad = tmp_path / "b.yaml"
    bad.write_text(yaml.safe_dump({"name": "b", "model_seed": 3, "rows": [{}]}))
    with pytest.raises(ValueError, match=r"model_seed: 3 is not valid; choose one of: shared, follow"):
        load_grid(str(bad))
    clash = tmp_path / "c.yaml"
    clash.write_text(
        yaml.safe_dump({"name": "c", "model_seed": "follow", "rows": [{"set": {"model_seed": 2}}]})
    )
    with pytest.raises(ValueError, match="set.model_seed contradicts the grid's model_seed: follow"):
        cells_of(load_grid(str(clash)), base(), [0], tmp_path)


def args_of(tmp_path, *extra):
    return build_parser().parse_args(
        [
            "--preset",
            "smoke",
            "--model",
            "random",
            "--wandb",
            "disabled",
            "--out",
            str(tmp_path / "out"),
            *extra,
        ]
    )


def test_the_cli_flag_follow_a_fixed_seed_and_the_clash_with_a_follow_grid(tmp_path, capsys):
    plan = make_plans(args_of(tmp_path, "--drop", "clip_higher", "--model_seed", "follow"))(3)
    assert [(c.seed, c.cfg.model_seed) for c in plan.cells] == [(s, s) for _ in range(2) for s in (0, 1, 2)]
    plan = make_plans(args_of(tmp_path, "--drop", "clip_higher", "--model_seed", "4"))(2)
    assert {c.cfg.model_seed for c in plan.cells} == {4}
    grid = tmp_path / "f.yaml"
    grid.write_text(yaml.safe_dump({"name": "f", "model_seed": "follow", "rows": [{}]}))
    assert (
        main(
            [
                "--grid",
                str(grid),
                "--model_seed",
                "4",
                "--preset",
                "smoke",
                "--model",
                "random",
                "--out",
                str(tmp_path / "o2"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model_seed 4: grid 'f' sets model_seed: follow" in err[0]
    assert (
        main(
            [
                "--drop",
                "clip_higher",
                "--model_seed",
                "sometimes",
                "--preset",
                "smoke",
                "--out",
                str(tmp_path / "o3"),
            ]
        )
        == 2
    )
    assert "expected an integer" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()
    assert "follow" in build_parser().format_help()


# ----------------------------------------------------------------------------- the report's line
def _grid(out: Path, model_seeds, model="builtin") -> None:
    cells = []
    for label in ("vapo", "vapo-no-clip_higher"):
        for seed, model_seed in zip((0, 1, 2), model_seeds):
            run = out / "runs" / f"{label}-s{seed}"
            write_run(run, label, seed, {0: 0.2, 2: 0.5 + 0.05 * seed}, steps=2)
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            (run / "config.yaml").write_text(
                yaml.safe_dump({**cfg, "model_seed": model_seed, "model": model})
            )
            cells.append((label, seed, run))
    write_manifest(out, "g", ["vapo", "vapo-no-clip_higher"], cells)


@pytest.mark.parametrize(
    "model_seeds,model,says",
    [
        (
            (0, 0, 0),
            "builtin",
            "every run starts from the same base policy and reward model (model_seed 0); a seed "
            "varies the RL run (prompt stream, sampling, mini-batch order) only, so the intervals "
            "include the seed variance of RL, not that of building the models",
        ),
        (
            (0, 1, 2),
            "builtin",
            "each seed builds its own base policy and reward model (model_seed = seed, "
            "`--model_seed follow`), so the intervals include the variance of the whole pipeline",
        ),
        (
            (5, 5, 5),
            "/models/m",
            "every run starts from the same policy (a model folder) and critic initialisation "
            "(model_seed 5); a seed varies the RL run (prompt stream, sampling, mini-batch order) only",
        ),
        (
            (0, 1, 2),
            "/models/m",
            "the policy is the same model folder in every run; a critic's fresh value head follows",
        ),
        ((0, 3, 0), "builtin", "model_seed differs between runs (0, 3) without following the seed"),
    ],
)
def test_the_report_says_what_a_seed_varied(tmp_path, model_seeds, model, says):
    _grid(tmp_path, model_seeds, model)
    write_report(tmp_path, grid_id="g", figures=False)
    text = (tmp_path / "reports" / "g" / "table.md").read_text()
    lines = [x for x in text.splitlines() if x.startswith("Seeds: ")]
    assert len(lines) == 1 and says in lines[0], lines


@pytest.mark.slow
def test_a_follow_grid_runs_and_its_report_says_so(tmp_path):
    """vapo-ablate end to end (random-init tiny models, one PPO update per cell): each cell's logged
    config carries model_seed = seed, and the report's seeds line says the whole pipeline varied."""
    out = tmp_path / "out"
    assert (
        main(
            [
                "--drop",
                "clip_higher",
                "--seeds",
                "2",
                "--model_seed",
                "follow",
                "--preset",
                "smoke",
                "--model",
                "random",
                "--steps",
                "1",
                "--wandb",
                "disabled",
                "--threads",
                "1",
                "--cache_dir",
                str(tmp_path / "cache"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    configs = [yaml.safe_load(p.read_text()) for p in sorted((out / "runs").glob("*/config.yaml"))]
    assert len(configs) == 4 and all(c["model_seed"] == c["seed"] for c in configs)
    assert {c["seed"] for c in configs} == {0, 1}
    text = (out / "reports" / "drop-clip_higher" / "table.md").read_text()
    assert "Seeds: each seed builds its own base policy and reward model (model_seed = seed" in text
