"""Length-adaptive GAE (VAPO Eq. 5): lambda_policy = 1 - 1/(alpha * l) per response, so the GAE
window 1/(1 - lambda) grows with the response length l. Off: ppo.lam (0.95) for every response.

alpha = 0.05 assumes chains of thousands of tokens: below l = 20/alpha the adaptive lambda is
*smaller* than vanilla's 0.95 (docs/algorithm.md); choose alpha for your task's lengths."""

from dataclasses import replace

from vapo_lit.components.base import Component


class LengthAdaptiveGAE(Component):
    name = "length_adaptive_gae"
    declares = ("length_adaptive_gae", "alpha")

    def advantage_settings(self, s):
        return replace(s, alpha=self.values["alpha"])
