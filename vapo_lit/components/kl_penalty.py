"""KL penalty to the initial policy (optional; NOT part of VAPO, which uses no KL term): adds
kl_coef * KL(pi || pi_initial) to the actor loss, estimated per token with k3 =
exp(log pi_init - log pi) - (log pi_init - log pi) - 1 (>= 0, unbiased for the KL under pi's
samples) and averaged over the mini-batch's valid tokens. Off: no reference model, no term.

Also the worked example (docs/guides/extending.md) of adding a component: this file, its name in
`config.OPTIONAL_COMPONENTS`, its value `kl_coef` in `config.ComponentValues`.
"""

from __future__ import annotations

import copy

import torch

from vapo_lit import algos
from vapo_lit.components.base import Component
from vapo_lit.distributed import ActorScorer, is_fsdp_strategy, is_sharded, shard_model


class KLPenalty(Component):
    name = "kl_penalty"
    declares = ("kl_coef",)

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # A frozen copy of the initial policy. setup runs before a checkpoint's weights are loaded,
        # so a resumed run copies the same initial policy (train() builds the module afresh).
        # Under FSDP it is sharded like the actor (1/W of it per rank, gathered block by block in
        # the forward) instead of one full copy per device; under DDP every rank holds a full copy,
        # as it holds the actor.
        self.reference = ActorScorer(copy.deepcopy(pl_module.actor).eval().requires_grad_(False))
        self.sharded = is_fsdp_strategy(getattr(trainer, "strategy", None))
        if self.sharded:
            shard_model(self.reference, trainer.precision)

    @torch.no_grad()
    def on_experience(self, module, exp) -> dict[str, float]:
        """Reference log-probs of the sampled tokens, once per iteration (every epoch reuses them)."""
        ref = self.reference if self.sharded else self.reference.to(exp.mask.device)
        p, rows = module.cfg.ppo, module.cfg.ppo.micro_batch_size
        ids, attn = exp.input_ids, exp.attention_mask
        exp.extras["ref_logprobs"] = torch.cat(
            [
                ref(
                    ids[s : s + rows],
                    attn[s : s + rows],
                    exp.prompt_width,
                    exp.response_ids[s : s + rows],
                    p.temperature,
                    False,
                    p.logits_chunk,
                )[0]
                for s in range(0, exp.n, rows)
            ]
        )
        for m in (
            ref.modules() if self.sharded else ()
        ):  # the root unit keeps its gathered parameters: shard them again
            if is_sharded(m):
                m.reshard()
        return {}

    def loss_term(self, module, mb, logprobs, token_denominator):
        log_ratio = mb.extras["ref_logprobs"] - logprobs  # log pi_init / pi
        k3 = torch.expm1(log_ratio) - log_ratio
        kl = algos.aggregate(k3, mb.mask, "token", token_denominator)
        return self.values["kl_coef"] * kl, {
            "policy/kl_initial": float(algos.masked_mean(k3.detach(), mb.mask))
        }
