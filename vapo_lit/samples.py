"""What the model wrote: a few episodes of every iteration and of every evaluation, in the run
folder's `samples.jsonl`, in W&B and, if asked, on the terminal.

Each line of `samples.jsonl` is one episode, a JSON object:

* ``iteration``, ``ppo_update``: where the run stood (the row of metrics.csv with that ``step``);
  ``phase``: ``train`` (a rollout; ``value_pretraining`` true during that phase) or ``eval``;
  ``index``: the response's row in the iteration's batch, or the sample's number in the evaluation;
* ``prompt``, ``response``: the texts as the engine decoded them (special tokens left out; a
  multi-turn episode's response holds its observations too);
* ``reward``, ``verdict`` (``reward``, ``error``: the verifier's failure or null, ``strict``: the
  task's independent check or null), ``truncated``, ``response_tokens`` (the policy's own tokens);
* multi-turn episodes also ``observations`` (``start``, ``end``: response token columns, ``text``)
  and ``tool_calls`` (``text``: the turn an observation answered, with the ``name`` and
  ``arguments`` of the call it holds, null where it holds none the environment could parse).

`samples_per_iteration` episodes per iteration and per evaluation (0: no file), spread evenly over
the batch (whole prompt groups apart; nothing is drawn at random, so a run samples and trains
exactly as without them). With W&B on, the same rows are logged as the table ``samples``, one per
iteration, stepped on ``ppo/update``. `print_sample_every` N prints the first of every Nth
iteration's episodes. On resume, lines past the checkpoint's iteration are dropped (a line a crash
cut short too, with a warning) and the run appends from there, as metrics.csv does. Every text goes
through `vapo_lit.masking.mask_secrets`. Only rank 0 writes.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from vapo_lit.rollout import response_segments
from vapo_lit.sample_lines import read_lines
from vapo_lit.masking import mask_secrets

FILE = "samples.jsonl"
COLUMNS = (
    "iteration",
    "ppo_update",
    "phase",
    "index",
    "prompt",
    "response",
    "reward",
    "error",
    "strict",
    "truncated",
    "response_tokens",
    "tool_calls",
    "observations",
)
"""The W&B table's columns (tool_calls and observations as JSON text, empty single-turn)."""


def spread(n: int, limit: int) -> list[int]:
    """`limit` of `n` positions, evenly spaced from the first (all of them when limit >= n)."""
    return list(range(n)) if limit >= n else [i * n // limit for i in range(limit)]


def episode_row(
    task,
    *,
    iteration: int,
    ppo_update: int,
    phase: str,
    index: int,
    prompt: str,
    response: str,
    reward: float,
    error,
    strict,
    truncated: bool,
    tokens: int,
    segments=None,
    pretraining=False,
) -> dict:
    """One line of samples.jsonl (module doc); `segments`: a multi-turn episode's
    `response_segments`, None single-turn."""
    row = {
        "iteration": int(iteration),
        "ppo_update": int(ppo_update),
        "phase": phase,
        "index": int(index),
        "prompt": mask_secrets(prompt),
        "response": mask_secrets(response),
        "reward": float(reward),
        "verdict": {
            "reward": float(reward),
            "error": None if error is None else mask_secrets(str(error)),
            "strict": strict,
        },
        "truncated": bool(truncated),
        "response_tokens": int(tokens),
    }
    if pretraining:
        row["value_pretraining"] = True
    if segments is not None:
        segments = list(segments)
        parse = getattr(task, "parse_call", None)
        row["observations"] = [
            {"start": a, "end": b, "text": mask_secrets(text)}
            for is_action, a, b, text in segments
            if not is_action
        ]
        calls = []
        for (is_action, _, _, text), after in zip(segments, segments[1:]):
            if is_action and not after[0]:  # a turn the environment answered
                call = parse(text) if callable(parse) else None
                calls.append(
                    {
                        "text": mask_secrets(text),
                        "name": call[0] if call else None,
                        "arguments": json.loads(mask_secrets(json.dumps(call[1]))) if call else None,
                    }
                )
        row["tool_calls"] = calls
    return row


def experience_rows(
    exp, task, tokenizer, *, iteration: int, ppo_update: int, limit: int, pretraining: bool = False
) -> list[dict]:
    """`limit` episodes of an iteration's `Experience` (scored), spread over its rows."""
    rows = []
    for i in spread(exp.n, limit):
        verdict = exp.verdicts[i] if exp.verdicts is not None else None
        segments = None
        if exp.obs_mask is not None:
            n = int(exp.lengths[i])
            segments = response_segments(tokenizer, exp.response_ids[i].tolist(), exp.mask[i].tolist(), n)
        rows.append(
            episode_row(
                task,
                iteration=iteration,
                ppo_update=ppo_update,
                phase="train",
                index=i,
                prompt=exp.problems[i].prompt,
                response=exp.texts[i],
                reward=float(exp.scores[i]) if exp.scores is not None else float("nan"),
                error=getattr(verdict, "error", None),
                strict=getattr(verdict, "strict", None),
                truncated=bool(exp.truncated[i]),
                tokens=int(exp.mask[i].sum()),
                segments=segments,
                pretraining=pretraining,
            )
        )
    return rows


def eval_rows(result, task, *, limit: int) -> list[dict]:
    """`limit` of an evaluation's samples (`EvalResult.samples`), spread over them (k per problem:
    different problems)."""
    samples = list(result.samples)
    # the base policy's eval (before the first update) is metrics.csv's row 0, even after a cached
    # pretrained critic moved the iteration on
    iteration = 0 if result.ppo_update == 0 else result.iteration
    return [
        episode_row(
            task,
            iteration=iteration,
            ppo_update=result.ppo_update,
            phase="eval",
            index=i,
            prompt=s.problem.prompt,
            response=s.text,
            reward=s.reward,
            error="verifier failed" if s.error else None,
            strict=s.strict,
            truncated=s.truncated,
            tokens=s.length,
            segments=s.segments,
        )
        for i in spread(len(samples), limit)
        for s in (samples[i],)
    ]


def table_row(row: dict) -> list:
    """A samples.jsonl row as a row of the W&B table (COLUMNS)."""
    v = row["verdict"]
    multi = {
        k: json.dumps(row[k], ensure_ascii=False) if k in row else "" for k in ("tool_calls", "observations")
    }
    return [
        row["iteration"],
        row["ppo_update"],
        row["phase"],
        row["index"],
        row["prompt"],
        row["response"],
        row["reward"],
        v["error"],
        v["strict"],
        row["truncated"],
        row["response_tokens"],
        multi["tool_calls"],
        multi["observations"],
    ]


def format_row(row: dict, prompt_chars: int = 400) -> str:
    """A row as a few lines for the terminal: a header, the prompt's end, the response."""
    prompt = row["prompt"]
    if len(prompt) > prompt_chars:
        prompt = "…" + prompt[-prompt_chars:]
    calls = f" · {len(row['tool_calls'])} tool call(s)" if "tool_calls" in row else ""
    head = (
        f"--- sample: iteration {row['iteration']} · ppo {row['ppo_update']} · {row['phase']} · "
        f"reward {row['reward']:g}{calls} ---"
    )
    return f"{head}\nprompt: {prompt}\nresponse: {row['response']}\n"


# ----------------------------------------------------------------------------- the file
class SamplesFile:
    """samples.jsonl, appended crash-consistently: each batch of lines is one write, fsynced."""

    def __init__(self, path, keep_until: int | None):
        self.path = Path(path)
        if keep_until is None or not self.path.is_file():
            self.path.unlink(missing_ok=True)  # a fresh run (train() refuses an old run's folder unless told)
            return
        lines, dropped = read_lines(self.path)
        if dropped:
            warnings.warn(
                f"{self.path}: dropped {dropped}, cut by a crash or a full disk; the run resumes from its last "
                "checkpoint and writes that iteration's samples again",
                RuntimeWarning,
                stacklevel=2,
            )
        kept = [line for line in lines if json.loads(line)["iteration"] <= keep_until]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


class SampleLog(Callback):
    """Writes each iteration's and each evaluation's episodes (module doc): the base policy's eval
    before the first iteration, then after each iteration its rollout's episodes and those of the
    eval it ran. Placed before the checkpoint callback, so a checkpoint never holds an iteration whose
    samples are not on disk."""

    def __init__(
        self, run_dir, per_iteration: int, print_every: int = 0, keep_until: int | None = None, stream=None
    ):
        self.run_dir, self.per_iteration, self.print_every = Path(run_dir), per_iteration, print_every
        self.keep_until, self.stream = keep_until, stream
        self.file: SamplesFile | None = None
        self.on = False
        self._written_eval = None  # the last EvalResult whose samples were written

    @property
    def out(self):
        return self.stream or sys.stdout

    def on_train_start(self, trainer, pl_module) -> None:
        self.on = trainer.is_global_zero and bool(self.per_iteration or self.print_every)
        if trainer.is_global_zero and self.per_iteration:
            self.file = SamplesFile(self.run_dir / FILE, self.keep_until)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.on:  # the base policy's eval, run when training started
            self._write(trainer, self._eval_rows(pl_module), getattr(pl_module.last_eval, "ppo_update", 0))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.on:
            return
        exp = outputs.get("experience") if isinstance(outputs, dict) else None
        due = bool(self.print_every) and pl_module.iteration % self.print_every == 0
        rows = []
        if exp is not None and (self.per_iteration or due):
            pretraining = bool(
                pl_module.last_metrics.get("train/value_pretraining", 0.0)
            )  # the row just logged
            rows = experience_rows(
                exp,
                pl_module.task,
                pl_module.tokenizer,
                iteration=pl_module.iteration,
                ppo_update=pl_module.ppo_updates,
                limit=max(1, self.per_iteration),
                pretraining=pretraining,
            )
        if due and rows:
            self.out.write(
                ("\n" if getattr(self.out, "isatty", lambda: False)() else "") + format_row(rows[0])
            )
            self.out.flush()
        if not self.per_iteration:
            return
        self._write(trainer, rows + self._eval_rows(pl_module), pl_module.ppo_updates)

    def _eval_rows(self, pl_module) -> list[dict]:
        ev = getattr(pl_module, "last_eval", None)
        if ev is None or ev is self._written_eval or not self.per_iteration or not ev.samples:
            return []
        self._written_eval = ev
        return eval_rows(ev, pl_module.task, limit=self.per_iteration)

    def _write(self, trainer, rows: list[dict], ppo_update: int) -> None:
        if not rows or self.file is None:
            return
        self.file.append(rows)
        for logger in trainer.loggers:
            log = getattr(logger, "log_samples", None)
            if callable(log):
                log(list(COLUMNS), [table_row(r) for r in rows], ppo_update)
