"""`math`: question/answer problems read from local JSONL or parquet files, final answers verified.

Built-in problems
    Without ``train_path`` the task runs on a built-in set (`vapo_lit.tasks.wordproblems`): 512
    train and 64 eval arithmetic word problems with integer answers, generated in code from a seed
    (no download), at ``level`` ``multi-step`` (default: two to four steps) or ``one-step`` (one
    operation). ``eval_path`` and ``eval_fraction`` do not apply to it, nor ``level`` to files.

Data files
    ``.jsonl`` / ``.ndjson`` (one JSON object per line; blank lines are skipped) or ``.parquet`` /
    ``.pq`` (read with pandas, which needs ``pyarrow`` or ``fastparquet``). Each record has a
    question field and an answer field (names configurable). The answer may be a GSM8K-style worked
    solution ending in ``#### 42`` (the text after the last ``####`` is the ground truth), a
    ``\\boxed{...}`` answer, or a bare answer (string or number). Every problem in a file is checked
    at construction: a missing file, an unknown extension, an empty file, a line that is not JSON or
    not an object, a missing/empty/non-string field, or a ``####`` with nothing after it raises
    ``ValueError`` naming the file, the line (JSONL) or row (parquet, 1-based), and what was expected.

Train/eval split
    With ``eval_path`` the eval set is that file, and training questions equal to an eval question
    are dropped. Without it, the distinct questions of ``train_path`` are shuffled with ``seed`` and
    ``eval_fraction`` of them (at least one) are held out; duplicates of a question always land on
    the same side, so eval never overlaps train.

Prompts
    If the tokenizer has a chat template, the question plus an instruction to put the final answer
    in ``\\boxed{}`` is rendered with ``apply_chat_template(..., tokenize=False,
    add_generation_prompt=True)``; otherwise the prompt is ``"Question: ...\\nAnswer:"``.

Buckets
    By question length (``bucket_by="question"``, default) or by the length of the reference
    solution in the answer field (``bucket_by="solution"``: for GSM8K-style data, a proxy for the
    number of reasoning steps), both in characters. ``n_buckets`` (default 3) quantile buckets over
    all loaded problems, labelled ``qlen<lo>-<hi>`` / ``slen<lo>-<hi>`` and ordered shortest first.

Verifier
    With the plain prompt, a response is cut at its first ``"\nQuestion:"`` (a base model that
    goes on with a made-up question has finished its answer there). Then
    `vapo_lit.tasks.answers` (extraction, exact/numeric match in-process, symbolic equivalence via
    math-verify's LaTeX path in worker processes under a per-call deadline; see its docstring for
    the safety analysis). Timeouts and checker exceptions come back as ``Verdict.error``.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from vapo_lit.tasks import register, wordproblems
from vapo_lit.tasks.answers import DEFAULT_TIMEOUT_S, CheckerPool, check_batch, reference_answer
from vapo_lit.tasks.base import Problem, Task, Verdict

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class Record:
    question: str
    solution: str
    """The answer field as given (worked solution or bare answer)."""
    answer: str
    """The final answer extracted from `solution`."""
    source: str
    """``path:line`` (JSONL) or ``path:row`` (parquet) of the record."""
    expression: str | None = None
    """An arithmetic expression whose value is the answer (the built-in problems have one): the worked
    solution of a demonstration (`math_tools`' `demonstration`)."""


def _expected(qf: str, af: str) -> str:
    return f"a JSON object with string fields {qf!r} and {af!r}"


def _field_value(value: Any, name: str, where: str, qf: str, af: str) -> str:
    if isinstance(value, bool) or value is None or (isinstance(value, float) and math.isnan(value)):
        raise ValueError(
            f"{where}: field {name!r} must be a string or a number, got {value!r} "
            f"(expected {_expected(qf, af)})"
        )
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)  # a float parquet column holding 4.0 means the answer 4
    if isinstance(value, (int, float)):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: field {name!r} must be a string or a number, got "
            f"{type(value).__name__} (expected {_expected(qf, af)})"
        )
    if not value.strip():
        raise ValueError(f"{where}: field {name!r} is empty (expected {_expected(qf, af)})")
    return value


def _make_record(obj: dict, where: str, source: str, qf: str, af: str) -> Record:
    for name in (qf, af):
        if name not in obj:
            found = ", ".join(repr(k) for k in list(obj)[:20]) or "none"
            raise ValueError(
                f"{where}: missing field {name!r} (expected {_expected(qf, af)}; found fields: {found})"
            )
    question = _field_value(obj[qf], qf, where, qf, af).strip()
    solution = _field_value(obj[af], af, where, qf, af)
    answer = reference_answer(solution)
    if not answer:
        raise ValueError(
            f"{where}: field {af!r} has no final answer (nothing after '####' or "
            f"in '\\boxed{{}}'); expected a solution ending in '#### <answer>', a "
            f"\\boxed{{<answer>}} or a bare answer"
        )
    return Record(question=question, solution=solution.strip(), answer=answer, source=source)


def _load_jsonl(path: Path, qf: str, af: str) -> list[Record]:
    records = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"data file {path}, line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{where}: not valid UTF-8 ({e.reason} at byte {e.start}); "
                    f"expected UTF-8 text, one JSON object per line"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{where}: invalid JSON ({e.msg} at column {e.colno}); expected "
                    f"one JSON object per line, {_expected(qf, af)}"
                ) from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected {_expected(qf, af)}, got a JSON {type(obj).__name__}")
            records.append(_make_record(obj, where, f"{path}:{lineno}", qf, af))
    return records


def _load_parquet(path: Path, qf: str, af: str) -> list[Record]:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except ImportError as e:
        raise ValueError(
            f"data file {path}: reading parquet needs pyarrow or fastparquet (pip install pyarrow): {e}"
        ) from None
    except Exception as e:  # noqa: BLE001  (pyarrow raises its own types)
        raise ValueError(
            f"data file {path}: cannot read as parquet ({type(e).__name__}: {e}); "
            f"expected a parquet table with columns {qf!r} and {af!r}"
        ) from None
    for name in (qf, af):
        if name not in df.columns:
            found = ", ".join(repr(str(c)) for c in list(df.columns)[:20]) or "none"
            raise ValueError(
                f"data file {path}: missing column {name!r} (expected columns {qf!r} "
                f"and {af!r}; found columns: {found})"
            )
    records = []
    for i, (q, a) in enumerate(zip(df[qf].tolist(), df[af].tolist()), 1):
        where = f"data file {path}, row {i}"
        records.append(_make_record({qf: q, af: a}, where, f"{path}:row{i}", qf, af))
    return records


def load_records(
    path: str | os.PathLike, question_field: str = "question", answer_field: str = "answer"
) -> list[Record]:
    """All records of a data file, validated; `ValueError` with file and line on any defect."""
    p = Path(path)
    expected = (
        f"a .jsonl file (one JSON object per line) or a .parquet file with fields "
        f"{question_field!r} and {answer_field!r}"
    )
    if not p.exists():
        raise ValueError(f"data file {p}: file not found; expected {expected}")
    if not p.is_file():
        raise ValueError(f"data file {p}: not a regular file; expected {expected}")
    suffix = p.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        records = _load_jsonl(p, question_field, answer_field)
    elif suffix in PARQUET_SUFFIXES:
        records = _load_parquet(p, question_field, answer_field)
    else:
        raise ValueError(
            f"data file {p}: unknown extension {p.suffix!r}; expected {expected} "
            f"(extensions {', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)})"
        )
    if not records:
        raise ValueError(f"data file {p}: no records (empty file); expected {expected}")
    return records


def builtin_records(split: str, level: str = "multi-step") -> list[Record]:
    """The built-in problems of `split` at `level` (vapo_lit.tasks.wordproblems) as records."""
    return [
        Record(
            question=r["question"],
            solution=r["answer"],
            answer=r["answer"],
            source=f"builtin:{split}:{i}",
            expression=r["expression"],
        )
        for i, r in enumerate(wordproblems.problems(split, level=level), 1)
    ]


def load_tokenizer(tokenizer):
    """A tokenizer object as is, or `AutoTokenizer` from a local directory (no download)."""
    if tokenizer is None:
        raise ValueError(
            "the math task needs a tokenizer: run it on a local model (--model PATH hands its "
            "tokenizer over), or give task option tokenizer (a local directory holding one)"
        )
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if not path.is_dir():
            raise ValueError(
                f"tokenizer path {path}: not a local directory (nothing is downloaded; "
                f"expected a directory saved with save_pretrained)"
            )
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # noqa: BLE001
            raise ValueError(
                f"tokenizer path {path}: cannot load a tokenizer ({type(e).__name__}: {e})"
            ) from None
    if not callable(getattr(tokenizer, "decode", None)):
        raise ValueError(
            f"tokenizer must be a transformers tokenizer or a local path, got {type(tokenizer).__name__}"
        )
    return tokenizer


def _math_verify_version() -> str:
    try:
        from importlib.metadata import version

        return version("math-verify")
    except Exception:  # noqa: BLE001
        return "unknown"


def split_records(
    train_path,
    eval_path,
    question_field: str,
    answer_field: str,
    eval_fraction: float,
    seed: int,
    level: str | None = None,
) -> tuple[list, list, bool]:
    """(train, eval, built-in?): the built-in problems at `level` without a train file; the files'
    records with an eval file (its questions left out of train); else the train file split by question."""
    if level is not None:
        wordproblems.check_level(level)
    if train_path is None:
        if eval_path is not None:
            raise ValueError(
                "eval_path needs train_path (without train_path the built-in problems are used, "
                "with their own eval set)"
            )
        level = level or "multi-step"
        train, evals = builtin_records("train", level), builtin_records("eval", level)
    elif eval_path is not None and level is None:
        train = load_records(train_path, question_field, answer_field)
        evals = load_records(eval_path, question_field, answer_field)
        eval_questions = {r.question for r in evals}
        train = [r for r in train if r.question not in eval_questions]
        if not train:
            raise ValueError(
                f"data file {train_path}: every question also appears in the eval "
                f"file {eval_path}; nothing left to train on"
            )
    elif level is not None:
        raise ValueError(
            f"level={level!r} applies to the built-in problems only; drop it, or drop train_path "
            f"to run on them"
        )
    else:
        train = load_records(train_path, question_field, answer_field)
        distinct = list(dict.fromkeys(r.question for r in train))
        if len(distinct) < 2:
            raise ValueError(
                f"data file {train_path}: {len(distinct)} distinct question(s); "
                f"need at least 2 to split train/eval (or pass eval_path)"
            )
        rng = random.Random(f"vapo-lit/math/split/{seed}")
        rng.shuffle(distinct)
        n_eval = min(len(distinct) - 1, max(1, round(eval_fraction * len(distinct))))
        eval_questions = set(distinct[:n_eval])
        order = {q: i for i, q in enumerate(distinct)}
        evals = sorted((r for r in train if r.question in eval_questions), key=lambda r: order[r.question])
        train = [r for r in train if r.question not in eval_questions]
    return train, evals, train_path is None


@register("math")
class MathTask(Task):
    """Problems from local data files, verified on the final answer (see module docstring)."""

    name = "math"

    def __init__(
        self,
        train_path: str | os.PathLike | None = None,
        eval_path: str | os.PathLike | None = None,
        tokenizer=None,
        question_field: str = "question",
        answer_field: str = "answer",
        eval_fraction: float = 0.1,
        seed: int = 0,
        bucket_by: str = "question",
        n_buckets: int = 3,
        max_eval: int | None = None,
        max_new_tokens: int = 1024,
        instruction: str = DEFAULT_INSTRUCTION,
        verify_timeout: float = DEFAULT_TIMEOUT_S,
        verify_workers: int = 1,
        level: str | None = None,
    ):
        if bucket_by not in ("question", "solution"):
            raise ValueError(f"bucket_by must be 'question' or 'solution', got {bucket_by!r}")
        if not (isinstance(n_buckets, int) and n_buckets >= 1):
            raise ValueError(f"n_buckets must be a positive integer, got {n_buckets!r}")
        if eval_path is None and not (0.0 < eval_fraction < 1.0):
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
        if verify_timeout <= 0:
            raise ValueError(f"verify_timeout must be > 0, got {verify_timeout!r}")
        self.version = f"1/math-verify-{_math_verify_version()}"
        self.max_new_tokens = int(max_new_tokens)
        self.bucket_by = bucket_by
        self.instruction = instruction
        self.verify_timeout = float(verify_timeout)
        self.verify_workers = int(verify_workers)
        self.seed = seed

        train, evals, builtin = split_records(
            train_path, eval_path, question_field, answer_field, eval_fraction, seed, level
        )
        if builtin:
            self.version += f"/builtin-{wordproblems.VERSION}" + (
                "" if level in (None, "multi-step") else f"-{level}"
            )
        if max_eval is not None:
            evals = evals[: int(max_eval)]
        self._train, self._eval = train, evals

        self._tokenizer = load_tokenizer(tokenizer)
        self._use_chat = bool(getattr(self._tokenizer, "chat_template", None))
        self._prompts: dict[str, str] = {}
        self._edges, self._bucket_names = self._make_buckets(n_buckets)
        self._pool: CheckerPool | None = None
        self._pool_lock = threading.Lock()
        try:  # a broken chat template fails here, before any training
            self.prompt(self._train[0].question)
        except Exception as e:  # noqa: BLE001
            raise ValueError(
                f"cannot build a prompt with the tokenizer's chat template ({type(e).__name__}: {e})"
            ) from None

    # ---------------------------------------------------------------- tokenizer and prompts
    @property
    def tokenizer(self):
        return self._tokenizer

    def prompt(self, question: str) -> str:
        cached = self._prompts.get(question)
        if cached is not None:
            return cached
        if self._use_chat:
            text = self.render_messages(self.messages(question))
            if not isinstance(text, str):
                raise TypeError(f"apply_chat_template returned {type(text).__name__}, not str")
        else:
            text = f"Question: {question}\nAnswer:"
        self._prompts[question] = text
        return text

    def messages(self, question: str) -> list[dict]:
        """The chat messages of a question's prompt: the question, then the instruction."""
        return [
            {"role": "user", "content": f"{question}\n{self.instruction}" if self.instruction else question}
        ]

    def render_messages(self, messages: list[dict]) -> str:
        """A prompt's chat messages as the tokenizer's chat template renders them."""
        return self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # ---------------------------------------------------------------- buckets
    def _length(self, question: str, solution: str) -> int:
        return len(question) if self.bucket_by == "question" else len(solution)

    def _make_buckets(self, n_buckets: int) -> tuple[list[int], list[str]]:
        lengths = sorted(self._length(r.question, r.solution) for r in self._train + self._eval)
        cuts = sorted({lengths[(k * len(lengths)) // n_buckets] for k in range(1, n_buckets)})
        cuts = [c for c in cuts if c > lengths[0]]
        los = [lengths[0]] + cuts
        his = [c - 1 for c in cuts] + [lengths[-1]]
        width = len(str(lengths[-1]))
        prefix = "qlen" if self.bucket_by == "question" else "slen"
        names = [f"{prefix}{lo:0{width}d}-{hi:0{width}d}" for lo, hi in zip(los, his)]
        return cuts, names

    def _bucket_of_length(self, length: int) -> str:
        for name, cut in zip(self._bucket_names, self._edges):
            if length < cut:
                return name
        return self._bucket_names[-1]

    def bucket(self, problem: Problem) -> str:
        if "bucket" in problem.meta:
            return str(problem.meta["bucket"])
        return self._bucket_of_length(int(problem.meta.get("length", 0)))

    def bucket_names(self) -> list[str]:
        return list(self._bucket_names)

    # ---------------------------------------------------------------- problems
    def _problem(self, r: Record) -> Problem:
        length = self._length(r.question, r.solution)
        return Problem(
            prompt=self.prompt(r.question),
            answer=r.answer,
            meta={"source": r.source, "length": length, "bucket": self._bucket_of_length(length)},
        )

    @property
    def n_train(self) -> int:
        return len(self._train)

    @property
    def n_eval(self) -> int:
        return len(self._eval)

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        """`n` training problems: seeded shuffles of the train set, one epoch after another."""
        rng = random.Random(f"vapo-lit/math/train/{seed}")
        out: list[Problem] = []
        while len(out) < n:
            order = list(range(len(self._train)))
            rng.shuffle(order)
            out += [self._problem(self._train[i]) for i in order[: n - len(out)]]
        return out

    def eval_problems(self) -> list[Problem]:
        return [self._problem(r) for r in self._eval]

    def train_records(self) -> list[Record]:
        return list(self._train)

    def eval_records(self) -> list[Record]:
        return list(self._eval)

    # ---------------------------------------------------------------- verifier
    def _checker_pool(self) -> CheckerPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = CheckerPool(size=self.verify_workers)
            return self._pool

    def __getstate__(self):  # picklable (e.g. for spawned dataloader workers): no processes, no lock
        state = dict(self.__dict__)
        state["_pool"] = None
        del state["_pool_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()

    def verify(self, problem: Problem, response: str) -> Verdict:
        return self.verify_batch([problem], [response])[0]

    def verify_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """Verdicts for many responses; symbolic checks are spread over the worker pool."""
        if len(problems) != len(responses):
            raise ValueError(f"{len(problems)} problems but {len(responses)} responses")
        if not self._use_chat:  # plain format: a model that goes on with a new "Question:" has
            # finished its answer there; a later "Answer:" belongs to a question it made up
            responses = [r.split("\nQuestion:", 1)[0] if isinstance(r, str) else r for r in responses]
        try:
            return check_batch(
                [p.answer for p in problems],
                responses,
                pool=self._checker_pool(),
                timeout=self.verify_timeout,
            )
        except Exception as e:  # noqa: BLE001  (check_batch does not raise; belt and braces)
            return [Verdict(0.0, error=f"exception: {type(e).__name__}: {e}")] * len(problems)

    def close(self) -> None:
        """Stop the checker worker processes (they also stop when this process exits)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
