"""`math_tools`: math problems as chat episodes with a calculator tool in the JSON format, on a
local chat-template tokenizer; the calculator evaluates arithmetic and nothing else."""

from __future__ import annotations

import json
import warnings

import pytest
from test_chat_episodes import IdScripted, chat_tokenizer

from vapo_lit.engines.episodes import generate_episodes
from vapo_lit.tasks import get_task
from vapo_lit.tasks.env import ToolError
from vapo_lit.tasks.math_tools import calculate


@pytest.mark.parametrize(
    "expression, value",
    [
        ("12 * 7", 84),
        ("(1 + 2) * 3 / 4", 2.25),
        ("-2 ** 3", -8),
        ("7 // 2 + 7 % 2", 4),
        ("1e3 + 0.5", 1000.5),
    ],
)
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "(1).real",
        "[1, 2]",
        "2 ** 1000",
        "9 ** 9 ** 9",
        "1 / 0",
        "1 +",
        "True + 1",
        "'a' * 3",
        "1" * 300,
        "10 ** 31",
    ],
)
def test_the_calculator_refuses_everything_else(expression):
    with pytest.raises(ToolError):
        calculate(expression)


@pytest.fixture
def task(tmp_path):
    tok = chat_tokenizer("chatml")
    tok.save_pretrained(tmp_path / "tok")
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is 12 times {k}?", "answer": str(12 * k)}) + "\n"
            for k in range(2, 12)
        )
    )
    return get_task(
        "math_tools", train_path=str(data), tokenizer=str(tmp_path / "tok"), instruction="", max_turns=3
    )


def test_a_calculator_episode_is_scored_on_its_final_answer(task):
    p = task.train_problems(1, seed=0)[0]
    k = int(p.answer) // 12
    tok = task.tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * %d"}}\n</tool_call>' % k
    script = enc(call) + [eot] + enc("So it is \\boxed{%d}." % (12 * k)) + [eot]
    ro = generate_episodes(
        IdScripted([script], len(tok)), tok, task, [p.prompt], temperature=0.0, max_new_tokens=200, seeds=0
    )
    n = int(ro.lengths[0])
    observation = tok.decode(ro.response_ids[0, :n][~ro.action_mask[0, :n].bool()].tolist())
    assert f"<tool_response>\n{12 * k}\n</tool_response>" in observation
    assert int(ro.turns[0]) == 2 and task.verify(p, ro.texts[0]).reward == 1.0
    assert task.problem_from_prompt(p.prompt) == p
    task.close()


def test_math_tools_needs_a_chat_template(tmp_path):
    tok = chat_tokenizer("chatml")
    tok.chat_template = None
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    with pytest.raises(ValueError, match="math_tools needs a tokenizer with a chat template"):
        get_task("math_tools", train_path=str(data), tokenizer=tok)


# ----------------------------------------------------------------------------- the built-in problems
def test_math_and_math_tools_run_on_built_in_problems_without_options(tmp_path):
    """No data file: 512 train and 64 eval arithmetic word problems generated in code, integer
    answers, the same on every build, no eval question among the train ones; verified as usual."""
    from vapo_lit.tasks.wordproblems import EVAL_SIZE, TRAIN_SIZE

    tok = chat_tokenizer("chatml")
    task = get_task("math", tokenizer=tok)
    assert (task.n_train, task.n_eval) == (TRAIN_SIZE, EVAL_SIZE) == (512, 64)
    train, evals = task.train_records(), task.eval_records()
    assert all(r.answer.isdigit() and int(r.answer) > 0 for r in train + evals)
    assert not {r.question for r in train} & {r.question for r in evals}
    assert len({r.question for r in train}) == len(train)
    assert sum(int(r.answer) >= 100 for r in train) > len(train) // 2  # numbers a calculator helps with
    assert [r.question for r in get_task("math", tokenizer=tok).eval_records()] == [r.question for r in evals]
    assert "/builtin-" in task.version
    p = task.eval_problems()[0]
    assert task.verify(p, f"... so \\boxed{{{p.answer}}}").reward == 1.0
    assert task.verify(p, f"\\boxed{{{int(p.answer) + 1}}}").reward == 0.0
    task.close()
    tools = get_task("math_tools", tokenizer=tok)
    assert tools.n_train == TRAIN_SIZE and '"name": "calculator"' in tools.train_problems(1, 0)[0].prompt
    tools.close()
    with pytest.raises(ValueError, match="eval_path needs train_path"):
        get_task("math", tokenizer=tok, eval_path=str(tmp_path / "eval.jsonl"))


def test_one_step_level_is_one_operation_on_numbers_of_one_to_three_digits(tmp_path):
    """level one-step: the same sizes and guarantees as the default level, each answer one sum,
    difference, product or exact share of the question's two numbers, small and large ones mixed; the
    default level is untouched by it; the level is part of the task's version; files take no level."""
    import re

    from vapo_lit.tasks import wordproblems

    train, evals = (wordproblems.problems(s, level="one-step") for s in ("train", "eval"))
    assert (len(train), len(evals)) == (wordproblems.TRAIN_SIZE, wordproblems.EVAL_SIZE)
    assert len({r["question"] for r in train}) == len(train)
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    assert wordproblems.problems("eval", level="one-step") == evals  # a pure function
    kinds = set()
    for r in train + evals:
        a, b = (int(x) for x in re.findall(r"\d+", r["question"]))
        answer = int(r["answer"])
        ops = {"sum": a + b, "difference": a - b, "product": a * b, "share": a // b if a % b == 0 else None}
        kind = [k for k, v in ops.items() if v == answer]
        assert kind and answer > 0, r
        kinds.add(kind[0])
    assert kinds == {"sum", "difference", "product", "share"}
    small = sum(int(r["answer"]) < 20 for r in train)
    large = sum(int(r["answer"]) >= 1000 for r in train)
    assert small > len(train) // 10 and large > len(train) // 10  # within a small model's reach, and not
    assert wordproblems.problems("train") == wordproblems.problems("train", level="multi-step")
    assert not {r["question"] for r in train} & {r["question"] for r in wordproblems.problems("train")}

    tok = chat_tokenizer("chatml")
    one = get_task("math", tokenizer=tok, level="one-step")
    assert [r.question for r in one.eval_records()] == [r["question"] for r in evals]
    assert one.version != get_task("math", tokenizer=tok).version
    assert (
        get_task("math", tokenizer=tok, level="multi-step").version == get_task("math", tokenizer=tok).version
    )
    one.close()
    tools = get_task("math_tools", tokenizer=tok, level="one-step")
    assert tools.train_problems(1, 0)[0].meta["messages"][-1]["content"].split("\n")[0] in {
        r["question"] for r in train
    }
    tools.close()
    with pytest.raises(
        ValueError, match="level='two-step' is not valid; choose one of: multi-step, one-step"
    ):
        get_task("math", tokenizer=tok, level="two-step")
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    with pytest.raises(ValueError, match="level='one-step' applies to the built-in problems only"):
        get_task("math", tokenizer=tok, train_path=str(data), level="one-step")
    with pytest.raises(ValueError, match="level='one-step' applies to the built-in problems only"):
        get_task("math", tokenizer=tok, train_path=str(data), eval_path=str(data), level="one-step")


def test_math_tools_with_a_template_without_tools_block_shows_the_calculator(tmp_path):
    tok = chat_tokenizer("plain")
    with pytest.warns(
        UserWarning, match="has no tools block, so the tools are described in a system message"
    ):
        task = get_task("math_tools", tokenizer=tok)
    prompt = task.train_problems(1, 0)[0].prompt
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and '"name": "calculator"' in prompt
    assert "<tools>" in prompt and "<tool_call>" in prompt
    task.close()
    with pytest.raises(
        ValueError, match="tools_prompt='xml' is not valid; choose one of: auto, template, system"
    ):
        get_task("math_tools", tokenizer=tok, tools_prompt="xml")


def test_the_tools_warning_is_given_once_per_task_and_tokenizer(tmp_path):
    """Prompts, episodes and a warm-up's own copy of the tokenizer all render the chat: one warning."""
    chat_tokenizer("plain").save_pretrained(tmp_path / "tok")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tasks = [get_task("math_tools", tokenizer=str(tmp_path / "tok")) for _ in range(2)]
        for task in tasks:
            task.train_problems(2, 0)
        in_memory = chat_tokenizer("plain")
        tasks += [get_task("math_tools", tokenizer=in_memory) for _ in range(2)]
    said = [w for w in caught if "has no tools block" in str(w.message)]
    assert len(said) == 2, [str(w.message) for w in said]  # the saved folder's, the in-memory one's
    for task in tasks:
        task.close()


def test_a_boxed_answer_outside_the_final_turn_does_not_score(task):
    """math_tools verifies the model's own final turn: a \\boxed{} written in a turn that called the
    calculator, followed by a final turn without one, scores 0 (the whole transcript would score 1)."""
    p = task.train_problems(1, seed=0)[0]
    k = int(p.answer) // 12
    tok = task.tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call = (
        '\\boxed{%d} <tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * %d"}}\n</tool_call>'
        % (12 * k, k)
    )
    for final, reward in (("no idea", 0.0), ("So \\boxed{%d}." % (12 * k), 1.0)):
        ro = generate_episodes(
            IdScripted([enc(call) + [eot] + enc(final) + [eot]], len(tok)),
            tok,
            task,
            [p.prompt],
            temperature=0.0,
            max_new_tokens=200,
            seeds=0,
        )
        assert int(ro.turns[0]) == 2 and "\\boxed{%d}" % (12 * k) in ro.texts[0]
        assert task.verify(p, ro.texts[0]).reward == reward
    task.close()


def test_math_tools_trains_bare_on_a_local_chat_model(tmp_path):
    """--task math_tools --model PATH with no task options: a run on the built-in problems, its
    samples.jsonl holding the prompts (calculator declared), the responses and rewards."""
    from test_user_task import the_docs_chat_walkthrough

    from vapo_lit.config import RunConfig, merge
    from vapo_lit.presets import PRESETS
    from vapo_lit.train import train

    _, model_dir = the_docs_chat_walkthrough(tmp_path)
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "task": "math_tools",
            "task_options": {},
            "model": str(model_dir),
            "steps": 1,
            "eval_problems": 2,
            "ppo": {"max_new_tokens": 24},
            "wandb": "disabled",
            "out_dir": str(tmp_path / "runs"),
            "name": "r",
            "cache_dir": str(tmp_path / "cache"),
            "threads": 1,
            "vapo": {"value_pretrain_steps": 1},
        },
    )
    train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "r" / "samples.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in rows} == {"train", "eval"}
    assert all('"name": "calculator"' in r["prompt"] and "reward" in r and "tool_calls" in r for r in rows)


def test_the_runs_tools_prompt_reaches_a_task_that_takes_one(tmp_path):
    from vapo_lit.build import task_options_of
    from vapo_lit.config import RunConfig, merge

    cfg = merge(RunConfig(), {"task": "math_tools", "tools_prompt": "system"})
    assert task_options_of(cfg)["tools_prompt"] == "system"
    assert (
        task_options_of(merge(cfg, {"task_options": {"tools_prompt": "template"}}))["tools_prompt"]
        == "template"
    )
    assert "tools_prompt" not in task_options_of(merge(cfg, {"task": "chain"}))  # a task that takes none
    task = get_task("math_tools", tokenizer=chat_tokenizer("chatml"), **task_options_of(cfg))
    assert task.train_problems(1, 0)[0].prompt.startswith("<|im_start|>system\n# Tools\n")
    task.close()
    with pytest.raises(
        ValueError, match="tools_prompt='json' is not valid; choose one of: auto, template, system"
    ):
        from vapo_lit.config import validate

        validate(merge(RunConfig(), {"tools_prompt": "json"}))
