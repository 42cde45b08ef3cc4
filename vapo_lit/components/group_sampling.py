"""Group sampling (VAPO section 4.3): fewer distinct prompts, samples_per_prompt samples each, with
the number of responses per step unchanged. Off: every response has its own prompt. The actor
advantage still comes from the critic (this is a budget allocation, not GRPO)."""
from vapo_lit.components.base import Component


class GroupSampling(Component):
    name = "group_sampling"
    declares = ("group_sampling", "samples_per_prompt")

    def check(self, pl_module) -> None:
        n = pl_module.cfg.ppo.responses_per_step
        k = self.values["samples_per_prompt"]
        if n % k:
            raise ValueError(
                f"group_sampling.samples_per_prompt={k} must divide ppo.responses_per_step={n}"
            )
