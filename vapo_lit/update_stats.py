"""What the critic and actor updates measure, as typed statistics (the stages' own are in
vapo_lit/experience.py). Control code reads their fields; a metrics dict is built only by `log()`.

`MicroBatchSums` is how an update adds up its micro-batches: in float64, over mini-batches, epochs
and (by `reduce`, one all-reduce) ranks, so a statistic does not depend on how a mini-batch was cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from vapo_lit.distributed import all_reduce
from vapo_lit.experience import AdvantageStats, RolloutStats, ScoreStats, ValueStats


@dataclass
class MicroBatchSums:
    """Micro-batch statistics summed over an update, then reduced across ranks.

    * `weighted`: token-weighted means. A micro-batch's value counts by its share of its
      mini-batch's valid tokens, a ratio of exact token counts taken in float64 (a float32 share
      would make the logged means depend on how the mini-batch is cut into micro-batches, e.g.
      per rank under DDP).
    * `totals`: plain sums (a loss: each micro-batch adds its part of its mini-batch's loss).
    * `peaks`: maxima.
    Keys are declared up front (`declared`), so every rank reduces the same vector even where a
    rank saw no micro-batch; undeclared keys (a component's metrics) are added on first use.
    """

    weighted: dict[str, list[float]] = field(
        default_factory=dict
    )  # key -> [sum of value * share, sum of shares]
    totals: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)

    @classmethod
    def declared(cls, weighted=(), totals=(), peaks=()) -> "MicroBatchSums":
        return cls({k: [0.0, 0.0] for k in weighted}, dict.fromkeys(totals, 0.0), dict.fromkeys(peaks, 0.0))

    def add(self, share: float, weighted: dict, totals: dict, peaks: dict) -> None:
        """One micro-batch's values (floats or 0-dim tensors); `share` of its mini-batch's tokens."""
        for k, v in weighted.items():
            acc = self.weighted.setdefault(k, [0.0, 0.0])
            acc[0] += float(v) * share
            acc[1] += share
        for k, v in totals.items():
            self.totals[k] = self.totals.get(k, 0.0) + float(v)
        for k, v in peaks.items():
            self.peaks[k] = max(self.peaks.get(k, 0.0), float(v))

    def finite(self) -> bool:
        """Every total is finite (a NaN or inf, once in a sum, stays there)."""
        return all(math.isfinite(v) for v in self.totals.values())

    def reduce(self) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """(means, totals, peaks) over every rank: one float64 sum all-reduce and one max."""
        rows = [*self.weighted.values(), *([t, 0.0] for t in self.totals.values())]
        sums = all_reduce(torch.tensor(rows, dtype=torch.float64).view(-1, 2))  # (weighted + totals, 2)
        n = len(self.weighted)
        means = {k: float(s[0] / max(float(s[1]), 1e-12)) for k, s in zip(self.weighted, sums[:n])}
        totals = {k: float(s[0]) for k, s in zip(self.totals, sums[n:])}
        top = all_reduce(torch.tensor(list(self.peaks.values()), dtype=torch.float64), "max")
        return means, totals, dict(zip(self.peaks, top.tolist()))


@dataclass(frozen=True)
class CriticStats:
    loss: float
    """Value loss, mean over mini-batches (each summed over its micro-batches and ranks)."""
    grad_norm: float
    """Gradient norm before clipping, mean over mini-batches."""

    def log(self) -> dict[str, float]:
        return {"value/loss": self.loss, "value/grad_norm": self.grad_norm}


@dataclass(frozen=True)
class ActorStats:
    entropy: float
    clipfrac_low: float
    clipfrac_high: float
    approx_kl: float
    ratio_mean: float
    """The five above: token-weighted means over the update (MicroBatchSums.weighted)."""
    components: dict[str, float]
    """The components' loss-term metrics (e.g. policy/kl_initial), token-weighted likewise."""
    loss_policy: float
    loss_nll: float
    loss_total: float
    """The three losses: mean over mini-batches (each summed over its micro-batches and ranks)."""
    grad_norm: float
    """Gradient norm before clipping, mean over mini-batches."""
    ratio_max: float
    """Largest importance ratio of any token, any rank."""
    loss_share_by_length: dict[str, float] = field(default_factory=dict)
    """Response-length bucket -> its share of a mini-batch's policy-gradient weight sum_t w_t |A_t|,
    mean over the update's mini-batches (experience.loss_share_by_length; the same on every rank,
    which all hold the whole batch)."""

    MEANS = {
        "policy/entropy": "entropy",
        "policy/clipfrac_low": "clipfrac_low",
        "policy/clipfrac_high": "clipfrac_high",
        "policy/approx_kl": "approx_kl",
        "policy/ratio_mean": "ratio_mean",
    }
    LOSSES = {"loss/policy": "loss_policy", "loss/nll": "loss_nll", "loss/total": "loss_total"}
    PEAKS = {"policy/ratio_max": "ratio_max"}

    @classmethod
    def sums(cls) -> MicroBatchSums:
        """An empty accumulator for one actor update."""
        return MicroBatchSums.declared(weighted=cls.MEANS, totals=cls.LOSSES, peaks=cls.PEAKS)

    @classmethod
    def reduce(cls, sums: MicroBatchSums, grad_norms: list[float], shares: list[dict] = ()) -> "ActorStats":
        """The update's statistics over every rank; `grad_norms`: one per optimizer step (mini-batch),
        `shares`: each mini-batch's loss share by length (NaN ones, without any weight, skipped)."""
        means, totals, peaks = sums.reduce()
        steps = max(len(grad_norms), 1)
        by_length = {
            k: mean(s[k] for s in shares if math.isfinite(s[k])) for k in (shares[0] if shares else {})
        }
        return cls(
            **{f: means[k] for k, f in cls.MEANS.items()},
            components={k: v for k, v in means.items() if k not in cls.MEANS},
            **{f: totals[k] / steps for k, f in cls.LOSSES.items()},
            **{f: peaks[k] for k, f in cls.PEAKS.items()},
            grad_norm=mean(grad_norms),
            loss_share_by_length=by_length,
        )

    def log(self) -> dict[str, float]:
        return {
            **{k: getattr(self, f) for k, f in self.MEANS.items()},
            **self.components,
            **{k: getattr(self, f) for k, f in self.LOSSES.items()},
            "policy/grad_norm": self.grad_norm,
            **{k: getattr(self, f) for k, f in self.PEAKS.items()},
            **{f"policy/loss_share_len_{k}": v for k, v in self.loss_share_by_length.items()},
        }


@dataclass(frozen=True)
class SamplerStats:
    """The sampling engine's log-probs of its sampled tokens against the trainer's recomputation
    (whole batch, action tokens), when the behaviour log-probs are recomputed."""

    logprob_diff_mean: float
    """mean |log pi_trainer - log pi_sampler|."""
    logprob_diff_max: float
    """max |log pi_trainer - log pi_sampler|."""
    approx_kl: float
    """k3 estimate of KL(sampler || trainer) on the sampled tokens."""
    tis_weight_mean: float | None = None
    """Truncated importance sampling (ppo.tis_cap): mean weight min(pi_trainer / pi_sampler, cap)."""
    tis_capped_frac: float | None = None
    """... and the fraction of tokens whose weight the cap bounds."""

    def log(self) -> dict[str, float]:
        out = {
            "rollout/sampler_logprob_diff_mean": self.logprob_diff_mean,
            "rollout/sampler_logprob_diff_max": self.logprob_diff_max,
            "rollout/sampler_approx_kl": self.approx_kl,
        }
        if self.tis_weight_mean is not None:
            out.update(
                {
                    "rollout/tis_weight_mean": self.tis_weight_mean,
                    "rollout/tis_capped_frac": self.tis_capped_frac,
                }
            )
        return out


@dataclass(frozen=True)
class IterationStats:
    """One iteration's statistics, stage by stage (of the whole batch: every rank's responses)."""

    rollout: RolloutStats
    score: ScoreStats
    advantages: AdvantageStats
    components: dict[str, float]
    """What the components' `on_experience` hooks returned."""
    value: ValueStats | None
    """The critic against Monte-Carlo returns (docs/algorithm.md: in every row), and its own targets; None critic-free."""
    critic: CriticStats | None
    actor: ActorStats | None
    """None during value pretraining (the policy stays fixed)."""
    sampler: SamplerStats | None = None
    """The sampler against the trainer; None when the behaviour log-probs are not recomputed."""

    def log(self) -> dict[str, float]:
        out = {**self.rollout.log(), **self.score.log(), **self.advantages.log(), **self.components}
        for part in (self.value, self.critic, self.actor, self.sampler):
            if part is not None:
                out.update(part.log())
        return out


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")
