"""JSON tool calls (tool_format "json"): the `<tool_call>{"name", "arguments"}</tool_call>` format
chat models trained for tools write, arguments checked against the tool's JSON schema, every
failure an observation, the schemas handed to a real chat template's `tools=`."""

from __future__ import annotations

import pytest
from test_multiturn import fused_tokenizer, run_script

from vapo_lit.tasks.base import Problem, Verdict
from vapo_lit.tasks.env import Environment, Tool, ToolError, check_arguments, parse_json_call

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def _add(problem, args):
    return str(args["a"] + args["b"])


def _div(problem, args):
    return args["a"] // args["b"]  # b = 0 raises: a tool bug, not the policy's


def _stats(problem, args):
    if not args["xs"]:
        raise ToolError("empty list")
    return {"n": len(args["xs"]), "max": max(args["xs"])}


class Calc(Environment):
    name, version, max_new_tokens, max_turns = "calc", "1", 16, 4
    tool_format, stop_sequences = "json", ("</tool_call>",)

    def __init__(self, tokenizer=None):
        self.tools = {
            "add": Tool("add", _add, "a + b", ADD),
            "div": Tool("div", _div, "a // b", ADD),
            "stats": Tool(
                "stats",
                _stats,
                "count and maximum",
                {
                    "type": "object",
                    "properties": {"xs": {"type": "array"}, "mode": {"enum": ["fast", "exact"]}},
                    "required": ["xs"],
                },
            ),
        }
        self._tok = tokenizer

    @property
    def tokenizer(self):
        return self._tok

    def problem_from_prompt(self, prompt):
        return Problem(prompt, "3", {})

    def verify(self, problem, response):
        return Verdict(float(response.endswith(problem.answer)))


@pytest.mark.parametrize(
    "turn, expect",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', ("add", {"a": 1, "b": 2})),
        (
            'thinking... <tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>',
            ("add", {"a": 1, "b": 2}),
        ),  # arguments as a JSON string
        (
            '<tool_call>{"name": "x", "arguments": {}}</tool_call> <tool_call>{"name": "y"}',
            ("y", {}),
        ),  # the last call
        ("no call here", None),
        ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', None),  # not JSON
        ('<tool_call>["add", 1]</tool_call>', None),
        ('<tool_call>{"arguments": {}}</tool_call>', None),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', None),
        ("<tool_call>" + "[" * 100000 + "</tool_call>", None),  # nesting past the recursion limit
    ],
)
def test_parse_json_call(turn, expect):
    assert parse_json_call(turn) == expect


@pytest.mark.parametrize(
    "args, error",
    [
        ({"a": 1, "b": 2}, None),
        ({"a": 1}, "missing argument(s) b"),
        ({"a": 1, "b": 2, "c": 3}, "unknown argument(s) c"),
        ({"a": 1, "b": "2"}, "argument b must be integer"),
        ({"a": 1, "b": True}, "argument b must be integer"),  # a bool is not an integer
        ({"a": 1, "b": 2.0}, "argument b must be integer"),
    ],
)
def test_arguments_are_checked_against_the_schema(args, error):
    if error is None:
        check_arguments(ADD, args)
    else:
        with pytest.raises(ToolError, match=f"^{error}$".replace("(", r"\(").replace(")", r"\)")):
            check_arguments(ADD, args)


@pytest.mark.parametrize(
    "turn, observation",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "3"),
        ('<tool_call>{"name": "stats", "arguments": {"xs": [4, 9, 2]}}</tool_call>', '{"n": 3, "max": 9}'),
        (
            '<tool_call>{"name": "stats", "arguments": {"xs": [1], "extra": 1}}</tool_call>',
            '{"n": 1, "max": 1}',
        ),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "error bad args"),
        (
            '<tool_call>{"name": "stats", "arguments": {"xs": [1], "mode": "slow"}}</tool_call>',
            "error bad args",
        ),
        (
            '<tool_call>{"name": "stats", "arguments": {"xs": []}}</tool_call>',
            "error bad args",
        ),  # the tool refuses
        ('<tool_call>{"name": "div", "arguments": {"a": 1, "b": 0}}</tool_call>', "error tool failed"),
        ('<tool_call>{"name": "mul", "arguments": {"a": 1, "b": 2}}</tool_call>', "error unknown tool"),
        ('<tool_call>{"name": add}</tool_call>', "error malformed call"),
        ("call add 1 2 </tool_call>", "error malformed call"),  # the other format is not this one
    ],
)
def test_every_call_is_an_answer_or_an_error_observation(turn, observation):
    env = Calc()
    assert (
        env.respond(env.problem_from_prompt("p"), turn, turn, turns_done=1, final=False).observation
        == observation
    )


def test_the_schemas_render_in_a_real_chat_template():
    """tool_schemas() is what transformers' apply_chat_template(tools=...) takes: a ChatML template
    with a tools block (the Qwen2.5/Hermes layout) renders each function's JSON."""
    import json

    tok = fused_tokenizer(["x"])
    tok.chat_template = (
        "{%- if tools %}<|im_start|>system\n<tools>{%- for t in tools %}{{ '\\n' + (t | tojson) }}{%- endfor %}\n"
        "</tools><|im_end|>\n{%- endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    env = Calc()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "1+2?"}],
        tools=env.tool_schemas(),
        tokenize=False,
        add_generation_prompt=True,
    )
    rendered = [
        json.loads(line) for line in text.split("<tools>")[1].split("</tools>")[0].strip().splitlines()
    ]
    assert [f["function"]["name"] for f in rendered] == ["add", "div", "stats"]
    assert rendered[0] == {
        "type": "function",
        "function": {"name": "add", "description": "a + b", "parameters": ADD},
    }


def test_a_json_call_episode_through_the_engine():
    """A scripted episode: the call (stop string split over tokens), the tool's answer as an
    observation with no log-prob and no action mask, then the final answer."""
    call = '{"name":"add","arguments":{"a":1,"b":2}}'
    env = Calc(fused_tokenizer(["<tool_call>", call, "</tool_", "call>", "so", "3", "p"]))
    ro = run_script(
        env, [env.problem_from_prompt("p")], [f"<tool_call> {call} </tool_ call> so"], max_new_tokens=10
    )
    assert ro.texts[0] == f"<tool_call>{call}</tool_call>3so" and int(ro.turns[0]) == 2
    assert ro.action_mask[0, : int(ro.lengths[0])].tolist() == [1, 1, 1, 1, 0, 1, 1]  # ..., "3", "so", EOS
    assert ro.logprobs[0, 4] == 0
