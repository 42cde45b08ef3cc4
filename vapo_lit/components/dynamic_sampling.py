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

The loop is `on_rollout` here (the module's `sample` and `extra_prompts` draw each round), the
selection `vapo_lit/group_filter.py`; its rule (it needs group_sampling) is in
`config.COMPONENT_CHECKS`.
"""

from __future__ import annotations

import warnings

from vapo_lit import group_filter
from vapo_lit.components.base import Component
from vapo_lit.distributed import gather_experience, rank_and_world
from vapo_lit.experience import Experience, score
from vapo_lit.rollout import pad_id_of


class DynamicSampling(Component):
    name = "dynamic_sampling"
    declares = ("dynamic_sampling", "dynamic_max_rounds")

    def on_rollout(self, module, exp: Experience) -> Experience:
        """Score each round, pool the rounds (every rank sees the whole pool), keep the first
        prompts_per_step mixed groups (vapo_lit/group_filter.py: the fill rule when
        dynamic_max_rounds runs out) and return this rank's contiguous share of them. The tokens
        sampled but not kept are counted here (the kept ones at logging)."""
        pad, k, target = pad_id_of(module.tokenizer), module.samples_per_prompt, module.prompts_per_step

        def sample_round(r: int) -> Experience:
            part = exp if r == 0 else module.sample(module.extra_prompts(r), r)
            score(part, module.task.verify_batch(part.problems, part.texts))
            return gather_experience(part, pad)  # (every rank decides on the whole round)

        parts, sel = group_filter.run_rounds(sample_round, k, target, self.values["dynamic_max_rounds"])
        round_ = len(parts)
        pool = group_filter.concat_experiences(parts, pad)
        rank, world = rank_and_world()
        share = target // world
        kept_tokens = float(pool.mask[group_filter.group_rows(sel.kept, k)].sum())
        stats = group_filter.DynamicStats(
            rounds=round_,
            groups_sampled=pool.n // k,
            mixed_groups=sel.mixed,
            kept_groups=len(sel.kept),
            filled_groups=sel.filled,
            extra_tokens=float(pool.mask.sum()) - kept_tokens,
        )
        module.add_rollout_cost(stats.extra_tokens, stats.log())
        if sel.filled and rank == 0:
            warnings.warn(
                f"iteration {module.iteration}: dynamic sampling's {round_} rounds (vapo.dynamic_max_rounds) "
                f"gave {sel.mixed} mixed groups of the {target} needed; the batch is filled with {sel.filled} "
                "groups that all scored the same (logged as rollout/dynamic_filled_groups)"
            )
        if round_ == 1 and sel.kept == list(range(target)) and world == 1:
            return exp  # the step's own batch whole (all mixed, or one round allowed): as sampled
        return pool.select(
            group_filter.group_rows(sel.kept, k, slice(rank * share, (rank + 1) * share)), trim=True
        )
