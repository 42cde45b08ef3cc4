"""The shape every component shares: a Lightning callback that, in `setup`, validates its values
and sets only the `Switches` fields it declares. No math lives here (see `vapo_lit.algos`).

The seven VAPO components only set switches, which the module reads. A component outside the
recipe (e.g. `kl_penalty`) may instead add to the iteration through two hooks the module calls
for every component that overrides them:

* `on_experience(module, exp)`: after the advantages of a PPO iteration (not during value
  pretraining), read or extend the `Experience` (put extra tensors in `exp.extras`); returns
  metrics to log.
* `loss_term(module, mb, logprobs, token_denominator)`: an extra term of the actor loss for one
  micro-batch `mb`, normalised by the mini-batch's valid tokens (so micro-batches add up);
  returns (loss tensor, metrics of this micro-batch).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from lightning.pytorch.callbacks import Callback

from vapo_lit.config import Switches, check_component, check_range


class Component(Callback):
    name: ClassVar[str]
    declares: ClassVar[tuple[str, ...]]
    """The `Switches` fields this component may set (its own name: the on/off switch of one of the
    seven); `apply` touches nothing else."""

    def __init__(self, **values):
        fields = {f.name: f for f in dataclasses.fields(Switches)}
        allowed = [d for d in self.declares if d != self.name]
        for key, value in values.items():
            if key not in allowed:
                raise ValueError(f"component {self.name!r} takes {', '.join(allowed) or 'no values'}; got {key!r}")
            check_range(f"{self.name}.{key}", value, fields[key].metadata)
        self.values = {k: values.get(k, fields[k].default) for k in allowed}

    def apply(self, switches: Switches) -> None:
        """Switch this component on in `switches` with its values."""
        if self.name in self.declares:
            setattr(switches, self.name, True)
        for key, value in self.values.items():
            setattr(switches, key, value)

    def check(self, pl_module) -> None:
        """Validate against the module's settings: the component's rule in `config.COMPONENT_CHECKS`
        (the one `config.validate` asks too), with this callback's values; ValueError with what is valid."""
        check_component(self.name, self.values, pl_module.cfg, where=self.name)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.check(pl_module)
        self.apply(pl_module.switches)
        if self.hooks_iteration and self not in pl_module.extensions:
            pl_module.extensions.append(self)

    # ------------------------------------------------------------------ optional iteration hooks
    def on_experience(self, module, exp) -> dict[str, float]:
        return {}

    def loss_term(self, module, mb, logprobs, token_denominator):
        return None

    @property
    def hooks_iteration(self) -> bool:
        cls = type(self)
        return cls.on_experience is not Component.on_experience or cls.loss_term is not Component.loss_term

    @property
    def state_key(self) -> str:
        return f"vapo_component:{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.values.items())})"
