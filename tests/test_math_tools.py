"""`math_tools`: math problems as chat episodes with a calculator tool in the JSON format, on a
local chat-template tokenizer; the calculator evaluates arithmetic and nothing else."""
from __future__ import annotations

import json

import pytest
from test_chat_episodes import IdScripted, chat_tokenizer

from vapo_lit.engines.episodes import generate_episodes
from vapo_lit.tasks import get_task
from vapo_lit.tasks.env import ToolError
from vapo_lit.tasks.math_tools import calculate


@pytest.mark.parametrize("expression, value", [
    ("12 * 7", 84), ("(1 + 2) * 3 / 4", 2.25), ("-2 ** 3", -8), ("7 // 2 + 7 % 2", 4), ("1e3 + 0.5", 1000.5),
])
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "x + 1", "(1).real", "[1, 2]", "2 ** 1000", "9 ** 9 ** 9", "1 / 0",
    "1 +", "True + 1", "'a' * 3", "1" * 300, "10 ** 31",
])
def test_the_calculator_refuses_everything_else(expression):
    with pytest.raises(ToolError):
        calculate(expression)


@pytest.fixture
def task(tmp_path):
    tok = chat_tokenizer("chatml")
    tok.save_pretrained(tmp_path / "tok")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is 12 times {k}?", "answer": str(12 * k)}) + "\n"
                            for k in range(2, 12)))
    return get_task("math_tools", train_path=str(data), tokenizer=str(tmp_path / "tok"), instruction="", max_turns=3)


def test_a_calculator_episode_is_scored_on_its_final_answer(task):
    p = task.train_problems(1, seed=0)[0]
    k = int(p.answer) // 12
    tok = task.tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * %d"}}\n</tool_call>' % k
    script = enc(call) + [eot] + enc("So it is \\boxed{%d}." % (12 * k)) + [eot]
    ro = generate_episodes(IdScripted([script], len(tok)), tok, task, [p.prompt], temperature=0.0,
                           max_new_tokens=200, seeds=0)
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
