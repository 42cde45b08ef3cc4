"""Dynamic sampling (DAPO, Yu et al. 2025, section 3.2; optional, NOT part of VAPO): groups whose
responses all score the same are dropped and more prompt batches are sampled until the batch holds
responses_per_step responses of mixed groups, at most `dynamic_max_rounds` batches per iteration
(DAPO's max_num_gen_batches); when those hold too few mixed groups the batch is filled with the
earliest uniform groups and `rollout/dynamic_filled_groups` says how many. Every sampled token
counts in `perf/cumulative_tokens`. Not applied during value pretraining (the critic learns the
policy's own distribution). Off: every sampled group is trained on.

The loop is `VapoModule.rollout`, the selection `vapo_lit/dynamic_sampling.py`; its rule (it needs
group_sampling) is in `config.COMPONENT_CHECKS`.
"""
from vapo_lit.components.base import Component


class DynamicSampling(Component):
    name = "dynamic_sampling"
    declares = ("dynamic_sampling", "dynamic_max_rounds")
