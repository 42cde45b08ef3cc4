"""The environment contract: a multi-turn task whose episodes interleave policy turns and tool
observations (docs/algorithm.md "Multi-turn trajectories").

An :class:`Environment` is a :class:`~vapo_lit.tasks.base.Task` (prompts, tokenizer, verifier,
buckets) that also answers the policy between turns:

* a **policy turn** ends at a stop sequence (``stop_sequences``: a tool call) or at EOS (the
  final answer);
* :meth:`Environment.respond` turns it into an :class:`EnvStep`: observation text (tokenised by
  the engine and appended to the context, masked out of every loss) or the end of the episode with
  its reward;
* the episode also ends at the **turn limit** (``max_turns`` policy turns: a tool call on the last
  allowed turn ends it with reward 0, no observation) and at the **token budget** (``max_new_tokens``
  response tokens, actions and observations together; the row is then truncated, possibly inside
  an observation, and scored by the verifier like any response the length limit cut).

Tool calls come in one of two formats (``tool_format``): ``call``, the built-in tasks' ``call <tool>
<args...>`` up to the stop sequence (arguments split on whitespace), or ``json``, the format chat
models trained for tools write (Qwen2.5/Hermes style): ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``, its arguments checked against the tool's JSON schema (``Tool.parameters``),
which :meth:`Environment.tool_schemas` also hands to a chat template's ``tools=``. Tools are pure
Python functions of (problem, args) the project controls: nothing the policy writes is executed,
only parsed and looked up. A malformed call, an unknown tool, wrong arguments, or a tool that raises
give an observation saying so (``error ...``); nothing escapes into the rollout.

The episode's reward is the verifier's on the whole transcript (actions and observations, as the
engine decodes them): ``respond`` scores a final answer with :meth:`verify`, so the reward the
environment ends with and the one the trainer's score stage computes are the same number.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from vapo_lit.tasks.base import Problem, Task

CALL = "call"
"""The word that opens a tool call (tool_format "call")."""
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The tags around a JSON tool call (tool_format "json")."""
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
               "object": dict, "null": type(None)}


@dataclass(frozen=True)
class EnvStep:
    """What the environment answers to one policy turn."""

    observation: str | None = None
    """Text appended after the turn (None when the episode ends)."""
    done: bool = False
    """The episode is over."""
    reward: float | None = None
    """The outcome reward when `done` (0/1); None otherwise."""
    truncated: bool = False
    """The episode ended at the turn limit (not by a final answer)."""


class ToolError(ValueError):
    """Raised by a tool for arguments it does not accept; its message becomes the observation."""


@dataclass(frozen=True)
class Tool:
    """A pure function the policy may call by name."""

    name: str
    """The word after ``call`` (the ``name`` of a JSON call)."""
    fn: Callable[[Problem, list | dict], str]
    """(problem, arguments) -> observation text; raises ToolError on bad arguments. The arguments
    are the words after the name (tool_format "call") or the call's ``arguments`` object ("json")."""
    doc: str = ""
    """One line: what it returns (the function description a chat template shows with ``tools=``)."""
    parameters: dict | None = None
    """The arguments' JSON schema (an ``object`` schema: ``properties``, ``required``,
    ``additionalProperties``); checked before ``fn`` is called."""

    def schema(self) -> dict:
        """The tool as a chat template's ``tools=`` takes it (the OpenAI function format)."""
        return {"type": "function", "function": {"name": self.name, "description": self.doc,
                                                 "parameters": self.parameters or {"type": "object", "properties": {}}}}


class Environment(Task):
    """Base class of multi-turn tasks. Subclasses set `tools`, `max_turns`, `stop_sequences` and
    implement `problem_from_prompt` (the engine sees prompt text only) and the Task methods."""

    multi_turn = True
    max_turns: int = 8
    """Most policy turns per episode."""
    stop_sequences: tuple[str, ...] = ("?",)
    """Text that ends a policy turn as a tool call (EOS ends it as the final answer)."""
    tools: dict[str, Tool] = {}
    tool_format: str = "call"
    """How a turn writes a tool call: "call" (``call <tool> <args...>``) or "json" (``<tool_call>``
    tags around ``{"name": ..., "arguments": {...}}``; use ``stop_sequences = ("</tool_call>",)``)."""

    chat: bool = False
    """Observations go into the conversation as chat messages (role ``observation_role``) rendered
    by the tokenizer's chat template, exactly as the template renders the whole conversation; a turn
    ends at the template's end-of-turn token (an EOS id) or a stop sequence, and is a tool call when
    it holds one. Prompts are the template's rendering of ``prompt_messages(problem)``."""
    observation_role: str = "tool"
    """The role of an observation message (``user`` is used where the template has no tool role)."""

    def prompt_messages(self, problem: Problem) -> list[dict]:
        """The chat messages a prompt renders (chat environments): ``problem.meta["messages"]``."""
        return problem.meta["messages"]

    def has_call(self, turn: str) -> bool:
        """Whether `turn` holds a tool call in this environment's format."""
        return parse_json_call(turn) is not None if self.tool_format == "json" else CALL in turn.split()

    def tool_schemas(self) -> list[dict]:
        """The tools as a chat template's ``tools=`` takes them."""
        return [tool.schema() for tool in self.tools.values()]

    def problem_from_prompt(self, prompt: str) -> Problem:
        """The problem a prompt poses (raises ValueError for a prompt this task never writes)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- one environment step
    def respond(self, problem: Problem, transcript: str, turn: str, *, turns_done: int, final: bool) -> EnvStep:
        """Answer the policy's `turn` (its text, stop sequence included), the `turns_done`-th turn of
        the episode; `transcript` is the whole response so far, this turn included; `final` says the
        turn ended with EOS (in a chat environment, a turn that ended with EOS and holds a tool call
        is a call). Never raises: a failure inside the environment ends the episode with reward 0 and
        is reported by the verifier as usual."""
        try:
            if final and not (self.chat and self.has_call(turn)):
                return EnvStep(done=True, reward=float(self.verify(problem, transcript).reward))
            if turns_done >= self.max_turns:
                return EnvStep(done=True, reward=0.0, truncated=True)
            return EnvStep(observation=self.call_tool(problem, turn))
        except Exception:  # noqa: BLE001 - an environment bug must not kill the rollout
            return EnvStep(done=True, reward=0.0)

    def call_tool(self, problem: Problem, turn: str) -> str:
        """The observation for a turn that ended at a stop sequence: the tool's answer or an error text."""
        json_call = self.tool_format == "json"
        call = parse_json_call(turn) if json_call else self._words_call(turn)
        if call is None:
            return self.error_text("malformed")
        name, args = call
        tool = self.tools.get(name)
        if tool is None:
            return self.error_text("unknown")
        try:
            if json_call and tool.parameters is not None:
                check_arguments(tool.parameters, args)
            out = tool.fn(problem, args)
        except ToolError:
            return self.error_text("args")
        except Exception:  # noqa: BLE001 - a tool bug is an observation, never a crash
            return self.error_text("failed")
        return json.dumps(out) if json_call and not isinstance(out, str) else str(out)

    def _words_call(self, turn: str) -> tuple[str, list] | None:
        """(name, argument words) of the last ``call <tool> <args...>`` in `turn`, its stop sequence
        cut off; None when there is no ``call`` or no name after it."""
        words = turn.split()
        for stop in self.stop_sequences:
            if words and words[-1].endswith(stop):
                words[-1] = words[-1][: len(words[-1]) - len(stop)]
                if not words[-1]:
                    words.pop()
                break
        if CALL not in words:
            return None
        at = len(words) - 1 - words[::-1].index(CALL)
        return (words[at + 1], words[at + 2:]) if at + 1 < len(words) else None

    def error_text(self, kind: str) -> str:
        """The observation for a failed call: kind is malformed, unknown, args or failed."""
        return {"malformed": "error malformed call", "unknown": "error unknown tool", "args": "error bad args",
                "failed": "error tool failed"}[kind]


def parse_json_call(turn: str) -> tuple[str, dict] | None:
    """(name, arguments) of the last ``<tool_call>{...}</tool_call>`` in `turn` (the closing tag may
    be missing at the end of the text); None when there is none or it is not a JSON object with a
    string ``name`` and an object ``arguments`` (or a JSON string of one, as some models write)."""
    at = turn.rfind(TOOL_CALL_OPEN)
    if at < 0:
        return None
    body = turn[at + len(TOOL_CALL_OPEN):]
    body = body[: body.index(TOOL_CALL_CLOSE)] if TOOL_CALL_CLOSE in body else body
    try:
        call = json.loads(body)
        if not isinstance(call, dict):
            return None
        args = call.get("arguments", {})
        args = json.loads(args) if isinstance(args, str) else args
    except (ValueError, RecursionError):
        return None
    if not isinstance(call.get("name"), str) or not isinstance(args, dict):
        return None
    return call["name"], args


def check_arguments(schema: dict, args: dict) -> None:
    """Raise ToolError unless `args` fits the object `schema`: required keys present, no key the
    schema does not declare (unless ``additionalProperties`` allows it), each declared key of its
    ``type`` (JSON types; a bool is not an integer) and within its ``enum``."""
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        raise ToolError(f"missing argument(s) {', '.join(missing)}")
    extra = [k for k in args if k not in props]
    if extra and schema.get("additionalProperties", True) is False:
        raise ToolError(f"unknown argument(s) {', '.join(extra)}")
    for key, value in args.items():
        spec = props.get(key, {})
        kinds = spec.get("type")
        kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
        if kinds and not any(_is_json_type(value, k) for k in kinds):
            raise ToolError(f"argument {key} must be {' or '.join(kinds)}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolError(f"argument {key} must be one of {spec['enum']}")


def _is_json_type(value, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES.get(kind, object))


def is_environment(task) -> bool:
    """Whether `task` is multi-turn (an environment answers between turns): the one test every
    caller uses. Read from the `multi_turn` attribute, so a task need not subclass Environment."""
    return bool(getattr(task, "multi_turn", False))
