"""avg@k evaluation (the paper's: k samples per problem at temperature 1.0, top-p 0.7).

``eval/avg@k`` = mean over problems of the mean verifier reward over that problem's k samples.
"""
from __future__ import annotations

from collections import defaultdict

import torch


def as_engine(model_or_engine, tokenizer):
    """An engine as it is; a plain causal LM wrapped in the KV-cached `HFEngine`."""
    from vapo_lit.engines import HFEngine, RolloutEngine

    if isinstance(model_or_engine, RolloutEngine):
        return model_or_engine
    return HFEngine(model_or_engine, tokenizer)


@torch.no_grad()
def evaluate(model, task, problems, *, k: int = 8, sampling=None, temperature: float = 1.0, top_p: float = 0.7,
             max_new_tokens: int | None = None, batch_size: int = 256, seed: int = 0,
             tokenizer=None, return_samples: bool = False, shard: tuple[int, int] = (0, 1)) -> dict[str, float]:
    """Sample `k` responses per problem and score them with ``task.verify``.

    `model` is a rollout engine (`vapo_lit.engines`) or a plain HF causal LM (sampled with the
    KV-cached engine). `sampling` (a `SamplingParams`) overrides temperature / top_p /
    max_new_tokens. Returns (all floats):

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

    Samples are drawn in chunks of `batch_size` responses; sample j (problem j // k) is seeded
    with ``sample_seed(seed, j)``, so the result is a deterministic function of (model, problems,
    arguments) whatever the chunk size. With ``return_samples=True`` a second value is returned: a list of per-response dicts.

    `shard` = (rank, world): under data parallelism each rank samples and verifies a contiguous
    1/world of the samples and the per-sample results are gathered, so every rank returns the
    same metrics as a single process would.
    """
    from vapo_lit.distributed import gather_objects
    from vapo_lit.engines import SamplingParams
    from vapo_lit.rng import sample_seed

    problems = list(problems)
    if not problems:
        raise ValueError("no problems to evaluate")
    if k < 1:
        raise ValueError("k must be >= 1")
    engine = as_engine(model, tokenizer if tokenizer is not None else task.tokenizer)
    if sampling is None:
        sampling = SamplingParams(max_new_tokens=max_new_tokens or task.max_new_tokens, temperature=temperature,
                                  top_p=top_p)
    flat = [p for p in problems for _ in range(k)]
    rank, world = shard
    per_rank = -(-len(flat) // world)
    lo, hi = min(rank * per_rank, len(flat)), min((rank + 1) * per_rank, len(flat))
    records = []  # (reward, error?, strict or None, length, truncated, text) of samples lo..hi-1
    for i in range(lo, hi, batch_size):
        chunk = flat[i: min(i + batch_size, hi)]
        ro = engine.generate([p.prompt for p in chunk], sampling, [sample_seed(seed, j) for j in range(i, i + len(chunk))])
        chunk_lengths, chunk_truncated = ro.lengths.tolist(), ro.truncated.tolist()  # one device sync per chunk
        for j, (p, text) in enumerate(zip(chunk, ro.texts)):
            v = task.verify(p, text)
            records.append((float(v.reward) if v.error is None else 0.0, v.error is not None, v.strict,
                            int(chunk_lengths[j]), bool(chunk_truncated[j]), text))
    if world > 1:
        records = [r for part in gather_objects(records) for r in part]
    rewards = [r[0] for r in records]
    errors = sum(r[1] for r in records)
    any_strict = any(r[2] is not None for r in records)
    stricts = [1.0 if r[2] else 0.0 for r in records]
    lengths = [r[3] for r in records]
    truncs = [r[4] for r in records]
    texts = [r[5] for r in records]

    per_problem = defaultdict(list)
    by_bucket: dict[str, list[float]] = defaultdict(list)
    strict_pp = []
    distinct = []
    for pi, p in enumerate(problems):
        sl = slice(pi * k, (pi + 1) * k)
        score = sum(rewards[sl]) / k
        per_problem[pi] = score
        by_bucket[task.bucket(p)].append(score)
        strict_pp.append(sum(stricts[sl]) / k)
        distinct.append(len(set(texts[sl])))
    out = {f"eval/avg@{k}": sum(per_problem.values()) / len(problems)}
    names = list(task.bucket_names())
    names += sorted(b for b in by_bucket if b not in names)
    for b in names:
        if by_bucket.get(b):
            out[f"eval/avg@{k}/{b}"] = sum(by_bucket[b]) / len(by_bucket[b])
    if any_strict:
        out[f"eval/strict_avg@{k}"] = sum(strict_pp) / len(strict_pp)
    out["eval/response_length"] = sum(lengths) / len(lengths)
    out["eval/distinct_per_prompt"] = sum(distinct) / len(distinct)
    out["eval/verifier_errors"] = float(errors)
    out["eval/truncated_frac"] = sum(truncs) / len(truncs)
    correct_lengths = [n for n, r in zip(lengths, rewards) if r > 0]
    out["eval/correct_len_min"] = float(min(correct_lengths)) if correct_lengths else float("nan")
    out["eval/correct_len_max"] = float(max(correct_lengths)) if correct_lengths else float("nan")
    if return_samples:
        samples = [{"problem": flat[i], "text": texts[i], "reward": rewards[i], "strict": stricts[i],
                    "length": lengths[i], "truncated": truncs[i]} for i in range(len(flat))]
        return out, samples
    return out


def format_table(metrics: dict[str, float], task=None, *, k: int | None = None) -> str:
    """The per-bucket avg@k table (and the summary lines) as plain text."""
    if k is None:
        ks = [key.split("@")[1] for key in metrics if key.startswith("eval/avg@") and "/" not in key.split("@")[1]]
        k = int(ks[0]) if ks else 8
    prefix = f"eval/avg@{k}/"
    buckets = [key[len(prefix):] for key in metrics if key.startswith(prefix)]
    if task is not None:
        order = [b for b in task.bucket_names() if b in buckets]
        buckets = order + [b for b in buckets if b not in order]
    width = max([len("bucket"), len("overall")] + [len(b) for b in buckets])
    lines = [f"{'bucket':<{width}}  avg@{k}"]
    for b in buckets:
        lines.append(f"{b:<{width}}  {100 * metrics[prefix + b]:6.2f}%")
    lines.append(f"{'overall':<{width}}  {100 * metrics[f'eval/avg@{k}']:6.2f}%")
    for key in (f"eval/strict_avg@{k}", "eval/response_length", "eval/distinct_per_prompt",
                "eval/verifier_errors", "eval/truncated_frac", "eval/correct_len_min", "eval/correct_len_max"):
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
