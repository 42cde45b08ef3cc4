"""`HFEngine`: KV-cached sampling with any transformers causal LM (see `vapo_lit.rollout.generate`)."""
from __future__ import annotations

import torch

from vapo_lit.rollout import Rollout, generate


class HFEngine:
    """Samples with the actor module itself, so its weights are always the trainer's current ones."""

    name = "hf"

    def __init__(self, actor, tokenizer):
        self.model, self.tokenizer = actor, tokenizer

    def load_weights(self, actor) -> None:
        # The engine shares the actor's parameters: an update is visible at once. A different
        # module means the caller rebuilt the actor (e.g. a strategy wrapped it): follow it.
        self.model = actor

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        return generate(self.model, self.tokenizer, prompts, max_new_tokens=sampling.max_new_tokens,
                        temperature=sampling.temperature, top_p=sampling.top_p, seeds=seeds)
