"""Pure tensor math for VAPO: torch only (no Lightning, nothing else from the project).

    from vapo_lit.algos import gae, length_adaptive_lambda
"""
from vapo_lit.algos.advantage import (
    OBSERVATION_MODES,
    decoupled_gae,
    decoupled_gae_observations,
    gae,
    group_normalized_advantage,
    lambda_clamped,
    length_adaptive_lambda,
)
from vapo_lit.algos.losses import (
    AGGREGATIONS,
    PolicyLossStats,
    aggregate,
    aggregation_weights,
    at_least_float32,
    clip_fractions,
    clipped_surrogate,
    entropy_from_logits,
    policy_loss,
    positive_nll,
    SamplerMismatch,
    sampler_mismatch,
    token_logprobs,
    truncated_is_weights,
    value_loss,
    weight_share,
)
from vapo_lit.algos.oracle import first_mismatch, kind_error_rates, target_success_values
from vapo_lit.algos.stats import (
    advantage_error,
    bucketed_mean,
    bucketize,
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    mean_by,
    length_key,
    valid_positions,
    value_bias,
)

__all__ = [
    "gae", "decoupled_gae", "decoupled_gae_observations", "OBSERVATION_MODES", "length_adaptive_lambda", "lambda_clamped", "group_normalized_advantage",
    "AGGREGATIONS", "PolicyLossStats", "aggregate", "aggregation_weights", "weight_share", "at_least_float32", "clip_fractions", "clipped_surrogate",
    "entropy_from_logits", "policy_loss", "positive_nll", "token_logprobs", "value_loss",
    "truncated_is_weights", "SamplerMismatch", "sampler_mismatch",
    "bucketed_mean", "bucketize", "explained_variance", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "valid_positions", "value_bias", "mean_by", "advantage_error", "length_key",
    "first_mismatch", "kind_error_rates", "target_success_values",
]
