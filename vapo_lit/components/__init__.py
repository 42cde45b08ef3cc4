"""The seven VAPO components as Lightning callbacks, registered under their SPEC.md names.

    callbacks = build_callbacks(["clip_higher", "token_level_loss"], ComponentValues())

No callback at all is vanilla PPO.
"""
from __future__ import annotations

from vapo_lit.components.base import Component
from vapo_lit.components.clip_higher import ClipHigher
from vapo_lit.components.decoupled_gae import DecoupledGAE
from vapo_lit.components.group_sampling import GroupSampling
from vapo_lit.components.length_adaptive_gae import LengthAdaptiveGAE
from vapo_lit.components.positive_lm_loss import PositiveLMLoss
from vapo_lit.components.token_level_loss import TokenLevelLoss
from vapo_lit.components.value_pretraining import ValuePretraining
from vapo_lit.config import COMPONENTS, ComponentValues, check_components

REGISTRY: dict[str, type[Component]] = {
    cls.name: cls
    for cls in (ValuePretraining, DecoupledGAE, LengthAdaptiveGAE, TokenLevelLoss, ClipHigher,
                PositiveLMLoss, GroupSampling)
}
assert tuple(REGISTRY) == COMPONENTS


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
