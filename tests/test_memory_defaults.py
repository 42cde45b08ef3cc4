"""'auto' rollout_batch_size / logits_chunk (vapo_lit.devices.resolve_memory_defaults): the passes are
bounded by the model's shape and the device's free memory, and unbounded (today's behaviour, so the
golden histories hold) wherever the whole pass fits, as it does for the built-in models."""

from __future__ import annotations

import types

import pytest
import torch

from vapo_lit.cli.args import parse_flat
from vapo_lit.config import RunConfig, merge, validate
from vapo_lit.devices import (
    LOGIT_BYTES,
    SAMPLING_LOGIT_COPIES,
    SHARE,
    STATE_BYTES_PER_PARAM,
    plan_sizes,
    resolve_memory_defaults,
)

GIB = 1 << 30
QWEN_7B = {"vocab": 152064, "layers": 28, "kv_width": 4 * 128}  # Qwen2.5-7B: 28 layers, 4 K/V heads of 128


def test_a_7b_model_at_8k_tokens_gets_bounded_passes_from_the_free_memory():
    """Hand arithmetic: a response's fp32 K/V at 8192 tokens is 2 x 28 x 8192 x 512 x 4 bytes = 0.875
    GiB (+ its logits row); a logits position of 4 rows is 4 x 152064 x 16 bytes."""
    budget = 20 * GIB
    per_row = 2 * 28 * 8192 * 512 * 4 + SAMPLING_LOGIT_COPIES * 4 * 152064
    per_pos = 4 * 152064 * LOGIT_BYTES
    assert budget // per_row == 22 and budget // per_pos == 2206
    batch, chunk = plan_sizes(
        QWEN_7B, tokens=8192, response_tokens=8000, rows=512, micro_batch=4, elem_bytes=4, budget=budget
    )
    assert (batch, chunk) == (16, 2048)  # powers of two at or below 22 and 2206


def test_a_pass_that_fits_whole_stays_unbounded():
    assert plan_sizes(
        QWEN_7B, tokens=1024, response_tokens=512, rows=8, micro_batch=2, elem_bytes=2, budget=100 * GIB
    ) == (None, None)


def test_a_device_too_small_for_one_row_still_runs_one_at_a_time():
    assert plan_sizes(
        QWEN_7B, tokens=8192, response_tokens=8192, rows=64, micro_batch=8, elem_bytes=4, budget=1 << 20
    ) == (1, 1)


def _model(vocab=24, layers=1, hidden=32, heads=2, kv_heads=None, params=1000):
    cfg = types.SimpleNamespace(
        vocab_size=vocab,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
    )
    m = torch.nn.Linear(params, 1, bias=False)
    m.config = cfg
    return m


def test_auto_resolves_from_free_memory_minus_the_models_training_state():
    cfg = merge(
        RunConfig(), {"ppo": {"responses_per_step": 4096, "mini_batch_size": 64, "micro_batch_size": 8}}
    )
    actor, critic = _model(vocab=150000, layers=4, hidden=1024, heads=8), _model(params=500)
    free = 8 * GIB
    out, plan = resolve_memory_defaults(
        cfg, actor, critic, prompt_tokens=200, max_new_tokens=4000, free_bytes=free
    )
    budget = (free - STATE_BYTES_PER_PARAM * 1500) // SHARE
    assert plan.budget_bytes == budget
    want = plan_sizes(
        {"vocab": 150000, "layers": 4, "kv_width": 1024},
        tokens=4200,
        response_tokens=4000,
        rows=4096,
        micro_batch=8,
        elem_bytes=4,
        budget=budget,
    )
    assert (
        (out.ppo.rollout_batch_size, out.ppo.logits_chunk)
        == want
        == (plan.rollout_batch_size, plan.logits_chunk)
    )
    assert want[0] is not None and want[1] is not None
    assert cfg.ppo.rollout_batch_size == "auto"  # the caller's config is left as given


def test_explicit_sizes_are_kept_and_auto_is_resolved_alone():
    cfg = merge(RunConfig(), {"ppo": {"rollout_batch_size": 7}})
    out, plan = resolve_memory_defaults(cfg, _model(vocab=10**6), None, 10, 10**4, free_bytes=GIB)
    assert out.ppo.rollout_batch_size == 7 and isinstance(out.ppo.logits_chunk, int)
    cfg = merge(RunConfig(), {"ppo": {"rollout_batch_size": None, "logits_chunk": 3}})
    out, plan = resolve_memory_defaults(cfg, _model(), None, 10, 10, free_bytes=1)
    assert (out.ppo.rollout_batch_size, out.ppo.logits_chunk) == (None, 3) and plan.how == "set in the config"


def test_the_builtin_model_resolves_to_todays_unbounded_passes():
    """The golden run's module: both sizes None (all at once), as before 'auto' existed."""
    import tempfile
    from pathlib import Path

    import golden

    module = golden.factory(golden.make_config(Path(tempfile.mkdtemp()), "vapo"))
    assert (module.cfg.ppo.rollout_batch_size, module.cfg.ppo.logits_chunk) == (None, None)
    assert module.memory_plan.budget_bytes > 0 and module.memory_plan.how.startswith("auto:")


def test_auto_is_the_default_and_the_cli_spelling_and_other_words_are_refused():
    assert RunConfig().ppo.rollout_batch_size == "auto" and RunConfig().ppo.logits_chunk == "auto"
    assert parse_flat({"ppo.logits_chunk": "auto", "ppo.rollout_batch_size": "16"}) == {
        "ppo": {"logits_chunk": "auto", "rollout_batch_size": 16}
    }
    with pytest.raises(
        ValueError, match=r"ppo.logits_chunk='big' is not valid; give a positive integer, none"
    ):
        validate(merge(RunConfig(), {"ppo": {"logits_chunk": "big"}}))
    with pytest.raises(ValueError, match="ppo.rollout_batch_size=0 is out of range"):
        validate(merge(RunConfig(), {"ppo": {"rollout_batch_size": 0}}))
