"""Clip-Higher (DAPO, VAPO Eq. 8): clip(ratio, 1 - eps_low, 1 + eps_high) with eps_high > eps_low,
leaving room for low-probability tokens to rise. Off: ppo.eps on both sides."""
from vapo_lit.components.base import Component


class ClipHigher(Component):
    name = "clip_higher"
    declares = ("clip_higher", "eps_high")

    def check(self, pl_module) -> None:
        eps_low = pl_module.cfg.ppo.eps
        if self.values["eps_high"] < eps_low:
            raise ValueError(
                f"clip_higher.eps_high={self.values['eps_high']} is below eps_low=ppo.eps={eps_low}; "
                "valid: eps_high >= eps_low"
            )
