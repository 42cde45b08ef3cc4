"""Inputs are checked before compute: a model folder that is not a model, a malformed or missing data
file, an unusable critic_init, unknown task options and an output folder that cannot be written
are one line and exit 2 from `vapo-train`, in well under a second of checking, with no run folder
created and no weight loaded; `vapo-ablate` refuses the whole grid, naming the cell.
"""

from __future__ import annotations

import json
import time

import pytest
from test_own_model import make_model_dir

from vapo_lit.cli.ablate import main as ablate_main
from vapo_lit.cli.train import main as train_main
from vapo_lit.config import RunConfig, merge
from vapo_lit.preflight import preflight
from vapo_lit.presets import PRESETS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("model") / "m")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"what is {i} plus 1 ?", "answer": f"#### {i + 1}"}) + "\n"
            for i in range(6)
        )
    )
    return path


def _train(tmp_path, capsys, *argv):
    t0 = time.perf_counter()
    code = train_main(
        ["--preset", "smoke", "--wandb", "disabled", "--out_dir", str(tmp_path / "runs"), *argv]
    )
    err = capsys.readouterr().err
    return code, err, time.perf_counter() - t0


def _math(model, path, critic="actor"):
    return [
        "--model",
        str(model),
        "--critic_init",
        critic,
        "--task",
        "math",
        "--task_options",
        json.dumps({"train_path": str(path)}),
    ]


def test_a_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "weights.txt").write_text("hello")
    code, err, _ = _train(tmp_path, capsys, "--model", str(tmp_path / "notamodel"), "--critic_init", "actor")
    assert (
        code == 2 and "is not a model folder (no config.json)" in err and len(err.strip().splitlines()) == 1
    )
    assert not (tmp_path / "runs").exists()


def test_a_model_folder_without_weights(tmp_path, capsys, model_dir):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare)
    for w in bare.glob("*.safetensors"):
        w.unlink()
    code, err, _ = _train(tmp_path, capsys, "--model", str(bare), "--critic_init", "actor")
    assert code == 2 and "holds no weights" in err
    assert not (tmp_path / "runs").exists()


def test_malformed_and_missing_data_files_name_file_and_line(tmp_path, capsys, model_dir, data):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(data.read_text() + "{not json\n")
    code, err, seconds = _train(tmp_path, capsys, *_math(model_dir, bad))
    assert (
        code == 2 and f"data file {bad}, line 7: invalid JSON" in err and len(err.strip().splitlines()) == 1
    )
    code, err, _ = _train(tmp_path, capsys, *_math(model_dir, tmp_path / "missing.jsonl"))
    assert code == 2 and "missing.jsonl: file not found" in err
    assert not (tmp_path / "runs").exists()


def test_reward_model_critic_with_a_local_model_names_the_valid_choices(tmp_path, capsys, model_dir, data):
    code, err, _ = _train(tmp_path, capsys, *_math(model_dir, data, critic="reward_model"))
    assert code == 2 and "critic_init='reward_model' is built only for --model builtin" in err
    assert "--critic_init actor" in err and "--critic_init PATH" in err
    code, err, _ = _train(tmp_path, capsys, *_math(model_dir, data, critic=str(tmp_path / "no-critic")))
    assert code == 2 and "critic_init" in err and "does not exist" in err
    assert not (tmp_path / "runs").exists()


def test_unknown_task_option_lists_the_valid_ones(tmp_path, capsys):
    code, err, _ = _train(
        tmp_path, capsys, "--model", "random", "--task_options", '{"max_n": 9, "colour": 1}'
    )
    assert code == 2 and "unknown option(s) 'colour' for task 'chain'; valid: min_n, max_n" in err
    assert not (tmp_path / "runs").exists()


def test_unwritable_output_folder(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    code, err, _ = _train(
        tmp_path, capsys, "--model", "random", "--out_dir", str(tmp_path / "afile" / "runs")
    )
    assert code == 2 and "out_dir" in err and "is a file, not a folder" in err


def test_checks_load_no_weights_and_take_well_under_a_second(tmp_path, model_dir, data, monkeypatch):
    import transformers

    def no_weights(*a, **kw):
        raise AssertionError("preflight loaded weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", no_weights)
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "model": str(model_dir),
            "critic_init": "actor",
            "task": "math",
            "task_options": {"train_path": str(data)},
            "out_dir": str(tmp_path / "runs"),
        },
    )
    t0 = time.perf_counter()
    preflight(cfg)
    assert time.perf_counter() - t0 < 2.0
    assert not (tmp_path / "runs").exists()


def test_ablate_refuses_a_grid_whose_cell_has_a_missing_data_file(tmp_path, capsys, model_dir, data):
    import yaml

    grid = tmp_path / "g.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "name": "g",
                "rows": [
                    {},
                    {
                        "label": "other-data",
                        "set": {"task_options": {"train_path": str(tmp_path / "gone.jsonl")}},
                    },
                ],
            }
        )
    )
    code = ablate_main(
        [
            "--grid",
            str(grid),
            "--seeds",
            "1",
            "--preset",
            "smoke",
            "--wandb",
            "disabled",
            "--out",
            str(tmp_path / "o"),
            *_math(model_dir, data),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "cell other-data-s0-" in err and "row 'other-data'" in err and "gone.jsonl" in err
    assert "nothing was started" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
