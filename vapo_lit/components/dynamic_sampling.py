"""Dynamic sampling (DAPO, Yu et al. 2025, section 3.2; optional, NOT part of VAPO): groups whose
responses all score the same are dropped and more prompt batches are sampled until the batch holds
responses_per_step responses of mixed groups, at most `dynamic_max_rounds` batches per iteration
(DAPO's max_num_gen_batches); when those hold too few mixed groups the batch is filled with the
earliest uniform groups and `rollout/dynamic_filled_groups` says how many. Every sampled token
counts in `perf/cumulative_tokens`. Not applied during value pretraining (the critic learns the
policy's own distribution). Off: every sampled group is trained on.

Each round samples one step's worth of prompts (prompts_per_step x samples_per_prompt); DAPO's
recipe samples 3x the batch per round (gen_batch_size), which changes how the sampling is split
into rounds and how many surplus mixed groups the last round leaves unused, not which groups are
eligible. Round r >= 1 draws its prompts and sampling seeds from (seed, iteration, r): a resumed
run samples exactly what the uninterrupted one did, on any number of ranks.

The loop is `VapoModule.rollout`, the selection `vapo_lit/dynamic_sampling.py`; its rule (it needs
group_sampling) is in `config.COMPONENT_CHECKS`.
"""
from vapo_lit.components.base import Component


class DynamicSampling(Component):
    name = "dynamic_sampling"
    declares = ("dynamic_sampling", "dynamic_max_rounds")
