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
environment ends with and the one the trainer's score stage computes are the same number. A verifier
that must not read a tool's answer reads :meth:`Environment.final_turn` of the transcript (chat
environments): the model's own last turn.

Chat environments show their tools to the model as its chat template does (``tools=``); a template
with no tools block (it renders the same text with ``tools=`` as without) gets them in a system
message instead, in the Hermes/Qwen2.5 format (:func:`tools_system_text`), chosen by
``tools_prompt`` (``auto``, ``template`` or ``system``; :meth:`Environment.render_chat`).
"""

from __future__ import annotations

import json
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable

from vapo_lit.tasks.base import Problem, Task

CALL = "call"
"""The word that opens a tool call (tool_format "call")."""
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The tags around a JSON tool call (tool_format "json")."""
TOOLS_PROMPTS = ("auto", "template", "system")
_TOOLS_WARNED: set[tuple[str, str]] = set()
_TOOLS_WARNED_UNSAVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""The (task, tokenizer folder) pairs, and per in-memory tokenizer the tasks, already warned that the
tools go in a system message: one warning however many paths (prompts, episodes) render the chat."""
"""How a chat environment shows its tools: auto (the template's tools block when it has one, else a
system message), template (always ``tools=``) or system (always the system message)."""
_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


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
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.doc,
                "parameters": self.parameters or {"type": "object", "properties": {}},
            },
        }


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
    tools_prompt: str = "auto"
    """How the tools reach the model (chat environments, `render_chat`): one of TOOLS_PROMPTS."""

    def prompt_messages(self, problem: Problem) -> list[dict]:
        """The chat messages a prompt renders (chat environments): ``problem.meta["messages"]``."""
        return problem.meta["messages"]

    def has_call(self, turn: str) -> bool:
        """Whether `turn` holds a tool call in this environment's format."""
        return parse_json_call(turn) is not None if self.tool_format == "json" else CALL in turn.split()

    def parse_call(self, turn: str) -> tuple[str, list | dict] | None:
        """(tool name, arguments) of the call in `turn` in this environment's format; None when it holds none."""
        return parse_json_call(turn) if self.tool_format == "json" else self._words_call(turn)

    def tool_schemas(self) -> list[dict]:
        """The tools as a chat template's ``tools=`` takes them."""
        return [tool.schema() for tool in self.tools.values()]

    # ---------------------------------------------------------------- chat rendering
    def render_chat(self, messages: list[dict], *, tokenizer=None, add_generation_prompt: bool = True) -> str:
        """`messages` as the chat template renders them with this environment's tools: through the
        template's ``tools=`` or, where the template has no tools block (``tools_prompt`` auto) or
        ``tools_prompt`` is system, described in a system message (`tools_system_text`; appended to
        the conversation's own system message if it has one, else put before the first message, else,
        where the template refuses a system message, at the start of the first user message).
        `tokenizer`: the environment's own by default."""
        tok = self.tokenizer if tokenizer is None else tokenizer
        tools = self.tool_schemas()
        placement = self._tools_placement(tok, tools) if tools else "template"
        if placement == "template":
            return tok.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        return tok.apply_chat_template(
            with_tools_text(messages, tools_system_text(tools), placement),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def _tools_placement(self, tok, tools: list[dict]) -> str:
        """template, system or user (where the tools text goes), decided once per tokenizer."""
        cached = self.__dict__.get("_tools_placement_of")
        if cached is not None and cached[0] is tok:
            return cached[1]
        mode = self.tools_prompt
        if mode not in TOOLS_PROMPTS:
            raise ValueError(f"tools_prompt={mode!r} is not valid; choose one of: {', '.join(TOOLS_PROMPTS)}")
        if mode == "auto":
            mode = "template" if template_renders_tools(tok, tools) else "system"
            folder = getattr(tok, "name_or_path", "")
            warned = _TOOLS_WARNED if folder else _TOOLS_WARNED_UNSAVED.setdefault(tok, set())
            key = (self.name, folder) if folder else self.name
            if mode == "system" and key not in warned:
                warned.add(key)
                warnings.warn(
                    f"task {self.name!r}: the tokenizer's chat template has no tools block, so the tools are "
                    "described in a system message (tools_prompt=system; docs/guides/multi-turn.md)",
                    stacklevel=3,
                )
        if mode == "system":
            mode = system_placement(tok, tools_system_text(tools))
        self.__dict__["_tools_placement_of"] = (tok, mode)
        return mode

    def final_turn(self, response: str) -> str:
        """The model's own last turn of a chat environment's transcript `response` (as the engine
        decodes it, special tokens left out): the text after the last point where the chat template
        hands the turn back to the model (its generation prompt, e.g. ``assistant`` after
        ``<|im_start|>``); the whole response when no observation came. Empty when that turn holds a
        tool call (the episode ended without a final answer: truncated, or at the turn limit). A
        verifier that reads this never reads a tool's answer: every observation ends before the
        generation prompt that follows it (a template whose generation prompt is special tokens only
        shows no such point: an episode with a tool call then has no final turn, said once in a warning)."""
        marker = self.__dict__.get("_reply_marker")
        if marker is None:
            marker = self.__dict__["_reply_marker"] = reply_marker(self.tokenizer)
            if not marker:
                warnings.warn(
                    f"task {self.name!r}: the chat template's generation prompt is special tokens only, so a "
                    "decoded transcript does not show where the model's last turn starts; an episode with a "
                    "tool call has no final turn to verify (scores 0)",
                    stacklevel=2,
                )
        if not marker:
            return "" if self.has_call(response) else response
        at = response.rfind(marker)
        turn = response if at < 0 else response[at + len(marker) :]
        return "" if self.has_call(turn) else turn

    def problem_from_prompt(self, prompt: str) -> Problem:
        """The problem a prompt poses (raises ValueError for a prompt this task never writes)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- one environment step
    def respond(
        self, problem: Problem, transcript: str, turn: str, *, turns_done: int, final: bool
    ) -> EnvStep:
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
        call = self.parse_call(turn)
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
        return (words[at + 1], words[at + 2 :]) if at + 1 < len(words) else None

    def error_text(self, kind: str) -> str:
        """The observation for a failed call: kind is malformed, unknown, args or failed."""
        return {
            "malformed": "error malformed call",
            "unknown": "error unknown tool",
            "args": "error bad args",
            "failed": "error tool failed",
        }[kind]


def template_renders_tools(tokenizer, tools: list[dict]) -> bool:
    """Whether the tokenizer's chat template shows `tools` (renders a conversation differently with
    ``tools=`` than without); False for a template that refuses ``tools=``."""
    probe = [{"role": "user", "content": "\u2063probe\u2063"}]
    try:
        with_tools = tokenizer.apply_chat_template(
            probe, tools=tools, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - a template that raises on tools= has no tools block
        return False
    return with_tools != tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)


def tools_system_text(tools: list[dict]) -> str:
    """The tools as a system message describes them to a model whose template has no tools block:
    the Hermes / Qwen2.5 format (one JSON schema a line inside ``<tools></tools>``, then how to call
    one: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``)."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n{TOOL_CALL_OPEN}\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n' + TOOL_CALL_CLOSE
    )


def with_tools_text(messages: list[dict], text: str, placement: str) -> list[dict]:
    """`messages` with the tools `text` in a system message (placement system: appended to the first
    message's content when that is a system message, else a system message in front) or at the start
    of the first user message (placement user)."""
    out = [dict(m) for m in messages]
    if placement == "system":
        if out and out[0].get("role") == "system":
            out[0]["content"] = f"{out[0].get('content') or ''}\n\n{text}"
            return out
        return [{"role": "system", "content": text}, *out]
    for m in out:
        if m.get("role") == "user":
            m["content"] = f"{text}\n\n{m.get('content') or ''}"
            return out
    return [{"role": "user", "content": text}, *out]


def system_placement(tokenizer, text: str) -> str:
    """system when the template renders a system message (with its text), else user."""
    probe = [{"role": "user", "content": "q"}]
    try:
        rendered = tokenizer.apply_chat_template(
            with_tools_text(probe, text, "system"), tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - templates refuse a role they do not know by raising
        return "user"
    return "system" if text in rendered else "user"


def reply_marker(tokenizer) -> str:
    """The chat template's generation prompt as a decoded transcript shows it (special tokens left
    out, surrounding whitespace kept): what follows every observation of a chat episode."""
    probe = [{"role": "user", "content": "q"}]
    try:
        full = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        bare = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - no chat template: no generation prompt to find
        return ""
    prompt = full[len(bare) :] if full.startswith(bare) else full
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return text if text.strip() else ""


def parse_json_call(turn: str) -> tuple[str, dict] | None:
    """(name, arguments) of the last ``<tool_call>{...}</tool_call>`` in `turn` (the closing tag may
    be missing at the end of the text); None when there is none or it is not a JSON object with a
    string ``name`` and an object ``arguments`` (or a JSON string of one, as some models write)."""
    at = turn.rfind(TOOL_CALL_OPEN)
    if at < 0:
        return None
    body = turn[at + len(TOOL_CALL_OPEN) :]
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
