"""Probes and naive references for the wiring tests (test_stages, test_components, test_updates).

`probe_run(tmp, components, **delta)` trains tiny random models for an iteration or two through
the real `train()` (a Lightning `Trainer.fit` with the component callbacks) and records:

* every iteration's `Experience` as the stages filled it (captured when the rollout hands it over:
  the stages fill that same object), with the actor's and critic's weights before its updates;
* every optimizer step: which model, the learning rate, the weights before the step, the
  gradients it applies (after clipping), via Lightning's `on_before_optimizer_step`, and the rows
  of the Experience its micro-batches took (`Experience.select` calls since the previous step);
* every time the rollout engine is handed the actor's weights;
* the logged metric rows.

The references below recompute what a stage or an update should have produced, with plain loops
and the column convention written out (the state before response token t is the prefix ending at
column P + t - 1), never with the project's own helpers.
"""

from __future__ import annotations

import copy
import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from vapo_lit.build import build_module
from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.tasks.base import Verdict
from vapo_lit.train import train

N = 16
"""Responses per iteration in every probe run (one mini-batch of 16, four micro-batches of 4)."""

BASE = {
    "model": "random",
    "wandb": "disabled",
    "steps": 1,
    "eval_every": 0,
    "eval_k": 1,
    "eval_problems": 2,
    "checkpoint_every": 100,
    "ppo": {
        "responses_per_step": N,
        "mini_batch_size": N,
        "micro_batch_size": 4,
        "ppo_epochs": 1,
        "actor_lr": 1e-3,
        "critic_lr": 1e-3,
    },
}


def coin(text: str) -> float:
    """A deterministic fake verdict: about half of all texts are 'correct' (mixed outcomes, so the
    critic targets, the positive set and the groups all have contrast, even for random models)."""
    return float(hashlib.sha256(text.encode()).digest()[0] % 2)


@dataclass
class Iteration:
    exp: object
    pretraining: bool
    actor: dict
    critic: dict
    problems: list


@dataclass
class Step:
    model: str  # "actor" or "critic"
    iteration: int
    lr: float
    weights: dict
    grads: dict
    rows: list
    """The Experience rows the step's micro-batches selected (its mini-batch), sorted."""


class Probe(Callback):
    """See the module doc. Reads the module; changes nothing."""

    def __init__(self):
        self.iterations: list[Iteration] = []
        self.steps: list[Step] = []
        self.weight_loads: list[int] = []  # the iteration of every engine.load_weights call
        self.module = None
        self._selected: list[int] = []  # rows selected since the last optimizer step

    def setup(self, trainer, pl_module, stage):
        self.module = pl_module
        rollout = pl_module.rollout

        def recording_rollout(problems):
            exp = rollout(problems)
            select = exp.select

            def recording_select(idx, trim=False):
                self._selected.extend(idx.tolist())
                return select(idx, trim=trim)

            exp.select = recording_select
            self.iterations.append(
                Iteration(
                    exp,
                    pl_module.pretrain.active,
                    _weights(pl_module.actor),
                    _weights(pl_module.critic),
                    list(problems),
                )
            )
            return exp

        pl_module.rollout = recording_rollout
        load_weights = pl_module.engine.load_weights

        def recording_load_weights(actor):
            self.weight_loads.append(len(self.iterations) - 1)
            load_weights(actor)

        pl_module.engine.load_weights = recording_load_weights

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        first = optimizer.param_groups[0]["params"][0]
        model = pl_module.actor if any(first is p for p in pl_module.actor.parameters()) else pl_module.critic
        name = "actor" if model is pl_module.actor else "critic"
        grads = {
            n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()
        }
        rows, self._selected = sorted(self._selected), []
        self.steps.append(
            Step(
                name, len(self.iterations) - 1, optimizer.param_groups[0]["lr"], _weights(model), grads, rows
            )
        )

    def of(self, model: str, iteration: int | None = None) -> list[Step]:
        return [s for s in self.steps if s.model == model and (iteration is None or s.iteration == iteration)]


def _weights(model) -> dict:
    return {} if model is None else {n: p.detach().clone() for n, p in model.named_parameters()}


@dataclass
class ProbeRun:
    probe: Probe
    rows: list
    cfg: RunConfig

    @property
    def module(self):
        return self.probe.module

    @property
    def last(self) -> dict:
        """The last logged row, as floats (empty cells left out)."""
        return {k: float(v) for k, v in self.rows[-1].items() if v != ""}

    def row(self, iteration: int) -> dict:
        (r,) = [r for r in self.rows if r["step"] == str(iteration)]
        return {k: float(v) for k, v in r.items() if v != ""}


def probe_run(
    tmp: Path, components, *, verifier=coin, prepare=None, name: str = "probe", **delta
) -> ProbeRun:
    """One short real run (smoke preset shrunk further: BASE, then `delta`) with a `Probe` attached;
    `verifier(text) -> reward` replaces the task's (None keeps the task's own); `prepare(module)`
    may adjust the freshly built models."""
    cfg = merge(RunConfig(), PRESETS["smoke"])
    cfg = merge(cfg, BASE)
    cfg = merge(
        cfg,
        {
            "out_dir": str(tmp / "runs"),
            "cache_dir": str(tmp / "cache"),
            "name": name,
            "components": list(components),
            **delta,
        },
    )

    def factory(c):
        module = build_module(c)
        if verifier is not None:
            module.task.verify_batch = lambda problems, texts: [Verdict(verifier(t)) for t in texts]
        if prepare is not None:
            prepare(module)
        return module

    probe = Probe()
    summary = train(cfg, module_factory=factory, extra_callbacks=[probe])
    with open(Path(summary["run_dir"]) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return ProbeRun(probe, rows, cfg)


def zero_value_head(module) -> None:
    """V = 0 everywhere at the start: explained variance exactly 0 on the first batch."""
    with torch.no_grad():
        module.critic.head.weight.zero_()
        module.critic.head.bias.zero_()


def with_weights(model, weights: dict):
    """A copy of `model` holding `weights` (name -> tensor), with gradients enabled."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in out.named_parameters():
            p.copy_(weights[n])
    out.requires_grad_(True)
    return out


# ----------------------------------------------------------------------------- references
def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def ref_values(critic, exp) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, R) V(s_t) read at column P + t - 1 (0 on padding), and (N,) V(s_l), the value after the
    last token: the prefix ending at that token, column P + l - 1. One plain forward of the critic."""
    ids, attn = exp.input_ids, exp.attention_mask
    full = critic(ids, attn)  # (N, P + R): column c = V(prefix ending at c)
    P = exp.prompt_ids.shape[1]
    n, R = exp.response_ids.shape
    values = torch.zeros(n, R, dtype=full.dtype)
    after = torch.zeros(n, dtype=full.dtype)
    for i in range(n):
        length = int(exp.mask[i].sum())
        for t in range(length):
            values[i, t] = full[i, P + t - 1]
        after[i] = full[i, P + length - 1]
    return values, after


def ref_logprobs(actor, exp, temperature: float = 1.0) -> torch.Tensor:
    """(N, R) log pi(y_t | s_t): the distribution read at column P + t - 1; 0 on padding. Differentiable."""
    ids, attn = exp.input_ids, exp.attention_mask
    logits = actor(input_ids=ids, attention_mask=attn, position_ids=positions(attn)).logits
    logits = (logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits) / temperature
    P = exp.prompt_ids.shape[1]
    n, R = exp.response_ids.shape
    rows = []
    for i in range(n):
        length = int(exp.mask[i].sum())
        cols = [torch.log_softmax(logits[i, P + t - 1], -1)[exp.response_ids[i, t]] for t in range(length)]
        rows.append(torch.stack(cols + [logits.new_zeros(())] * (R - length)))
    return torch.stack(rows)


def ref_gae(
    rewards_row, values_row, length: int, lam: float, gamma: float = 1.0, after: float = 0.0
) -> list[float]:
    """Advantages of one row by the textbook backward loop (rewards and values of its `length` tokens;
    `after` = the value after the last token: 0 terminal, V(s_l) bootstrapped)."""
    adv, running = [0.0] * length, 0.0
    for t in reversed(range(length)):
        v_next = float(values_row[t + 1]) if t + 1 < length else float(after)
        delta = float(rewards_row[t]) + gamma * v_next - float(values_row[t])
        running = delta + gamma * lam * running
        adv[t] = running
    return adv


def ref_advantages(exp, lam_per_row, gamma: float = 1.0) -> torch.Tensor:
    """(N, R) GAE advantages with one lambda per row, from the Experience's rewards/values/bootstrap."""
    out = torch.zeros_like(exp.mask, dtype=torch.float64)
    for i in range(exp.mask.shape[0]):
        length = int(exp.mask[i].sum())
        adv = ref_gae(
            exp.rewards[i], exp.values[i], length, float(lam_per_row[i]), gamma, float(exp.bootstrap[i])
        )
        out[i, :length] = torch.tensor(adv, dtype=torch.float64)
    return out


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the valid tokens (population std), 0 on padding."""
    vals = x[mask.bool()].double()
    mean, var = vals.mean(), ((vals - vals.mean()) ** 2).mean()
    return torch.where(
        mask.bool(), (x.double() - mean) / torch.sqrt(var + 1e-8), torch.zeros((), dtype=torch.float64)
    )


def adaptive_lambda(length: int, alpha: float, gamma: float = 1.0) -> float:
    """docs/algorithm.md: 1 - 1/(alpha l), divided by gamma when gamma != 1, clamped to [0, 1]."""
    lam = 1.0 - 1.0 / (alpha * length)
    if gamma != 1.0:
        lam /= gamma
    return min(1.0, max(0.0, lam))


def clip_coef(grads, max_norm: float) -> tuple[float, float]:
    """(total gradient norm, the factor clip_grad_norm_ applies)."""
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    return norm, (min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0)
