"""Token-level policy loss (DAPO, VAPO Eq. 7): the sum over every valid token of the mini-batch
divided by their number, so long responses are not down-weighted. Off: mean within each
response, then over responses (Eq. 6)."""

from dataclasses import replace

from vapo_lit.components.base import Component


class TokenLevelLoss(Component):
    name = "token_level_loss"
    declares = ("token_level_loss",)

    def loss_settings(self, s):
        return replace(s, aggregation="token")
