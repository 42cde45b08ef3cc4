"""Positive-example LM loss (VAPO Eq. 9-10, self-imitation): L = L_PPO + mu * NLL over the tokens
of the correct responses in the mini-batch, normalised by their count; exactly 0 with no correct
response. Off: no NLL term (logged as loss/nll = 0). Caution: it also imitates shortcuts a lax
verifier lets through."""

from dataclasses import replace

from vapo_lit.components.base import Component


class PositiveLMLoss(Component):
    name = "positive_lm_loss"
    declares = ("positive_lm_loss", "mu")

    def loss_settings(self, s):
        return replace(s, mu=self.values["mu"])
