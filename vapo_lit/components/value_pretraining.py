"""Value pretraining (VC-PPO, VAPO section 4.1): before any actor update, train the critic alone on
samples of the fixed initial policy with Monte-Carlo returns (lambda = 1), for `value_pretrain_steps`
iterations (paper: 50) or until its explained variance reaches `value_pretrain_min_ev` (the median of
the last `value_pretrain_ev_window` iterations' explained variances: one batch's is noisy). The
critic may train harder in this phase than in PPO (`value_pretrain_critic_lr`,
`value_pretrain_critic_epochs`; each None: the ppo setting).
Off: actor and critic start updating together from the critic's initialisation.

The module runs the phase (`VapoModule.pretrain`, see `vapo_lit/pretrain.py`: critic-only
iterations on Monte-Carlo targets, the pretrained-critic cache) when a component asks for it
(`before_ppo`); this callback asks, with its budget, target and critic rate, and decides when it ends.
"""

from __future__ import annotations

import math

from vapo_lit.components.base import Component
from vapo_lit.distributed import agree_any
from vapo_lit.pretrain import Plan


class ValuePretraining(Component):
    name = "value_pretraining"
    declares = (
        "value_pretraining",
        "value_pretrain_steps",
        "value_pretrain_min_ev",
        "value_pretrain_ev_window",
        "value_pretrain_critic_lr",
        "value_pretrain_critic_epochs",
    )

    def before_ppo(self, plan: Plan | None) -> Plan:
        return Plan(**self.values)

    def should_end(self, steps_done: int, ev: float) -> bool:
        """The stopping rule: the step budget is spent, or the explained variance reached the target."""
        target = self.values["value_pretrain_min_ev"]
        reached = target is not None and not math.isnan(ev) and ev >= target
        return steps_done >= self.values["value_pretrain_steps"] or reached

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        phase = pl_module.pretrain
        # agreed across ranks: the explained variance is computed from the gathered batch on every
        # rank, but its last bits may differ between machines; a rank that ended the phase alone would
        # enter the critic's full_state_dict collective by itself and hang
        ev = phase.recent_ev_median(self.values["value_pretrain_ev_window"])
        if phase.active and agree_any(self.should_end(phase.steps_done, ev)):
            pl_module.end_value_pretraining()
