"""The critic's replay (`ppo.critic_replay`): step 5 trains the critic on this iteration's batch and
on the batches of the iterations before it, with the values and targets they had when sampled.

A PPO critic sees each batch once and moves on; with a batch of a few prompts it chases the last
batch's Monte-Carlo noise while the values it should predict drift as the policy improves. A replay
of the last few batches gives each critic step more responses to average over (the step's
mini-batch takes critic_mini_batch_size responses of each batch: as many steps per iteration as
without replay), at the cost of targets from slightly older policies. It is kept in PPO only (value pretraining's batches all come
from the one fixed policy, and its critic is a cache entry shared by runs with and without replay),
and saved in every checkpoint, so a resumed run trains on the same batches as an uninterrupted one.
"""

from __future__ import annotations

import torch

from vapo_lit.group_filter import concat_experiences
from vapo_lit.experience import Experience

KEPT = (
    "prompt_ids",
    "prompt_mask",
    "response_ids",
    "mask",
    "lengths",
    "truncated",
    "obs_mask",
    "values",
    "returns",
)
"""The fields the critic's update reads (inputs, masks, targets, the values the value clip is around)."""


class CriticReplay:
    """The last `size - 1` PPO batches, each as the tensors the critic's update reads."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(
                f"ppo.critic_replay={size}: give the number of batches the critic trains on, >= 1"
            )
        self.size = size
        self.kept: list[dict] = []
        self.batches = 1
        """How many batches the last `batch` call returned."""

    def batch(self, exp: Experience, pad_id: int) -> Experience:
        """The critic's batch for this iteration: the kept batches (oldest first), then `exp`; `exp`
        is kept for the next iterations. With size 1, `exp` itself."""
        self.batches = len(self.kept) + 1
        if self.size == 1:
            return exp
        device = exp.mask.device
        parts = [
            self._experience({k: None if t is None else t.to(device) for k, t in d.items()}, exp.group_size)
            for d in self.kept
        ]
        parts.append(self._experience({name: getattr(exp, name) for name in KEPT}, exp.group_size))
        self.kept = (
            self.kept
            + [
                {
                    name: None if getattr(exp, name) is None else getattr(exp, name).detach().cpu()
                    for name in KEPT
                }
            ]
        )[-(self.size - 1) :]
        return concat_experiences(parts, pad_id)

    @staticmethod
    def _experience(kept: dict, group_size: int) -> Experience:
        """A critic-only Experience of kept tensors (what the critic does not read left empty)."""
        n = kept["mask"].shape[0]
        return Experience(
            problems=[None] * n,
            group_size=group_size,
            texts=[""] * n,
            behaviour_logprobs=torch.zeros(
                kept["mask"].shape, dtype=torch.float32, device=kept["mask"].device
            ),
            **kept,
        )

    def state_dict(self) -> dict:
        return {"size": self.size, "kept": [dict(d) for d in self.kept]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("size", self.size) != self.size:
            raise ValueError(
                f"the checkpoint's critic replay keeps {state['size']} batches, this run's "
                f"ppo.critic_replay {self.size}: resume with the same setting"
            )
        self.kept = [dict(d) for d in state.get("kept", [])]
