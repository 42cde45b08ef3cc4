"""`math_tools`: the `math` task as a chat conversation with a calculator tool.

The question goes to a chat model in its own chat template with one tool declared: ``calculator``,
which evaluates an arithmetic expression. The tool reaches the model through the template's tools
block (``tools=``) or, for a template without one, in a system message (``tools_prompt``;
`Environment.render_chat`). The model may call it in the JSON format
(``<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>``) any
number of times up to ``max_turns``; each answer comes back as a tool message rendered by the same
template (vapo_lit.engines.episodes.ChatRenderer); the turn without a call is the final answer,
verified as in `math` (the last ``\\boxed{}``) on the model's own final turn only
(`Environment.final_turn`), so no tool answer can score. Needs a tokenizer with a chat template (a
local chat model's: ``--model PATH`` hands it over). Without ``train_path`` it runs on `math`'s
built-in word problems.

The calculator never executes what the model writes: the expression is parsed with Python's `ast`
and only numbers, parentheses and ``+ - * / // % **`` are evaluated, with bounds on the exponent,
the size of the numbers and the expression's length; anything else is ``error bad args``.
"""

from __future__ import annotations

import ast
import json
import operator

from vapo_lit.tasks import register
from vapo_lit.tasks.base import Problem
from vapo_lit.tasks.env import TOOLS_PROMPTS, Environment, Tool, ToolError
from vapo_lit.tasks.math import MathTask

MAX_EXPRESSION = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
CALCULATOR = {
    "type": "object",
    "properties": {
        "expression": {"type": "string", "description": "an arithmetic expression, e.g. (12 + 7) * 3 / 4"}
    },
    "required": ["expression"],
    "additionalProperties": False,
}


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; ToolError for anything that is not one, or too big."""
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise ToolError("not an arithmetic expression") from None
    return _value(tree.body)


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)  # a literal too: 1e999 is inf, "-" + "9" * 199 a 199-digit number
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent above {MAX_EXPONENT}")
        try:
            out = _BINARY[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError, ValueError) as e:
            raise ToolError(str(e)) from None
        return _bounded(out)
    raise ToolError("only numbers, parentheses and + - * / // % ** are allowed")


def _bounded(value):
    """`value` when it is a real number of magnitude at most MAX_MAGNITUDE (NaN is not); else ToolError."""
    if isinstance(value, complex) or not abs(value) <= MAX_MAGNITUDE:
        raise ToolError("result out of range")
    return value


def _calculator(problem: Problem, args: dict) -> str:
    value = calculate(args["expression"])
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 10) if isinstance(value, float) else value)


@register("math_tools")
class MathToolsTask(MathTask, Environment):
    """`math`'s problems as chat episodes with a calculator tool (see the module docstring)."""

    name = "math_tools"
    chat, tool_format, stop_sequences = True, "json", ()

    def __init__(self, train_path=None, *, max_turns: int = 4, tools_prompt: str = "auto", **options):
        if not (isinstance(max_turns, int) and max_turns >= 1):
            raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
        if tools_prompt not in TOOLS_PROMPTS:
            raise ValueError(
                f"tools_prompt={tools_prompt!r} is not valid; choose one of: {', '.join(TOOLS_PROMPTS)}"
            )
        self.max_turns, self.tools_prompt = max_turns, tools_prompt
        self.tools = {
            "calculator": Tool("calculator", _calculator, "Evaluate an arithmetic expression.", CALCULATOR)
        }
        super().__init__(
            train_path, **options
        )  # builds the first prompt: a tokenizer without a template fails there
        self.version = f"{self.version}/tools-2"
        self._by_prompt: dict[str, Problem] | None = None

    def prompt(self, question: str) -> str:
        if not self._use_chat:
            raise ValueError(
                "math_tools needs a tokenizer with a chat template (a chat model's: --model PATH)"
            )
        return super().prompt(question)

    def render_messages(self, messages: list[dict]) -> str:
        return self.render_chat(messages)

    def verify_batch(self, problems, responses):
        """`math`'s verdicts on the model's own final turns (never a tool's answer)."""
        return super().verify_batch(
            problems, [self.final_turn(r) if isinstance(r, str) else r for r in responses]
        )

    def _problem(self, r) -> Problem:
        p = super()._problem(r)
        worked = {"expression": r.expression} if r.expression else {}
        return Problem(p.prompt, p.answer, {**p.meta, "messages": self.messages(r.question), **worked})

    def demonstration(self, problem: Problem) -> list[str]:
        """The assistant turns of a worked episode (vapo_lit.warmup): one calculator call on the
        problem's expression, then the answer in the form the verifier reads. Only problems that carry
        an expression (the built-in ones) have one."""
        expression = problem.meta.get("expression")
        if not expression:
            raise ValueError(
                "math_tools demonstrations need problems with a worked expression: the built-in problems "
                "(no train_path) have one, a data file's do not"
            )
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        return [f"<tool_call>\n{call}\n</tool_call>", f"The answer is \\boxed{{{problem.answer}}}."]

    def problem_from_prompt(self, prompt: str) -> Problem:
        if self._by_prompt is None:
            self._by_prompt = {self.prompt(r.question): self._problem(r) for r in self._train + self._eval}
        try:
            return self._by_prompt[prompt]
        except KeyError:
            raise ValueError("not a math_tools prompt") from None
