"""The built-in multi-turn task "toolchain": the countdown chain of `chain`, with each step's addend
hidden behind a tool the policy must call.

Prompt (word tokens)::

    chain <x0> from <n>: key <a> <b> <c>

The step rule is ``v_k = (v_{k+1} + d_k) mod 10`` (``v_{n+1} = x0``), where the addend ``d_k`` is a
hash of the key and k: the policy cannot compute it, it must ask the ``look`` tool. A correct
episode (``|`` separates turns; ``[...]`` is what the environment writes)::

    call look 3: ?  [= 7]  3: 1 call look 2: ?  [= 0]  2: 1 call look 1: ?  [= 5]  1: 6 => 6 <eos>

n + 1 policy turns, 8n + 3 response tokens (2n of them observations). The reward is 1 iff the
transcript ends with ``=> <v_1>`` (the outcome); ``Verdict.strict`` is the exact canonical
transcript (every tool called, every value right). A guessed answer is right one time in ten.

Imperfect demonstrations (the SFT data of the built-in base policy): on each step the demonstrator
skips the tool with probability ``demo_skip_prob`` and writes a guessed digit instead (the chain
then continues from the guess). Skipping is the one mistake RL has to remove; it is drawn with a
large probability (> 0.3) so that evaluation's top-p 0.7 keeps it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass
from functools import cached_property

from vapo_lit.tasks import register
from vapo_lit.tasks.base import Problem, Verdict
from vapo_lit.tasks.chain import ARROW, BOS, EOS, PAD, UNK, ChainTask, build_tokenizer
from vapo_lit.tasks.env import CALL, Environment, Tool, ToolError

STOP = "?"
OBS_WORDS = ["=", "error", "malformed", "unknown", "tool", "bad", "args", "failed", "call"]


@dataclass(frozen=True)
class ToolChainConfig:
    """Shape of the built-in multi-turn task."""

    min_n: int = 2
    """Fewest chain steps (n + 1 policy turns)."""
    max_n: int = 6
    """Most chain steps."""
    key_digits: int = 3
    """Digits of the per-problem key that the hidden addends hash (10^key_digits tables)."""
    eval_fraction: float = 0.25
    """Share of the (x0, n, key) prompt space reserved for evaluation (hash split)."""
    eval_per_bucket: int = 32
    """Evaluation problems per n (fixed order)."""
    max_turns: int = 0
    """Turn limit; 0 means max_n + 2 (one spare turn past a correct episode)."""
    max_new_tokens: int = 0
    """Token budget of a whole episode (actions + observations); 0 means 8 * max_n + 16."""
    demo_skip_prob: float = 0.4
    """Demonstrator: probability of skipping the tool on a step and guessing the value."""


def addend(key: str, k: int) -> int:
    """The hidden d_k of a key: what `look k:` returns."""
    return hashlib.sha256(f"vapo-lit/toolchain/{key}/{k}".encode()).digest()[0] % 10


@register("toolchain")
class ToolChainTask(ChainTask, Environment):
    name = "toolchain"
    version = "1"
    stop_sequences = (STOP,)
    sft_overrides = {"steps": 1500}
    """The built-in base policy's SFT (vapo_lit.models.builtin): the addition mod 10 of two context
    digits is learnt only after several hundred steps (the measurements: docs/results/agentic/index.md,
    "How it was made")."""

    def __init__(self, config: ToolChainConfig | None = None, **overrides):
        cfg = config or ToolChainConfig()
        if overrides:
            cfg = ToolChainConfig(**{**asdict(cfg), **overrides})
        if not (1 <= cfg.min_n <= cfg.max_n):
            raise ValueError(f"need 1 <= min_n <= max_n, got {cfg.min_n}, {cfg.max_n}")
        if not 1 <= cfg.key_digits <= 6:
            raise ValueError(f"key_digits must be in [1, 6], got {cfg.key_digits}")
        if not 0.0 <= cfg.demo_skip_prob <= 1.0:
            raise ValueError(f"demo_skip_prob must be in [0, 1], got {cfg.demo_skip_prob}")
        self.config = cfg
        self.max_turns = cfg.max_turns or cfg.max_n + 2
        self.max_new_tokens = cfg.max_new_tokens or 8 * cfg.max_n + 16
        self.tools = {"look": Tool("look", self._look, "look <k:> -> '= d_k', the hidden addend of step k")}
        self._bucket_names = [f"n{n}" for n in range(cfg.min_n, cfg.max_n + 1)]

    # ---------------------------------------------------------------- tokenizer
    def vocab(self) -> list[str]:
        return (
            [PAD, BOS, EOS, UNK, "chain", "from", ARROW, "key", "look", STOP]
            + OBS_WORDS
            + [str(d) for d in range(10)]
            + [f"{k}:" for k in range(1, self.config.max_n + 1)]
        )

    @cached_property
    def tokenizer(self):
        return build_tokenizer(list(dict.fromkeys(self.vocab())))

    # ---------------------------------------------------------------- problems
    def values_of(self, x0: int, n: int, key: str) -> list[int]:
        out, v = [], x0
        for k in range(n, 0, -1):
            v = (v + addend(key, k)) % 10
            out.append(v)
        return out

    def make_problem(self, x0: int, n: int, key: str) -> Problem:  # type: ignore[override]
        vals = self.values_of(x0, n, key)
        return Problem(
            prompt=f"chain {x0} from {n}: key {' '.join(key)}",
            answer=str(vals[-1]),
            meta={"x0": x0, "n": n, "key": key, "bucket": f"n{n}"},
        )

    def problem_from_prompt(self, prompt: str) -> Problem:
        w = prompt.split()
        ok = (
            len(w) == 5 + self.config.key_digits
            and w[0] == "chain"
            and w[2] == "from"
            and w[4] == "key"
            and w[1].isdigit()
            and len(w[1]) == 1
            and w[3].endswith(":")
            and w[3][:-1].isdigit()
            and all(len(d) == 1 and d.isdigit() for d in w[5:])
        )
        n = int(w[3][:-1]) if ok else -1
        if not ok or not self.config.min_n <= n <= self.config.max_n:
            raise ValueError(f"not a toolchain prompt: {prompt[:80]!r}")
        return self.make_problem(int(w[1]), n, "".join(w[5:]))

    def _is_eval(self, x0: int, n: int, key: str) -> bool:
        h = hashlib.sha256(f"vapo-lit/toolchain/split/{x0}/{n}/{key}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64 < self.config.eval_fraction

    def _random_key(self, rng: random.Random) -> str:
        return "".join(str(rng.randrange(10)) for _ in range(self.config.key_digits))

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"vapo-lit/toolchain/train/{seed}")
        out = []
        while len(out) < n:
            x0, steps, key = (
                rng.randrange(10),
                rng.randint(self.config.min_n, self.config.max_n),
                self._random_key(rng),
            )
            if not self._is_eval(x0, steps, key):
                out.append(self.make_problem(x0, steps, key))
        return out

    def eval_problems(self) -> list[Problem]:
        out = []
        for n in range(self.config.min_n, self.config.max_n + 1):
            rng, got = random.Random(f"vapo-lit/toolchain/eval/{n}"), []
            while len(got) < self.config.eval_per_bucket:
                x0, key = rng.randrange(10), self._random_key(rng)
                if self._is_eval(x0, n, key) and (x0, key) not in got:
                    got.append((x0, key))
            out += [self.make_problem(x0, n, key) for x0, key in got]
        return out

    def is_eval_prompt(self, x0: int, n: int, key: str = "0") -> bool:  # type: ignore[override]
        return self._is_eval(x0, n, key)

    def bucket(self, problem: Problem) -> str:
        return f"n{int(problem.meta['n'])}"

    # ---------------------------------------------------------------- the tool
    def _look(self, problem: Problem, args: list) -> str:
        if len(args) != 1 or not args[0].endswith(":") or not args[0][:-1].isdigit():
            raise ToolError("look takes one counter, e.g. 'look 3:'")
        k = int(args[0][:-1])
        if not 1 <= k <= int(problem.meta["n"]):
            raise ToolError(f"step {k} is not in this chain")
        return f"= {addend(problem.meta['key'], k)}"

    # ---------------------------------------------------------------- verifier
    def _verify(self, problem: Problem, response: str) -> Verdict:
        if not isinstance(response, str) or len(response) > 100_000:
            return Verdict(0.0, strict=False)
        words = response.split()
        ok = (
            len(words) >= 2 and words[-2] == ARROW and words[-1] == problem.answer and words.count(ARROW) == 1
        )
        return Verdict(1.0 if ok else 0.0, strict=ok and words == self.solution(problem).split())

    # ---------------------------------------------------------------- demonstrations
    def solution(self, problem: Problem) -> str:
        return " ".join(text for text, _ in self.solution_spans(problem))

    def solution_spans(self, problem: Problem) -> list[tuple[str, bool]]:
        """The correct episode as (text, is_action) spans."""
        return self._spans(problem, lambda k: False, random.Random(0))

    def demonstration_spans(self, problem: Problem, rng: random.Random) -> list[tuple[str, bool]]:
        """One imperfect demonstration as (text, is_action) spans (EOS not included)."""
        p = self.config.demo_skip_prob
        return self._spans(problem, lambda k: rng.random() < p, rng)

    def _spans(self, problem: Problem, skip, rng: random.Random) -> list[tuple[str, bool]]:
        x0, n, key = int(problem.meta["x0"]), int(problem.meta["n"]), problem.meta["key"]
        spans, pending, v = [], [], x0
        for k in range(n, 0, -1):
            if skip(k):
                v = rng.randrange(10)
            else:
                spans += [
                    (" ".join(pending + [CALL, "look", f"{k}:", STOP]), True),
                    (f"= {addend(key, k)}", False),
                ]
                pending = []
                v = (v + addend(key, k)) % 10
            pending += [f"{k}:", str(v)]
        spans.append((" ".join(pending + [ARROW, str(v)]), True))
        return spans
