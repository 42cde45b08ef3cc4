"""Clip-Higher (DAPO, VAPO Eq. 8): clip(ratio, 1 - eps_low, 1 + eps_high) with eps_high > eps_low,
leaving room for low-probability tokens to rise. Off: ppo.eps on both sides.
Its rule, eps_high >= eps_low = ppo.eps: `config.COMPONENT_CHECKS` (config.validate and `check` ask it)."""

from dataclasses import replace

from vapo_lit.components.base import Component


class ClipHigher(Component):
    name = "clip_higher"
    declares = ("clip_higher", "eps_high")

    def loss_settings(self, s):
        return replace(s, eps_high=self.values["eps_high"])
