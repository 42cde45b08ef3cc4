"""Group sampling (VAPO section 4.3): fewer distinct prompts, samples_per_prompt samples each, with
the number of responses per step unchanged. Off: every response has its own prompt. The actor
advantage still comes from the critic (this is a budget allocation, not GRPO).
Its rule, samples_per_prompt divides ppo.responses_per_step: `config.COMPONENT_CHECKS`."""

from vapo_lit.components.base import Component


class GroupSampling(Component):
    name = "group_sampling"
    declares = ("group_sampling", "samples_per_prompt")

    def samples_per_prompt(self, k: int) -> int:
        return self.values["samples_per_prompt"]
