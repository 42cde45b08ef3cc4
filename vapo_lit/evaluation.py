"""avg@k evaluation (the paper's: k samples per problem at temperature 1.0, top-p 0.7).

``eval/avg@k`` = mean over problems of the mean verifier reward over that problem's k samples.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch


def as_engine(model_or_engine, tokenizer, task=None):
    """An engine as it is; a plain causal LM wrapped in the KV-cached `HFEngine` (in the episode
    loop for a multi-turn `task`)."""
    from vapo_lit.engines import RolloutEngine, make_engine

    if isinstance(model_or_engine, RolloutEngine):
        return model_or_engine
    return make_engine("hf", model_or_engine, tokenizer, task=task)


@dataclass(frozen=True)
class Sample:
    """One evaluation response and its verdict."""

    problem: object
    text: str
    reward: float
    """The verifier's reward (0 when it failed)."""
    error: bool
    """The verifier failed (scored 0, counted apart)."""
    strict: bool | None
    """The task's independent check, None when the task has none."""
    length: int
    """Response tokens, EOS included."""
    truncated: bool
    segments: tuple | None = None
    """A multi-turn episode's runs of action and observation tokens, (is_action, start, end, text)
    each (`vapo_lit.rollout.response_segments`); None single-turn."""


@torch.no_grad()
def evaluate(model, task, problems, *, k: int = 8, **options) -> dict[str, float]:
    """Sample `k` responses per problem, score them with ``task.verify`` and summarise (all floats):

    * ``eval/avg@k``: mean over problems of the mean reward over its k samples;
    * ``eval/avg@k/<bucket>``: the same within each of ``task.bucket_names()`` (buckets without
      problems are omitted);
    * ``eval/strict_avg@k``: the same with the task's independent check (``Verdict.strict``);
      only when the task provides it (a verdict with ``strict=None`` counts as not strict);
    * ``eval/response_length``: mean response tokens (EOS included);
    * ``eval/distinct_per_prompt``: mean number of distinct response texts among the k;
    * ``eval/verifier_errors``: number of verdicts with ``error`` set (scored 0, counted apart);
    * ``eval/truncated_frac``: share of responses that hit the length limit;
    * ``eval/correct_len_min`` / ``eval/correct_len_max``: shortest / longest rewarded response
      in tokens (NaN when none).
    The arguments are `sample_responses`' (`options`: sampling, temperature, top_p, max_new_tokens,
    batch_size, seed, tokenizer, shard); for the samples or the typed `EvalStats`, call it, then
    `summarize`.
    """
    return summarize(task, problems, sample_responses(model, task, problems, k=k, **options), k).log()


@torch.no_grad()
def sample_responses(
    model,
    task,
    problems,
    *,
    k: int = 8,
    sampling=None,
    temperature: float = 1.0,
    top_p: float = 0.7,
    max_new_tokens: int | None = None,
    batch_size: int = 256,
    seed: int = 0,
    tokenizer=None,
    shard: tuple[int, int] = (0, 1),
) -> list[Sample]:
    """`k` verified samples per problem (problem j's are samples j*k .. j*k + k - 1).

    `model` is a rollout engine (`vapo_lit.engines`) or a plain HF causal LM (sampled with the
    KV-cached engine). `sampling` (a `SamplingParams`) overrides temperature / top_p /
    max_new_tokens. Samples are drawn in chunks of `batch_size` responses; sample j is seeded with
    ``sample_seed(seed, j)``, so the result is a deterministic function of (model, problems,
    arguments) whatever the chunk size. `shard` = (rank, world): under data parallelism each rank
    samples and verifies a contiguous 1/world of the samples and they are gathered, so every rank
    returns what a single process would.
    """
    from vapo_lit.distributed import gather_objects
    from vapo_lit.engines import SamplingParams
    from vapo_lit.rng import sample_seed

    problems = list(problems)
    if not problems:
        raise ValueError("no problems to evaluate")
    if k < 1:
        raise ValueError(f"k={k} is not valid: k must be >= 1")
    tokenizer = tokenizer if tokenizer is not None else task.tokenizer
    engine = as_engine(model, tokenizer, task=task)
    if sampling is None:
        sampling = SamplingParams(
            max_new_tokens=max_new_tokens or task.max_new_tokens, temperature=temperature, top_p=top_p
        )
    flat = [p for p in problems for _ in range(k)]
    rank, world = shard
    per_rank = -(-len(flat) // world)
    lo, hi = min(rank * per_rank, len(flat)), min((rank + 1) * per_rank, len(flat))
    samples = []
    for i in range(lo, hi, batch_size):
        chunk = flat[i : min(i + batch_size, hi)]
        seeds = [sample_seed(seed, j) for j in range(i, i + len(chunk))]
        samples += verified_chunk(engine, task, tokenizer, chunk, sampling, seeds)
    return [s for part in gather_objects(samples) for s in part] if world > 1 else samples


def verified_chunk(engine, task, tokenizer, chunk: list, sampling, seeds: list[int]) -> list[Sample]:
    """One chunk of `sample_responses`: one response per problem of `chunk` (each with its seed),
    verified by the task."""
    from vapo_lit.rollout import response_segments

    ro = engine.generate([p.prompt for p in chunk], sampling, seeds)
    # response length = the policy's own tokens (a multi-turn episode's observations left out)
    action = getattr(ro, "action_mask", None)
    lengths = (ro.lengths if action is None else action.sum(1).long()).tolist()
    truncated = ro.truncated.tolist()  # one device sync per chunk
    turns = (
        [None] * len(chunk)
        if action is None
        else [
            tuple(response_segments(tokenizer, ids, act, n))
            for ids, act, n in zip(ro.response_ids.tolist(), action.tolist(), ro.lengths.tolist())
        ]
    )
    samples = []
    for p, text, n, cut, segments in zip(chunk, ro.texts, lengths, truncated, turns):
        v = task.verify(p, text)
        samples.append(
            Sample(
                p,
                text,
                float(v.reward) if v.error is None else 0.0,
                v.error is not None,
                v.strict,
                int(n),
                bool(cut),
                segments,
            )
        )
    return samples


@dataclass(frozen=True)
class EvalStats:
    """avg@k and what comes with it (each explained in `evaluate`); `log()` gives the eval/... metrics."""

    k: int
    avg: float
    by_bucket: dict[str, float]
    """Bucket -> avg@k within it, in the task's bucket order; buckets without problems left out."""
    strict_avg: float | None
    """None when the task has no independent check."""
    response_length: float
    distinct_per_prompt: float
    verifier_errors: int
    truncated_frac: float
    correct_len_min: float
    correct_len_max: float

    def log(self) -> dict[str, float]:
        k = self.k
        out = {f"eval/avg@{k}": self.avg, **{f"eval/avg@{k}/{b}": v for b, v in self.by_bucket.items()}}
        if self.strict_avg is not None:
            out[f"eval/strict_avg@{k}"] = self.strict_avg
        out.update(
            {
                "eval/response_length": self.response_length,
                "eval/distinct_per_prompt": self.distinct_per_prompt,
                "eval/verifier_errors": float(self.verifier_errors),
                "eval/truncated_frac": self.truncated_frac,
                "eval/correct_len_min": self.correct_len_min,
                "eval/correct_len_max": self.correct_len_max,
            }
        )
        return out


def summarize(task, problems, samples: list[Sample], k: int) -> EvalStats:
    """The statistics of `samples` (k per problem, in problem order; see `evaluate`)."""
    problems = list(problems)
    per_problem = [samples[i * k : (i + 1) * k] for i in range(len(problems))]
    scores = [sum(s.reward for s in group) / k for group in per_problem]
    by_bucket: dict[str, list[float]] = defaultdict(list)
    for p, score in zip(problems, scores):
        by_bucket[task.bucket(p)].append(score)
    names = list(task.bucket_names())
    names += sorted(b for b in by_bucket if b not in names)
    strict = None
    if any(s.strict is not None for s in samples):
        per = [sum(1.0 if s.strict else 0.0 for s in group) / k for group in per_problem]
        strict = sum(per) / len(per)
    correct = [s.length for s in samples if s.reward > 0]
    return EvalStats(
        k=k,
        avg=sum(scores) / len(problems),
        strict_avg=strict,
        by_bucket={b: sum(by_bucket[b]) / len(by_bucket[b]) for b in names if by_bucket.get(b)},
        response_length=sum(s.length for s in samples) / len(samples),
        distinct_per_prompt=sum(len({s.text for s in group}) for group in per_problem) / len(problems),
        verifier_errors=sum(s.error for s in samples),
        truncated_frac=sum(s.truncated for s in samples) / len(samples),
        correct_len_min=float(min(correct)) if correct else float("nan"),
        correct_len_max=float(max(correct)) if correct else float("nan"),
    )


def format_table(metrics: dict[str, float], task=None, *, k: int | None = None) -> str:
    """The per-bucket avg@k table (and the summary lines) as plain text."""
    if k is None:
        ks = [
            key.split("@")[1]
            for key in metrics
            if key.startswith("eval/avg@") and "/" not in key.split("@")[1]
        ]
        k = int(ks[0]) if ks else 8
    prefix = f"eval/avg@{k}/"
    buckets = [key[len(prefix) :] for key in metrics if key.startswith(prefix)]
    if task is not None:
        order = [b for b in task.bucket_names() if b in buckets]
        buckets = order + [b for b in buckets if b not in order]
    width = max([len("bucket"), len("overall")] + [len(b) for b in buckets])
    lines = [f"{'bucket':<{width}}  avg@{k}"]
    for b in buckets:
        lines.append(f"{b:<{width}}  {100 * metrics[prefix + b]:6.2f}%")
    lines.append(f"{'overall':<{width}}  {100 * metrics[f'eval/avg@{k}']:6.2f}%")
    for key in (
        f"eval/strict_avg@{k}",
        "eval/response_length",
        "eval/distinct_per_prompt",
        "eval/verifier_errors",
        "eval/truncated_frac",
        "eval/correct_len_min",
        "eval/correct_len_max",
    ):
        if key in metrics:
            lines.append(f"{key} = {metrics[key]:.4g}")
    return "\n".join(lines)


def eval_subset(task, n: int | None) -> list:
    """The first n eval problems of each bucket in turn (round robin), so a subset still covers
    every length bucket evenly; all of them when n is None."""
    problems = task.eval_problems()
    if not n or n >= len(problems):
        return problems
    by_bucket: dict[str, list] = {}
    for pr in problems:
        by_bucket.setdefault(task.bucket(pr), []).append(pr)
    queues = [by_bucket[b] for b in task.bucket_names() if b in by_bucket]
    out, i = [], 0
    while len(out) < n:
        q = queues[i % len(queues)]
        j = i // len(queues)
        if j < len(q):
            out.append(q[j])
        i += 1
    return out
