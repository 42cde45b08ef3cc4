"""Issue 21 (findings 2 and 3), checked under CPU bf16 autocast (what Lightning's bf16-mixed uses on
a CPU): sampling runs outside the training step's autocast region, the updates inside it; the value
head computes in float32; the log-probs PPO compares are float32; the behaviour log-probs are
recomputed by default under reduced precision, so the first mini-batch's ratio is exactly 1."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from test_rollout import PROMPTS, tiny_model

from vapo_lit import passes
from vapo_lit.config import RunConfig, merge
from vapo_lit.devices import recompute_logprobs
from vapo_lit.engines.hf import generate
from vapo_lit.models.value import ValueModel
from vapo_lit.presets import PRESETS
from vapo_lit.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """The smoke recipe (all seven components: 2 value-pretraining iterations, then 2 PPO updates of
    one mini-batch each, in length-sorted, trimmed micro-batches; evals at 0, 1, 2) under Lightning's
    bf16-mixed with the default ppo.recompute_logprobs; probes record autocast around every
    sampling call and every actor forward."""
    from vapo_lit.build import build_module
    from vapo_lit.train import train

    tmp = tmp_path_factory.mktemp("bf16")
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "out_dir": str(tmp / "runs"),
            "wandb": "disabled",
            "cache_dir": str(tmp / "cache"),
            "model": "random",
            "threads": 1,
            "steps": 2,
            "eval_every": 1,
            "precision": "bf16-mixed",
            "ppo": {"mini_batch_size": 16, "micro_batch_size": 4},
        },
    )
    seen = {"generate": [], "forward": []}

    def factory(c):
        m = build_module(c)
        inner = m.engine.generate

        def probed(*a, **kw):
            seen["generate"].append(torch.is_autocast_enabled("cpu"))
            return inner(*a, **kw)

        m.engine.generate = probed
        m.actor.register_forward_hook(
            lambda mod, args, out: seen["forward"].append(
                (torch.is_autocast_enabled("cpu"), torch.is_grad_enabled())
            )
        )
        return m

    summary = train(cfg, module_factory=factory)
    rows = list(csv.DictReader(open(f"{summary['run_dir']}/metrics.csv")))
    card = json.loads(open(f"{summary['run_dir']}/run_card.json").read())
    return seen, rows, card


def test_sampling_runs_outside_the_training_autocast(bf16_run):
    """Rollouts and every eval (step 0 from on_train_start, later ones inside training_step) sample
    with autocast off; the update's forwards (with gradients) run under it."""
    seen, rows, _ = bf16_run
    evals = [r for r in rows if r.get("eval/avg@2")]
    assert len(evals) == 3 and len(seen["generate"]) >= 4 + 3, (len(evals), seen["generate"])
    assert not any(seen["generate"]), seen["generate"]
    updates = [on for on, grad in seen["forward"] if grad]
    assert updates and all(updates), updates


def test_first_minibatch_ratio_is_exactly_one_under_bf16_mixed(bf16_run):
    """Default settings: the behaviour log-probs are recomputed (auto under bf16-mixed) by the
    update's own pass in its own micro-batches, so the first (here: only) mini-batch's ratio is 1
    to the last bit. The sampler's fp32 log-probs differ from the bf16 update by ~1e-3 (ratio_max
    1.001); recomputed in other row groups and widths, by up to 1e-4 (bf16 rounds differently)."""
    _, rows, card = bf16_run
    updates = [r for r in rows if r.get("policy/ratio_mean")]
    assert len(updates) == 2
    for r in updates:  # each update is one mini-batch: the first of its iteration
        assert float(r["policy/ratio_mean"]) == 1.0 and float(r["policy/ratio_max"]) == 1.0, r
        assert float(r["policy/approx_kl"]) == 0.0 and float(r["policy/clipfrac_low"]) == 0.0, r
    assert card["config"]["ppo"]["recompute_logprobs"] is None
    assert card["sampling"]["recompute_logprobs"] is True
    assert card["sampling"]["behaviour_logprobs"].startswith("recomputed")


def test_recompute_logprobs_auto_resolution():
    base = RunConfig()
    cases = [
        ("32-true", torch.float32, None, False),
        ("64-true", torch.float64, None, False),
        ("bf16-mixed", torch.float32, None, True),
        ("16-mixed", torch.float32, None, True),
        ("bf16-true", torch.bfloat16, None, True),
        ("32-true", torch.bfloat16, None, True),
        ("bf16-mixed", torch.float32, False, False),
        ("32-true", torch.float32, True, True),
    ]
    for precision, dtype, setting, want in cases:
        cfg = merge(base, {"ppo": {"recompute_logprobs": setting}})
        assert recompute_logprobs(cfg, precision, dtype) is want, (precision, dtype, setting)
    # no trainer yet: the config's precision, resolved ('auto' on a CPU is 32-true)
    assert recompute_logprobs(merge(base, {"accelerator": "cpu"}), None, torch.float32) is False
    assert recompute_logprobs(merge(base, {"precision": "bf16-mixed"}), None, torch.float32) is True


def test_value_head_is_float32_under_autocast(task):
    """The head's output equals float64 arithmetic on the same hidden states to float32 precision;
    under autocast a bf16 head would be off by ~2e-3 at values near 0.7."""
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer)
    critic = ValueModel.from_causal_lm(model)
    torch.nn.init.constant_(critic.head.bias, 0.7)
    ro = generate(model, task.tokenizer, PROMPTS * 2, max_new_tokens=6, seeds=0)
    hidden = {}
    critic.backbone.register_forward_hook(lambda m, a, out: hidden.update(h=out.last_hidden_state))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v = critic(ro.input_ids, ro.attention_mask)
    assert v.dtype == torch.float32
    w, b = critic.head.weight.detach().double(), critic.head.bias.detach().double()
    want = (hidden["h"].detach().double() @ w.T + b).squeeze(-1)
    gap = float((v.detach().double() - want).abs().max())
    assert gap < 1e-5, gap


@pytest.mark.parametrize("chunk", [None, 3])
def test_logprobs_are_float32_log_softmax_under_autocast(task, chunk):
    """The update's log-probs under bf16 autocast: log_softmax of the logits upcast to float32."""
    model = tiny_model("llama", len(task.tokenizer), task.tokenizer)
    ro = generate(model, task.tokenizer, PROMPTS * 2, max_new_tokens=6, seeds=0)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = passes.response_logprobs(
            model, ro.input_ids, ro.attention_mask, P, ro.response_ids, temperature=0.7, chunk=chunk
        )
        # the pass's own forward (causal, no mask): another kernel (the masked one) rounds bf16 differently
        ids, pos, states = passes.left_aligned(ro.input_ids, ro.attention_mask, P)
        logits = model(input_ids=ids, position_ids=pos).logits
        logits = logits.gather(1, states[:, :-1, None].expand(-1, -1, logits.shape[-1]))
    assert logits.dtype == torch.bfloat16 and lp.dtype == torch.float32
    want = torch.log_softmax(logits.double() / 0.7, -1).gather(-1, ro.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(lp.double(), want, rtol=0, atol=1e-5)


def test_micro_batch_logprobs_are_the_full_pass_per_row(task):
    """float64: each listed micro-batch's rows (trimmed as the update trims them) get the log-probs
    of the untrimmed full pass; rows in no micro-batch (another rank's share) stay 0."""
    from vapo_lit.distributed import ActorScorer
    from vapo_lit.experience import Experience

    model = tiny_model("llama", len(task.tokenizer), task.tokenizer).double()
    ro = generate(model, task.tokenizer, PROMPTS * 2, max_new_tokens=8, seeds=3)
    exp = Experience.from_rollout(ro, list(range(len(PROMPTS) * 2)))
    micros = [torch.tensor([5, 0]), torch.tensor([3]), torch.tensor([7, 2, 6])]  # row 1 and 4: another rank's
    got = passes.micro_batch_logprobs(ActorScorer(model), exp, micros, temperature=0.7, chunk=2)
    with torch.no_grad():
        full, _ = passes.response_logprobs(
            model, ro.input_ids, ro.attention_mask, ro.prompt_ids.shape[1], ro.response_ids, temperature=0.7
        )
    want = full * ro.response_mask
    want[[1, 4]] = 0.0
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_no_forward_after_an_optimizer_step_reads_weights_cast_before_it(tmp_path):
    """Lightning < 2.6 autocasts with the weight-cast cache on, over the whole training_step: the
    module's optimizers empty that cache at every step, so the next forward sees the new weights
    (without it, the second forward here reuses the pre-step bf16 casts)."""
    from vapo_lit.build import build_module

    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]), {"model": "random", "cache_dir": str(tmp_path), "threads": 1}
    )
    module = build_module(cfg)
    (actor_opt, _), _ = module.configure_optimizers()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True):
        module.actor(input_ids=ids).logits.float().square().mean().backward()
        actor_opt.step()
        after = module.actor(input_ids=ids).logits.detach()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = module.actor(input_ids=ids).logits
    assert torch.equal(after, fresh)
