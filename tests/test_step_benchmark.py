"""benchmarks/step.py: its quick run prints the promised format with equal token counts on every
side, and its plain implementations compute what vapo-lit computes on the same sampled tokens
(log-probs, values, GAE, whitening, losses and their gradients), so the benchmark compares equal
work. The timings themselves are never asserted (speed is measured by the script, not by tests)."""

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import step

from vapo_lit import algos, passes
from vapo_lit.experience import AdvantageSettings, Experience, fill_advantages, fill_values, score
from vapo_lit.engines.hf import generate
from vapo_lit.tasks.base import Verdict

SMALL = SimpleNamespace(hidden=32, layers=2, heads=2, intermediate=64, seed=3)


@pytest.fixture(scope="module")
def tok():
    return step.chain_task().tokenizer


@pytest.fixture(scope="module")
def models(tok):
    actor = step.build_policy(SMALL, tok)
    return actor, step.build_critic(actor, SMALL.seed)


def sampled(actor, tok, n_tokens=7, seeds=(11, 12, 13, 14), ragged=False):
    """Our sampler's rollout of four chain prompts: responses, behaviour log-probs, inputs. With
    `ragged`, rows 1 and 2 are cut after 4 and 1 tokens (as if they had ended there: the model
    never samples EOS), so that masks have padding."""
    prompts = ["chain 3 from 7:", "chain 9 from 12:", "chain 0 from 5:", "chain 3 from 7:"]
    ro = generate(actor, tok, prompts, max_new_tokens=n_tokens, temperature=1.0, top_p=1.0, seeds=list(seeds))
    if ragged:
        for row, n in ((1, 4), (2, 1)):
            ro.response_ids[row, n:] = tok.pad_token_id
            ro.response_mask[row, n:] = 0.0
            ro.logprobs[row, n:] = 0.0
            ro.lengths[row] = n
    return prompts, ro


def test_quick_run_prints_the_format_and_equal_token_counts():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    last = re.fullmatch(r"speedup vs plain: (\d+\.\d\d)x; vs TRL: (\d+\.\d\dx|skipped \(.+\))", lines[-1])
    assert last, lines[-1]
    rows = {
        m.group(1): m
        for m in (
            re.match(
                r"\| (ours|plain|trl) \| (\S+) \[(\S+)-(\S+)\] \| (\d+) \[\d+-\d+\] "
                r"\| (\d+) \| (\d+)-(\d+) \| (\d+\.\d\d)x \|",
                ln,
            )
            for ln in lines
        )
        if m
    }
    expected_sides = {"ours", "plain"} | ({"trl"} if step.trl_missing() is None else set())
    assert set(rows) == expected_sides, out.stdout
    assert last.group(2).startswith("skipped") == ("trl" not in rows)
    for side, m in rows.items():
        assert int(m.group(6)) == 8 * 8, (side, m.group(0))  # 8 responses x exactly 8 tokens on every side
        assert (m.group(7), m.group(8)) == ("8", "8"), (side, m.group(0))
        assert float(m.group(3)) <= float(m.group(2)) <= float(m.group(4))
    assert rows["ours"].group(9) == "1.00"
    assert rows["plain"].group(9) == last.group(1)  # the same ratio of medians in the table and the last line
    if "trl" in rows:
        assert rows["trl"].group(9) + "x" == last.group(2)
    assert any(ln.startswith("| rollout |") for ln in lines) and any(
        ln.startswith("| actor update |") for ln in lines
    )


def test_bad_shape_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit) as e:
        step.main(["--responses", "10", "--mini-batch", "4"])
    assert (
        e.value.code == 2 and "--responses 10 must be a multiple of --mini-batch 4" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        step.main(["--sides", "plain,ours"])
    assert "ours first" in capsys.readouterr().err


def test_suppressed_head_never_samples_eos_or_pad(models, tok):
    actor, _ = models
    _, ro = sampled(actor, tok, n_tokens=20)
    assert bool(ro.truncated.all()) and ro.lengths.tolist() == [20] * 4
    assert not bool(((ro.response_ids == tok.eos_token_id) | (ro.response_ids == tok.pad_token_id)).any())


def test_plain_logprobs_and_values_equal_ours_on_the_same_tokens(models, tok):
    actor, critic = models
    prompts, ro = sampled(actor, tok, ragged=True)
    ids, attn, P = ro.input_ids, ro.attention_mask, ro.prompt_ids.shape[1]
    with torch.no_grad():
        plain_lp, plain_ent = step.plain_logprobs(actor, ids, attn, P, ro.response_ids, 1.0, entropy=True)
        ours_lp, ours_ent = passes.response_logprobs(
            actor, ids, attn, P, ro.response_ids, temperature=1.0, entropy=True
        )
        plain_v = step.plain_values(critic, ids, attn, P)
    m = ro.response_mask
    assert m.sum() < m.numel()  # ragged: padding in the masks
    torch.testing.assert_close(
        plain_lp * m, ro.logprobs, atol=2e-5, rtol=1e-5
    )  # the sampler's behaviour log-probs
    torch.testing.assert_close(plain_lp * m, ours_lp * m, atol=2e-5, rtol=1e-5)  # the update's recomputation
    torch.testing.assert_close(plain_ent * m, ours_ent * m, atol=2e-5, rtol=1e-5)
    exp = Experience.from_rollout(ro, [None] * len(prompts))
    fill_values(exp, critic, chunk=3)
    torch.testing.assert_close(plain_v * m, exp.values, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(
        plain_v * m, passes.state_values(critic, ids, attn, P)[:, :-1] * m, atol=2e-5, rtol=1e-5
    )


def test_plain_encode_equals_our_prompt_encoding(tok):
    from vapo_lit.rollout import encode_prompts

    prompts = ["chain 3 from 7:", "chain 9 from 112:", "chain 0 from 5:"]
    ids, attn = step.plain_encode(tok, prompts)
    ours_ids, ours_attn = encode_prompts(tok, prompts)
    assert torch.equal(ids, ours_ids) and torch.equal(attn, ours_attn)


def test_plain_generate_gives_our_tokens_and_logprobs_when_greedy(models, tok):
    """HF generate and our KV-cached loop pick the same tokens (greedy: no RNG in the way) with the
    same behaviour log-probs (float64, so that no near-tie can split them)."""
    actor = step.build_policy(SMALL, tok).double()
    prompts = ["chain 3 from 7:", "chain 9 from 12:", "chain 0 from 5:"]
    ro = generate(actor, tok, prompts, max_new_tokens=12, temperature=0.0)
    ids, attn = step.plain_encode(tok, prompts)
    resp, lp = step.plain_generate(
        actor,
        ids,
        attn,
        max_new_tokens=12,
        temperature=1.0,
        pad_id=tok.pad_token_id,
        eos_id=tok.eos_token_id,
        greedy=True,
    )
    assert torch.equal(resp, ro.response_ids)
    torch.testing.assert_close(lp.double(), ro.logprobs.double(), atol=1e-6, rtol=1e-6)


def random_batch(seed=0, N=6, R=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([R, 1, 4, R - 2, 7, 2])[:N]
    mask = (torch.arange(R)[None] < lengths[:, None]).float()
    values = torch.randn(N, R, generator=g)  # garbage on padding too: it must not leak in
    scores = (torch.rand(N, generator=g) > 0.5).float()
    rewards = torch.zeros(N, R)
    rewards[torch.arange(N), lengths - 1] = scores
    return mask, values, rewards, scores, lengths, g


def test_reverse_loop_gae_and_whitening_equal_ours():
    mask, values, rewards, _, _, g = random_batch()
    lam = torch.rand(6, generator=g)
    adv, ret = algos.decoupled_gae(rewards, values, mask, lam, 1.0, gamma=1.0)
    torch.testing.assert_close(step.reverse_gae(rewards, values, mask, lam), adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        (step.reverse_gae(rewards, values, mask, 1.0) + values) * mask, ret, atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        step.reverse_gae(rewards, values, mask, 0.9, gamma=0.97),
        algos.gae(rewards, values, mask, 0.9, gamma=0.97)[0],
        atol=1e-5,
        rtol=1e-5,
    )
    torch.testing.assert_close(
        step.plain_whiten(adv, mask), algos.masked_whiten(adv, mask), atol=1e-5, rtol=1e-5
    )


def test_plain_advantages_equal_our_stage_with_the_default_recipe():
    """What PlainPPO.step computes (length-adaptive lambda_policy with the default preset's alpha,
    lambda_critic 1, whitening) equals fill_advantages with the settings VapoModule derives."""
    mask, values, rewards, scores, lengths, _ = random_batch(seed=1)
    exp = SimpleNamespace(rewards=rewards, values=values, mask=mask, n=6, bootstrap=None, scores=scores)
    fill_advantages(exp, AdvantageSettings(alpha=1.0, lam_critic=1.0, whiten=True))
    lam = (1 - 1 / (1.0 * lengths.float())).clamp(0, 1)
    torch.testing.assert_close(
        step.plain_whiten(step.reverse_gae(rewards, values, mask, lam), mask),
        exp.advantages,
        atol=1e-5,
        rtol=1e-5,
    )
    torch.testing.assert_close(
        (step.reverse_gae(rewards, values, mask, 1.0) + values) * mask, exp.returns, atol=1e-5, rtol=1e-5
    )


def test_plain_losses_and_gradients_equal_ours(models, tok):
    actor, critic = models
    prompts, ro = sampled(actor, tok, ragged=True)
    ids, attn, P = ro.input_ids, ro.attention_mask, ro.prompt_ids.shape[1]
    exp = Experience.from_rollout(ro, [None] * len(prompts))
    score(exp, [Verdict(r) for r in (1.0, 0.0, 1.0, 0.0)])
    fill_values(exp, critic)
    fill_advantages(exp, AdvantageSettings(alpha=1.0, lam_critic=1.0, whiten=True))
    old = exp.behaviour_logprobs - 0.3 * torch.randn(
        exp.mask.shape, generator=torch.Generator().manual_seed(0)
    )
    den, pos_den = exp.mask.sum(), (exp.mask * exp.positive[:, None]).sum()

    def grads(model):
        out = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return out

    # actor: token-level clipped loss with Clip-Higher + 0.1 x positive NLL (the default recipe)
    lp = step.plain_logprobs(actor, ids, attn, P, ro.response_ids, 1.0)[0]
    plain_loss = step.plain_policy_loss(
        lp,
        old,
        exp.advantages,
        exp.mask,
        exp.positive,
        eps_low=0.2,
        eps_high=0.28,
        mu=0.1,
        den=den,
        pos_den=pos_den,
    )[0]
    plain_loss.backward()
    plain_grads = grads(actor)
    lp = passes.response_logprobs(actor, ids, attn, P, ro.response_ids, temperature=1.0)[0]
    pg, _ = algos.policy_loss(
        lp, old, exp.advantages, exp.mask, eps_low=0.2, eps_high=0.28, aggregation="token", denominator=den
    )
    ours_loss = pg + 0.1 * algos.positive_nll(lp, exp.mask, exp.positive, denominator=pos_den)[0]
    ours_loss.backward()
    torch.testing.assert_close(plain_loss, ours_loss, atol=1e-5, rtol=1e-5)
    for a, b in zip(plain_grads, grads(actor)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # critic: 0.5 x squared error over the valid tokens
    plain_loss = step.plain_value_loss(step.plain_values(critic, ids, attn, P), exp.returns, exp.mask, den)
    plain_loss.backward()
    plain_grads = grads(critic)
    v = passes.state_values(critic, ids, attn, P)[:, :-1]
    ours_loss = algos.value_loss(v, exp.returns, exp.mask, denominator=den)
    ours_loss.backward()
    torch.testing.assert_close(plain_loss, ours_loss, atol=1e-5, rtol=1e-5)
    for a, b in zip(plain_grads, grads(critic)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_long_runs_a_second_shape_and_reports_it_before_the_last_line(monkeypatch, capsys):
    """`--long` runs the long shape after the given one with fresh workers (shrunk here), prints its
    tables, its speedups on the line before the last, and keeps the last line for the given shape."""
    monkeypatch.setattr(step, "LONG_SHAPE", {"responses": 8, "tokens": 12, "mini_batch": 4, "micro_batch": 2})
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    assert step.main(["--quick", "--long", "--sides", "ours,plain"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    tables = [ln for ln in lines if ln.startswith("batch: ")]
    assert (
        len(tables) == 2
        and tables[0].startswith("batch: 8 responses x 8 tokens")
        and tables[1].startswith("batch: 8 responses x 12 tokens")
    ), tables
    tokens = [
        int(m.group(1))
        for m in (re.match(r"\| ours \| \S+ \[\S+\] \| \d+ \[\d+-\d+\] \| (\d+) \|", ln) for ln in lines)
        if m
    ]
    assert tokens == [8 * 8, 8 * 12]
    assert re.fullmatch(
        r"8 x 12 tokens \(mini-batch 4, micro-batch 2\): speedup vs plain: \d+\.\d\dx; "
        r"vs TRL: skipped \(not in --sides\)",
        lines[-2],
    ), lines[-2]
    assert re.fullmatch(r"speedup vs plain: \d+\.\d\dx; vs TRL: skipped \(not in --sides\)", lines[-1]), (
        lines[-1]
    )


def test_the_decode_floor_counts_the_step_by_hand():
    """benchmarks/generate.py's floor of one token step: FLOPs and bytes written out by hand for a
    small Llama (GQA, untied head), so a wrong count (a missed layer, K without V) fails here."""
    import generate as gen_bench
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=24,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    rows, prompt, tokens, d = 5, 7, 11, 4
    per_layer = 16 * 16 + 2 * (16 * 2 * d) + 16 * 16 + 3 * 16 * 24  # q, k and v (2 kv heads), o, gate/up/down
    flops = 2 * rows * (3 * per_layer + 16 * 50) + 4 * rows * 3 * 4 * d * (
        prompt + 5
    )  # mean context 7 + 10 / 2
    cache = 2 * 3 * rows * 2 * d * (prompt + 5) * 4
    params = 3 * (per_layer + 2 * 16) + 16 + 2 * 50 * 16  # + the norms, embedding and head
    f = gen_bench.step_floor(model, rows, prompt, tokens, rate=1e9, bandwidth=1e8)
    assert f["flops"] == flops and f["cache_bytes"] == cache and f["bytes"] == cache + 4 * params
    assert f["compute_s"] == flops / 1e9 and f["memory_s"] == (cache + 4 * params) / 1e8
    assert f["floor_s"] == max(f["compute_s"], f["memory_s"]) and f["bound"] == "memory"
