"""The shape every component shares: a Lightning callback that, in `setup`, validates its values,
records itself in the module's `Switches` (the fields it declares) and joins `module.components`,
whose hooks the module calls in its numbered steps. No math lives here (see `vapo_lit.algos`).

A component says what it changes through the hooks it overrides; every default below changes
nothing, so no component at all is vanilla PPO. The module never asks which component is on.

Settings, folded over vanilla PPO's: each component returns its input with its own fields changed
(`dataclasses.replace`). The registered ones touch different fields, so their order does not matter;
a new one that changes a field another one changes would depend on it.

* `samples_per_prompt(k)`: responses per prompt, 1 in vanilla PPO (group sampling);
* `advantage_settings(s)`: the GAE of the advantages stage, an `experience.AdvantageSettings`
  (decoupled GAE: `lam_critic`; length-adaptive GAE: `alpha`);
* `loss_settings(s)`: the actor loss, an `experience.LossSettings` (Clip-Higher: `eps_high`;
  token-level loss: `aggregation`; positive LM loss: `mu`);
* `before_ppo(plan)`: what happens before PPO, None or a `pretrain.Plan` for the module's
  critic-only phase (value pretraining, which also ends the phase by its rule).

The iteration, PPO iterations only (not while the critic is pretrained):

* `on_rollout(module, exp)`: after the step's batch is sampled; returns the batch to train on
  (dynamic sampling samples more and keeps mixed groups);
* `on_experience(module, exp)`: after the advantages; read or extend the `Experience` (extra
  tensors in `exp.extras`); returns metrics to log;
* `loss_term(module, mb, logprobs, token_denominator)`: an extra term of the actor loss for one
  micro-batch `mb`, normalised by the mini-batch's valid tokens (so micro-batches add up);
  returns (loss tensor, metrics of this micro-batch), or None.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from lightning.pytorch.callbacks import Callback

from vapo_lit.config import Switches, check_component, check_range
from vapo_lit.experience import AdvantageSettings, LossSettings
from vapo_lit.pretrain import Plan


class Component(Callback):
    name: ClassVar[str]
    declares: ClassVar[tuple[str, ...]]
    """The `Switches` fields this component records (its own name: the on/off switch of a registered
    component; the rest: its values, taken from `ComponentValues`); `apply` touches nothing else."""

    def __init__(self, **values):
        fields = {f.name: f for f in dataclasses.fields(Switches)}
        allowed = [d for d in self.declares if d != self.name]
        for key, value in values.items():
            if key not in allowed:
                raise ValueError(
                    f"component {self.name!r} takes {', '.join(allowed) or 'no values'}; got {key!r}"
                )
            check_range(f"{self.name}.{key}", value, fields[key].metadata)
        self.values = {k: values.get(k, fields[k].default) for k in allowed}

    def apply(self, switches: Switches) -> None:
        """Record this component as on in `switches`, with its values."""
        if self.name in self.declares:
            setattr(switches, self.name, True)
        for key, value in self.values.items():
            setattr(switches, key, value)

    def attach(self, module) -> None:
        """Join `module`: recorded in its switches, its hooks called from now on (once, however
        often Lightning runs `setup`)."""
        self.apply(module.switches)
        if self not in module.components:
            module.components.append(self)

    def check(self, pl_module) -> None:
        """Validate against the module's settings: the component's rule in `config.COMPONENT_CHECKS`
        (the one `config.validate` asks too), with this callback's values; ValueError with what is valid."""
        check_component(self.name, self.values, pl_module.cfg, where=self.name)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.check(pl_module)
        self.attach(pl_module)

    # ------------------------------------------------------------------ what it changes (default: nothing)
    def samples_per_prompt(self, k: int) -> int:
        return k

    def advantage_settings(self, s: AdvantageSettings) -> AdvantageSettings:
        return s

    def loss_settings(self, s: LossSettings) -> LossSettings:
        return s

    def before_ppo(self, plan: Plan | None) -> Plan | None:
        return plan

    # ------------------------------------------------------------------ the iteration (default: nothing)
    def on_rollout(self, module, exp):
        return exp

    def on_experience(self, module, exp) -> dict[str, float]:
        return {}

    def loss_term(self, module, mb, logprobs, token_denominator):
        return None

    @property
    def state_key(self) -> str:
        return f"vapo_component:{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.values.items())})"
