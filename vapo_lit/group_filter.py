"""DAPO's dynamic sampling as pure steps: which groups a batch keeps, and the pool they come from.

A group whose responses all score the same has a group-normalised advantage of exactly zero (GRPO,
DAPO): it adds no policy gradient and dilutes the token-level mean. DAPO (Yu et al. 2025, section
3.2) over-samples, drops those groups and samples again until the batch holds enough groups with
mixed scores. The module runs the loop (`VapoModule.rollout`); these functions decide:

    parts, sel = run_rounds(sample_round, k, target, max_rounds)  # sample_round(r): a scored round
    pool = concat_experiences(parts, pad_id)                       # every group sampled, in order
    batch = pool.select(group_rows(sel.kept, k, rank_share))       # (a rank's share of) the batch

Order and fill rule: the first `target` mixed groups in sampling order (round by round, prompt by
prompt); when the rounds are used up (the cap, DAPO's max_num_gen_batches) with fewer mixed groups,
the batch is filled with the earliest groups that scored the same, and the count is logged
(`rollout/dynamic_filled_groups`): the batch always holds `target` groups, so every step costs the
same optimizer work and the mini-batch arithmetic is unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


def group_is_mixed(scores: torch.Tensor, group_size: int) -> list[bool]:
    """(N,) scores of N / group_size adjacent groups -> per group, whether its scores differ."""
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: dynamic sampling needs groups of at least 2 responses "
            "(a group of one always scores the same)"
        )
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    g = scores.detach().reshape(-1, group_size)
    return (g.max(1).values != g.min(1).values).tolist()


@dataclass(frozen=True)
class Selection:
    """The groups a batch keeps out of a pool, by group index in sampling order."""

    kept: list[int]
    """`target` group indices (or all the pool holds, when smaller), ascending."""
    mixed: int
    """Mixed groups in the pool."""
    filled: int
    """Groups in `kept` whose scores were all the same (0 unless the pool had too few mixed ones)."""

    @property
    def enough(self) -> bool:
        return self.filled == 0


def select_groups(mixed: list[bool], target: int) -> Selection:
    """The first `target` mixed groups; if there are fewer, every mixed group and then the earliest
    uniform ones up to `target` (the fill rule; `filled` counts them)."""
    if target < 1:
        raise ValueError(f"target={target}: a batch needs at least one group")
    mixed_idx = [i for i, m in enumerate(mixed) if m]
    if len(mixed_idx) >= target:
        return Selection(mixed_idx[:target], len(mixed_idx), 0)
    fill = [i for i, m in enumerate(mixed) if not m][: target - len(mixed_idx)]
    return Selection(sorted(mixed_idx + fill), len(mixed_idx), len(fill))


def run_rounds(sample_round, group_size: int, target: int, max_rounds: int) -> tuple[list, Selection]:
    """DAPO's loop: `sample_round(r)` (r = 0, 1, ...) returns round r's scored groups (anything with
    `.scores`, N = groups x group_size, groups adjacent); rounds are sampled until the pool holds
    `target` mixed groups or `max_rounds` rounds are done. Returns (the rounds, the selection)."""
    if max_rounds < 1:
        raise ValueError(f"max_rounds={max_rounds}: at least the step's own round is sampled")
    parts, mixed = [], []
    for r in range(max_rounds):
        parts.append(sample_round(r))
        mixed += group_is_mixed(parts[-1].scores, group_size)
        sel = select_groups(mixed, target)
        if sel.enough:
            break
    return parts, sel


def group_rows(groups: list[int], group_size: int, part: slice = slice(None)) -> torch.Tensor:
    """The response rows of groups[part] (whole groups: a rank takes a contiguous share of groups)."""
    return torch.tensor(
        [g * group_size + j for g in groups[part] for j in range(group_size)], dtype=torch.long
    )


PROMPT_SIDE = {"prompt_ids": "pad", "prompt_mask": 0}
"""Left-padded fields of an Experience (the rest of its (N, R) tensors are right-padded)."""


def concat_experiences(parts: list, pad_id: int):
    """One Experience of the rows of `parts` in order: prompts re-padded on the left, responses on the
    right, to the widest part's. The parts hold the rollout and score stages (values and advantages
    are computed afterwards, on the batch that is kept)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    P = max(p.prompt_width for p in parts)
    R = max(p.mask.shape[1] for p in parts)
    out = {}
    for f in dataclasses.fields(first):
        values = [getattr(p, f.name) for p in parts]
        v = values[0]
        if f.name == "extras":
            if any(values):
                raise ValueError(
                    "concat_experiences: parts with extras (per-iteration component tensors) cannot be pooled"
                )
            out[f.name] = {}
        elif f.name == "group_size":
            if any(x != v for x in values):
                raise ValueError(f"concat_experiences: group sizes differ ({values})")
            out[f.name] = v
        elif v is None:
            if any(x is not None for x in values):
                raise ValueError(f"concat_experiences: {f.name} is set in some parts only")
            out[f.name] = None
        elif isinstance(v, list):
            out[f.name] = [x for part in values for x in part]
        elif f.name in PROMPT_SIDE:
            pad = pad_id if PROMPT_SIDE[f.name] == "pad" else PROMPT_SIDE[f.name]
            out[f.name] = torch.cat(
                [torch.nn.functional.pad(t, (P - t.shape[1], 0), value=pad) for t in values]
            )
        elif v.dim() == 2:
            pad = pad_id if f.name == "response_ids" else 0
            out[f.name] = torch.cat(
                [torch.nn.functional.pad(t, (0, R - t.shape[1]), value=pad) for t in values]
            )
        else:
            out[f.name] = torch.cat(values)
    return type(first)(**out)


@dataclass(frozen=True)
class DynamicStats:
    """One iteration's dynamic sampling, for the logs."""

    rounds: int
    """Sampling rounds (1: the step's own prompt batch was enough)."""
    groups_sampled: int
    mixed_groups: int
    kept_groups: int
    filled_groups: int
    """Uniform groups that filled the batch because the rounds ran out (the cap was hit)."""
    extra_tokens: float
    """Response tokens sampled but not kept (all ranks): added to perf/cumulative_tokens."""

    def log(self) -> dict[str, float]:
        return {
            "rollout/dynamic_rounds": float(self.rounds),
            "rollout/dynamic_groups_sampled": float(self.groups_sampled),
            "rollout/dynamic_mixed_frac": self.mixed_groups / max(self.groups_sampled, 1),
            "rollout/kept_groups_frac": self.kept_groups / max(self.groups_sampled, 1),
            "rollout/dynamic_filled_groups": float(self.filled_groups),
            "rollout/dynamic_cap_hit": float(self.filled_groups > 0),
            "rollout/dynamic_discarded_tokens": self.extra_tokens,
        }
