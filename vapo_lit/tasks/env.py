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

Tool calls have one syntax, ``call <tool> <args...>`` up to the stop sequence. Tools are pure
Python functions of (problem, args) the project controls: nothing the policy writes is executed,
only split on whitespace and looked up. A malformed call, an unknown tool, wrong arguments, or a
tool that raises give an observation saying so (``error ...``); nothing escapes into the rollout.

The episode's reward is the verifier's on the whole transcript (actions and observations, as the
engine decodes them): ``respond`` scores a final answer with :meth:`verify`, so the reward the
environment ends with and the one the trainer's score stage computes are the same number.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from vapo_lit.tasks.base import Problem, Task

CALL = "call"
"""The word that opens a tool call."""


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
    """The word after ``call``."""
    fn: Callable[[Problem, list], str]
    """(problem, argument words) -> observation text; raises ToolError on bad arguments."""
    doc: str = ""
    """One line: what it returns (a description for people; never shown to the policy)."""


class Environment(Task):
    """Base class of multi-turn tasks. Subclasses set `tools`, `max_turns`, `stop_sequences` and
    implement `problem_from_prompt` (the engine sees prompt text only) and the Task methods."""

    multi_turn = True
    max_turns: int = 8
    """Most policy turns per episode."""
    stop_sequences: tuple[str, ...] = ("?",)
    """Text that ends a policy turn as a tool call (EOS ends it as the final answer)."""
    tools: dict[str, Tool] = {}

    def problem_from_prompt(self, prompt: str) -> Problem:
        """The problem a prompt poses (raises ValueError for a prompt this task never writes)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- one environment step
    def respond(self, problem: Problem, transcript: str, turn: str, *, turns_done: int, final: bool) -> EnvStep:
        """Answer the policy's `turn` (its text, stop sequence included), the `turns_done`-th turn of
        the episode; `transcript` is the whole response so far, this turn included; `final` says the
        turn ended with EOS. Never raises: a failure inside the environment ends the episode with
        reward 0 and is reported by the verifier as usual."""
        try:
            if final:
                return EnvStep(done=True, reward=float(self.verify(problem, transcript).reward))
            if turns_done >= self.max_turns:
                return EnvStep(done=True, reward=0.0, truncated=True)
            return EnvStep(observation=self.call_tool(problem, turn))
        except Exception:  # noqa: BLE001 - an environment bug must not kill the rollout
            return EnvStep(done=True, reward=0.0)

    def call_tool(self, problem: Problem, turn: str) -> str:
        """The observation for a turn that ended at a stop sequence: the tool's answer or an error text."""
        words = turn.split()
        for stop in self.stop_sequences:
            if words and words[-1].endswith(stop):
                words[-1] = words[-1][: len(words[-1]) - len(stop)]
                if not words[-1]:
                    words.pop()
                break
        if CALL not in words:
            return self.error_text("malformed")
        at = len(words) - 1 - words[::-1].index(CALL)
        name, args = (words[at + 1], words[at + 2:]) if at + 1 < len(words) else (None, [])
        if name is None:
            return self.error_text("malformed")
        tool = self.tools.get(name)
        if tool is None:
            return self.error_text("unknown")
        try:
            return str(tool.fn(problem, args))
        except ToolError:
            return self.error_text("args")
        except Exception:  # noqa: BLE001 - a tool bug is an observation, never a crash
            return self.error_text("failed")

    def error_text(self, kind: str) -> str:
        """The observation for a failed call: kind is malformed, unknown, args or failed."""
        return {"malformed": "error malformed call", "unknown": "error unknown tool", "args": "error bad args",
                "failed": "error tool failed"}[kind]


def is_environment(task) -> bool:
    """Whether `task` is multi-turn (an environment answers between turns): the one test every
    caller uses. Read from the `multi_turn` attribute, so a task need not subclass Environment."""
    return bool(getattr(task, "multi_turn", False))
