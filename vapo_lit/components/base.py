"""The shape every VAPO component shares: a Lightning callback that, in `setup`, validates its
values and sets only the `Switches` fields it declares. No math lives here (see `vapo_lit.algos`)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from lightning.pytorch.callbacks import Callback

from vapo_lit.config import Switches, check_range


class Component(Callback):
    name: ClassVar[str]
    declares: ClassVar[tuple[str, ...]]
    """The `Switches` fields this component may set; `apply` touches nothing else."""

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
        setattr(switches, self.name, True)
        for key, value in self.values.items():
            setattr(switches, key, value)

    def check(self, pl_module) -> None:
        """Validate against the module's settings; raise ValueError with what is valid."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.check(pl_module)
        self.apply(pl_module.switches)

    @property
    def state_key(self) -> str:
        return f"vapo_component:{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.values.items())})"
