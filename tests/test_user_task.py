"""A user's own task named on the command line (`--task path/to/file.py:Class`, `--task module:Class`):
loaded without a wrapper script, presets applying only the options it accepts, bad names refused in
one line before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vapo_lit.cli.train import main
from vapo_lit.config import RunConfig, merge
from vapo_lit.preflight import preflight
from vapo_lit.presets import PRESETS
from vapo_lit.tasks import TASKS, get_task, option_names, task_names

DOC = Path(__file__).resolve().parents[1] / "docs" / "guides" / "multi-turn.md"


def the_docs_task_file(folder: Path) -> Path:
    """docs/guides/multi-turn.md's worked example, written to mytasks.py as a user would save it."""
    text = DOC.read_text()
    start = text.index("```python\n# mytasks.py") + len("```python\n")
    path = folder / "mytasks.py"
    path.write_text(text[start : text.index("```", start)])
    return path


@pytest.fixture
def registry():
    """TASKS as it was (the built-in tasks loaded first): a test's user classes do not leak."""
    task_names()
    before = dict(TASKS)
    yield
    TASKS.clear()
    TASKS.update(before)


def test_a_file_and_a_module_path_load_the_users_class(tmp_path, monkeypatch, registry):
    path = the_docs_task_file(tmp_path)
    env = get_task(f"{path}:CellSum")
    assert type(env).__name__ == "CellSum" and env.problem_from_prompt("sum 3 1").answer == "4"
    monkeypatch.chdir(tmp_path)  # `module:Class` is found next to the user, as `python -m` finds it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert type(get_task("mytasks:CellSum")).__name__ == "CellSum"
    assert option_names("mytasks:CellSum") == []


@pytest.mark.parametrize(
    "name, needle",
    [
        (
            "nosuch_pkg.tasks:Env",
            "task='nosuch_pkg.tasks:Env': no module named 'nosuch_pkg.tasks' (run from the folder",
        ),
        ("{dir}/missing.py:Env", "missing.py not found"),
        ("{dir}/mytasks.py:Nope", "has no class 'Nope'; it defines: CellSum"),
        (
            "cellsum2",
            "task='cellsum2' is not a task; valid tasks: chain, longchain, math, math_tools, toolchain, or a class of your own",
        ),
    ],
)
def test_a_bad_task_name_is_one_line_before_anything_is_written(tmp_path, capsys, name, needle, registry):
    the_docs_task_file(tmp_path)
    out = tmp_path / "runs"
    assert main(["--task", name.format(dir=tmp_path), "--model", "random", "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_presets_apply_only_the_options_the_task_accepts(tmp_path, capsys, registry):
    """`--preset smoke` shrinks the built-in chain task (max_n, eval_per_bucket); a user's task that
    takes no such options gets none of them, and options it was given explicitly are still checked."""
    import yaml

    path = the_docs_task_file(tmp_path)
    assert main(["--preset", "smoke", "--task", f"{path}:CellSum", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["task_options"] == {}
    assert main(["--preset", "smoke", "--print-config"]) == 0  # the built-in task keeps them
    assert yaml.safe_load(capsys.readouterr().out)["task_options"] == PRESETS["smoke"]["task_options"]
    assert (
        main(
            [
                "--preset",
                "smoke",
                "--task",
                f"{path}:CellSum",
                "--task_options",
                '{"max_n": 3}',
                "--model",
                "random",
                "--out_dir",
                str(tmp_path / "runs"),
            ]
        )
        == 2
    )
    assert "unknown option(s) 'max_n' for task" in capsys.readouterr().err


def test_the_python_api_refuses_unknown_options_in_the_same_line(tmp_path, registry):
    path = the_docs_task_file(tmp_path)
    cfg = merge(
        RunConfig(),
        {**PRESETS["smoke"], "task": f"{path}:CellSum", "model": "random", "out_dir": str(tmp_path / "runs")},
    )
    with pytest.raises(
        ValueError,
        match=r"^task_options: unknown option\(s\) 'eval_per_bucket', 'max_n' for task "
        r"'.*mytasks.py:CellSum'; it takes none$",
    ):
        preflight(cfg)
    assert not (tmp_path / "runs").exists()


def test_the_docs_task_trains_from_the_command_line(tmp_path):
    """The user's file, the CLI alone: a real run (random tiny model) of the docs' multi-turn task."""
    path = the_docs_task_file(tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        "--preset",
        "smoke",
        "--task",
        f"{path}:CellSum",
        "--model",
        "random",
        "--steps",
        "1",
        "--out_dir",
        str(tmp_path / "runs"),
        "--name",
        "r",
        "--wandb",
        "disabled",
        "--threads",
        "1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "r" / "metrics.csv").is_file()


def the_docs_chat_walkthrough(folder: Path) -> tuple[Path, Path]:
    """docs/guides/multi-turn.md's walkthrough, followed as written: its calc_env.py, and a local chat
    model (a byte-level BPE tokenizer with a ChatML template built here, a random Llama of its
    vocabulary) in the folder the command names."""
    from test_chat_episodes import chat_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    text = DOC.read_text()
    start = text.index("```python\n# calc_env.py") + len("```python\n")
    env_file = folder / "calc_env.py"
    env_file.write_text(text[start : text.index("```", start)])
    tok = chat_tokenizer("chatml")
    model_dir = folder / "my-chat-model"
    import torch

    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    ).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return env_file, model_dir


def test_the_chat_walkthrough_runs_as_written(tmp_path):
    env_file, _ = the_docs_chat_walkthrough(tmp_path)
    text = DOC.read_text()
    command = next(
        line for line in text.splitlines() if line.startswith("vapo-train --task calc_env.py:Calc")
    )
    cmd = [
        sys.executable,
        "-m",
        "vapo_lit.cli.train",
        *command.split()[1:],
        "--out_dir",
        str(tmp_path / "runs"),
        "--name",
        "r",
        "--wandb",
        "disabled",
        "--threads",
        "1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    card = json.loads((tmp_path / "runs" / "r" / "run_card.json").read_text())
    assert card["multi_turn"]["tools"] == ["calculator"]
    assert (tmp_path / "runs" / "r" / "metrics.csv").is_file()


def test_the_walkthroughs_verifier_reads_only_the_models_final_turn(tmp_path, registry):
    """The walkthrough's Calc scores the last number of the model's own final turn: an episode whose
    calculator answered the right number and whose final turn holds none scores 0 (the last number of
    the whole transcript is the tool's, the right one); the model writing it scores 1."""
    import re

    from test_chat_episodes import IdScripted

    from vapo_lit.engines.episodes import generate_episodes
    from vapo_lit.tasks import task_factory

    env_file, model_dir = the_docs_chat_walkthrough(tmp_path)
    env = task_factory(f"{env_file}:Calc")(tokenizer=str(model_dir))
    p = env.eval_problems()[0]
    a, b = re.search(r"What is (\d+) times (\d+)", p.prompt).groups()
    tok = env.tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s * %s"}}\n</tool_call>' % (
        a,
        b,
    )
    for final, reward in (("True", 0.0), (f"It is {p.answer}.", 1.0)):
        ro = generate_episodes(
            IdScripted([enc(call) + [eot] + enc(final) + [eot]], len(tok)),
            tok,
            env,
            [p.prompt],
            temperature=0.0,
            max_new_tokens=env.max_new_tokens,
            seeds=0,
        )
        text = ro.texts[0]
        assert (
            int(ro.turns[0]) == 2 and re.findall(r"-?\d+", text)[-1] == p.answer
        )  # the tool's answer, or the model's
        assert env.verify(p, text).reward == reward, text
