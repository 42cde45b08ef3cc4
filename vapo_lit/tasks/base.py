"""The task contract: seeded prompts, a tokenizer and a verifier (response text -> 0/1).

A task never trusts a response: `verify` must not raise on any text and must never execute it.
A verifier *failure* (an exception inside the checking code, a timeout) is reported through
`Verdict.error` so that it is counted apart (`rollout/verifier_errors`), never silently scored as
a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One prompt with its ground truth."""

    prompt: str
    """Text given to the policy (chat template already applied where the task uses one)."""
    answer: str
    """Ground-truth final answer, as text."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Task-specific facts (difficulty, bucket label, ...); logged, never shown to the policy."""


@dataclass(frozen=True)
class Verdict:
    """What the verifier says of one response."""

    reward: float
    """0.0 or 1.0 (sparse outcome reward on the last response token)."""
    error: str | None = None
    """Set when the verifier itself failed (exception, timeout); reward is then 0.0."""
    strict: bool | None = None
    """Independent correctness check beside the reward (e.g. every chain step right), or None."""


class Task:
    """Base class of a task. Subclasses set the attributes and implement the methods."""

    name: str = "base"
    version: str = "0"
    """Recorded in the run card (docs/algorithm.md: 'verifier version')."""
    max_new_tokens: int = 256
    """Default response-length limit for this task."""

    @property
    def tokenizer(self):  # -> transformers.PreTrainedTokenizerBase
        raise NotImplementedError

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        """`n` training problems, a pure function of `seed`."""
        raise NotImplementedError

    def eval_problems(self) -> list[Problem]:
        """The fixed evaluation set (never overlaps what `train_problems` gives for any seed)."""
        raise NotImplementedError

    def verify(self, problem: Problem, response: str) -> Verdict:
        """Score one response. Must never raise and never execute the response."""
        raise NotImplementedError

    def verify_batch(self, problems: list[Problem], responses: list[str]) -> list[Verdict]:
        """Score many responses (tasks with a checker pool override this to run them in parallel)."""
        return [self.verify(p, r) for p, r in zip(problems, responses)]

    def bucket(self, problem: Problem) -> str:
        """Difficulty/length bucket label of a problem (for per-bucket pass rates)."""
        return "all"

    def bucket_names(self) -> list[str]:
        """All bucket labels, easiest (shortest) first."""
        return ["all"]
