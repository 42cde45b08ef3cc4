"""The VAPO components as Lightning callbacks, one file each, registered under their names.

    callbacks = build_callbacks(["clip_higher", "token_level_loss"], ComponentValues())

No callback at all is vanilla PPO. The registry is `config.ALL_COMPONENTS`: the component called
NAME lives in `vapo_lit/components/NAME.py` as the `Component` subclass whose `name` is NAME.
"""

from __future__ import annotations

import importlib

from vapo_lit.components.base import Component
from vapo_lit.config import ALL_COMPONENTS, ComponentValues, check_components


def _load(name: str) -> type[Component]:
    module = importlib.import_module(f"vapo_lit.components.{name}")
    found = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, Component) and getattr(c, "name", None) == name
    ]
    if len(found) != 1:
        raise ImportError(
            f"vapo_lit/components/{name}.py must define one Component subclass with name = {name!r}"
        )
    return found[0]


REGISTRY: dict[str, type[Component]] = {name: _load(name) for name in ALL_COMPONENTS}


def build_callbacks(names, values: ComponentValues | None = None) -> list[Component]:
    """One callback per named component, constructed with its values from `values`."""
    values = values or ComponentValues()
    out = []
    for name in check_components(names):
        cls = REGISTRY[name]
        kwargs = {k: getattr(values, k) for k in cls.declares if k != name}
        out.append(cls(**kwargs))
    return out


__all__ = ["Component", "REGISTRY", "build_callbacks", *[c.__name__ for c in REGISTRY.values()]]
