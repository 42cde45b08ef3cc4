"""The pure stages of one iteration (vapo_lit/experience.py, vapo_lit/passes.py) against plain
references: a stub critic with known per-column outputs pins which column every value and the
bootstrap come from; a stub actor does the same for the log-probs; a real tiny critic shows that
the samples of one prompt share V at response position 0 (that state is the prompt alone); the
score, advantages and diagnostics stages are recomputed by hand on random batches."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from wiring import adaptive_lambda, ref_advantages, whiten

from vapo_lit import passes
from vapo_lit.experience import (
    AdvantageSettings,
    Experience,
    bucket_labels,
    fill_advantages,
    fill_values,
    rollout_stats,
    score,
    value_stats,
)
from vapo_lit.tasks.base import Verdict

PAD = 0


def make_exp(
    lengths, truncated=None, P: int = 5, group_size: int = 1, seed: int = 0, vocab: int = 9
) -> Experience:
    """Random left-padded prompts (row i's last prompt column holds the tag 10 + i), right-padded
    responses of the given lengths (R = max length), random behaviour log-probs."""
    g = torch.Generator().manual_seed(seed)
    n, R = len(lengths), max(lengths)
    lengths = torch.tensor(lengths)
    prompt_len = torch.randint(2, P + 1, (n,), generator=g)
    prompt_mask = (torch.arange(P)[None, :] >= P - prompt_len[:, None]).long()
    prompt_ids = torch.randint(1, vocab, (n, P), generator=g) * prompt_mask
    prompt_ids[:, -1] = 10 + torch.arange(n)
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    response_ids = (torch.randint(1, vocab, (n, R), generator=g) * mask).long()
    truncated = torch.tensor(truncated if truncated is not None else [bool(l == R) for l in lengths.tolist()])
    return Experience(
        problems=[f"p{i // group_size}" for i in range(n)],
        group_size=group_size,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        mask=mask,
        behaviour_logprobs=-torch.rand(n, R, generator=g) * mask,
        lengths=lengths,
        truncated=truncated,
        texts=[f"t{i}" for i in range(n)],
    )


def unshifted_columns(ids):
    """(n, L): each column's index in make_exp's row as built. The passes may move a row left by
    its prompt padding (passes.left_aligned); the tag (the row's only token >= 10) marks the
    prompt's last column, 4 (make_exp's P = 5), wherever it sits now."""
    tag_col = (ids >= 10).long().argmax(1)
    return torch.arange(ids.shape[1])[None, :] + (4 - tag_col)[:, None]


def column_critic(ids, attn):
    """V(prefix ending at column c of the row as built) = 1000 * (row tag) + c."""
    tag = ids.max(1, keepdim=True).values.double()
    return tag * 1000 + unshifted_columns(ids).double()


# ----------------------------------------------------------------------------- values
@pytest.mark.parametrize("chunk", [None, 2, 3])
def test_values_come_from_the_column_before_each_token(chunk):
    exp = make_exp([3, 7, 1, 7, 5], P=5)
    fill_values(exp, column_critic, truncation="bootstrap", chunk=chunk)
    P = exp.prompt_width
    for i in range(exp.n):
        tag, length = 1000 * (10 + i), int(exp.lengths[i])
        for t in range(exp.mask.shape[1]):
            want = tag + P + t - 1 if t < length else 0.0  # V(s_t): the prefix ending at column P + t - 1
            assert float(exp.values[i, t]) == want, (i, t)
        # V(s_l), the state after the last token (the prefix ending at column P + l - 1), only for a cut row
        assert float(exp.bootstrap[i]) == (tag + P + length - 1 if exp.truncated[i] else 0.0), i


def test_value_chunks_are_cut_to_their_longest_response():
    """Rows go to the critic in order of length, each chunk only as wide as its longest response
    (the values themselves are pinned by the test above for every chunking)."""
    exp = make_exp([3, 7, 1, 7, 5], P=5)
    widths = []

    def critic(ids, attn):
        widths.append(ids.shape[1])
        return column_critic(ids, attn)

    fill_values(exp, critic, chunk=2)
    assert widths == [5 + 7, 5 + 5, 5 + 1]  # chunks (7, 7), (5, 3), (1)


def test_terminal_truncation_never_bootstraps():
    exp = make_exp([3, 7, 7], P=5)
    assert bool(exp.truncated.any())
    fill_values(exp, column_critic)  # default: terminal
    assert torch.equal(exp.bootstrap, torch.zeros(3, dtype=exp.bootstrap.dtype))
    with pytest.raises(ValueError, match="truncation='cut' is not valid; choose one of: terminal, bootstrap"):
        fill_values(exp, column_critic, truncation="cut")


def test_state_values_has_one_column_per_state():
    exp = make_exp([2, 4], P=5)
    v = passes.state_values(column_critic, exp.input_ids, exp.attention_mask, exp.prompt_width)
    assert v.shape == (2, 4 + 1)
    assert v[0].tolist() == [10000 + c for c in range(4, 9)]  # columns P - 1 .. P + R - 1


class ColumnActor(torch.nn.Module):
    """Logits over 9 tokens: token 1 gets 0.1 * column (of the row as built) + 0.01 * row tag, the others 0."""

    def forward(self, input_ids, position_ids, attention_mask=None):
        # the causal pass without a mask (passes.left_aligned): every row starts at column 0
        n, width = input_ids.shape
        assert attention_mask is None and torch.equal(position_ids, torch.arange(width).expand(n, width))
        logits = torch.zeros(n, width, 9, dtype=torch.float64)
        tag = input_ids.max(1, keepdim=True).values.double()
        logits[:, :, 1] = 0.1 * unshifted_columns(input_ids).double() + 0.01 * tag
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize("temperature,chunk", [(1.0, None), (0.5, None), (0.5, 2)])
def test_logprobs_come_from_the_column_before_each_token(temperature, chunk):
    exp = make_exp([3, 6, 1], P=5)
    exp.response_ids[:, ::2] = (
        1 * exp.mask[:, ::2].long()
    )  # token 1 (the one the column moves) at even positions
    logp, ent = passes.response_logprobs(
        ColumnActor(),
        exp.input_ids,
        exp.attention_mask,
        exp.prompt_width,
        exp.response_ids,
        temperature=temperature,
        entropy=True,
        chunk=chunk,
    )
    none_asked = passes.response_logprobs(
        ColumnActor(),
        exp.input_ids,
        exp.attention_mask,
        exp.prompt_width,
        exp.response_ids,
        temperature=temperature,
    )[1]
    assert none_asked is None and not ent.requires_grad
    P = exp.prompt_width
    for i in range(exp.n):
        for t in range(int(exp.lengths[i])):
            s = (0.1 * (P + t - 1) + 0.01 * (10 + i)) / temperature
            z = math.log(math.exp(s) + 8)
            want = s - z if int(exp.response_ids[i, t]) == 1 else -z
            assert float(logp[i, t]) == pytest.approx(want, abs=1e-12), (i, t)
            p1 = math.exp(s - z)
            want_ent = -(p1 * math.log(p1) + 8 * math.exp(-z) * (-z))
            assert float(ent[i, t]) == pytest.approx(want_ent, abs=1e-12)


@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_logprobs_of_a_real_model_in_position_chunks(chunk):
    """The chunked pass (backbone once, output layer over `chunk` positions) reads the same
    columns as the plain reference, log-probs and entropy, and passes gradients."""
    from vapo_lit.build import random_tiny_policy
    from vapo_lit.tasks import get_task
    from wiring import ref_logprobs

    task = get_task("chain", max_n=6, n_buckets=1)
    actor, _ = random_tiny_policy(task, 0)
    actor = actor.double()
    exp = make_exp([3, 6, 1, 5], P=5, vocab=len(task.tokenizer))
    logp, ent = passes.response_logprobs(
        actor,
        exp.input_ids,
        exp.attention_mask,
        exp.prompt_width,
        exp.response_ids,
        temperature=0.7,
        entropy=True,
        chunk=chunk,
    )
    want = ref_logprobs(actor, exp, temperature=0.7)
    torch.testing.assert_close(logp * exp.mask, want * exp.mask, rtol=0, atol=1e-10)
    logits = (
        actor(
            input_ids=exp.input_ids,
            attention_mask=exp.attention_mask,
            position_ids=(exp.attention_mask.cumsum(-1) - 1).clamp(min=0),
        ).logits
        / 0.7
    )
    p = torch.softmax(logits[:, exp.prompt_width - 1 : -1], -1)
    torch.testing.assert_close(ent * exp.mask, -(p * p.log()).sum(-1) * exp.mask, rtol=0, atol=1e-10)
    assert logp.requires_grad and not ent.requires_grad


def test_output_layer_split_only_where_logits_are_the_plain_output_layer():
    """The chunked pass needs logits = output_layer(last hidden state); anything else (soft-capping,
    logit scaling, no separate output layer) takes the plain pass."""
    from vapo_lit.build import random_tiny_policy
    from vapo_lit.tasks import get_task

    actor, _ = random_tiny_policy(get_task("chain", max_n=6, n_buckets=1), 0)
    backbone, head = passes.output_layer_split(actor)
    assert head is actor.get_output_embeddings() and backbone is actor.base_model
    actor.config.logit_scale = 1.0
    assert passes.output_layer_split(actor) is not None
    for key, value in (("final_logit_softcapping", 30.0), ("logit_scale", 2.0)):
        setattr(actor.config, key, value)
        assert passes.output_layer_split(actor) is None, key
        setattr(actor.config, key, None)
    assert passes.output_layer_split(actor.base_model) is None  # a backbone has no output layer
    assert passes.output_layer_split(ColumnActor()) is None  # no config at all


def test_group_samples_share_the_value_of_the_prompt_state():
    """With a real tiny critic: V(s_0) is the value of the prompt alone, so the four samples of
    one prompt agree on it; V(s_1) already depends on the sampled first token."""
    from vapo_lit.build import random_tiny_policy
    from vapo_lit.engines import SamplingParams, make_engine
    from vapo_lit.models.value import ValueModel
    from vapo_lit.tasks import get_task

    task = get_task("chain", max_n=6, n_buckets=1)
    actor, tok = random_tiny_policy(task, 0)
    critic = ValueModel.from_causal_lm(actor)
    problems = task.train_problems(3, seed=1)
    k = 4
    per_response = [p for p in problems for _ in range(k)]
    ro = make_engine("hf", actor, tok).generate(
        [p.prompt for p in per_response], SamplingParams(max_new_tokens=6), list(range(len(per_response)))
    )
    exp = Experience.from_rollout(ro, per_response, group_size=k)
    fill_values(exp, critic)
    v0 = exp.values[:, 0].view(-1, k)
    torch.testing.assert_close(v0, v0[:, :1].expand_as(v0), rtol=0, atol=1e-6)
    assert len({round(float(v), 5) for v in v0[:, 0]}) == 3  # three prompts, three values
    first = exp.response_ids[:, 0].view(-1, k)
    differs = [g for g in range(3) if len(set(first[g].tolist())) > 1]
    assert differs, "the test needs a group whose samples start differently"
    v1 = exp.values[:, 1].view(-1, k)
    assert any(float(v1[g].max() - v1[g].min()) > 1e-4 for g in differs)


# ----------------------------------------------------------------------------- score
def test_score_puts_the_verdict_on_the_last_token():
    exp = make_exp([3, 7, 1, 4, 7, 2], group_size=2)
    verdicts = [
        Verdict(1.0, strict=True),
        Verdict(0.0, strict=False),
        Verdict(0.0, error="Timeout"),
        Verdict(1.0, strict=False),
        Verdict(1.0),
        Verdict(1.0, strict=True),
    ]
    st = score(exp, verdicts)
    want = torch.zeros_like(exp.mask)
    for i, (v, length) in enumerate(zip(verdicts, exp.lengths.tolist())):
        want[i, length - 1] = v.reward
    assert torch.equal(exp.rewards, want)
    assert exp.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0] and exp.verdicts == verdicts
    assert exp.positive.tolist() == [True, False, False, True, True, True]
    assert st.score == pytest.approx(4 / 6) and st.accuracy == pytest.approx(4 / 6)
    assert st.strict_accuracy == pytest.approx(2 / 4)  # of the verdicts that carry the check
    assert st.positive_responses == 4 and st.positive_tokens == 3 + 4 + 7 + 2
    assert st.verifier_errors == 1
    assert st.mixed_groups_frac == pytest.approx(2 / 3)  # groups (1,0), (0,1) mixed; (1,1) not
    logged = st.log()
    assert (
        logged["objective/score"] == st.score and logged["rollout/mixed_groups_frac"] == st.mixed_groups_frac
    )
    assert logged["rollout/positive_tokens"] == 16.0 and logged["rollout/verifier_errors"] == 1.0
    assert (
        logged["objective/strict_accuracy"] == st.strict_accuracy
        and logged["objective/accuracy"] == st.accuracy
    )
    assert logged["rollout/positive_responses"] == 4.0
    with pytest.raises(ValueError, match="5 verdicts for 6 responses"):
        score(exp, verdicts[:5])


def test_score_without_groups_or_strict_checks():
    exp = make_exp([2, 3, 3])
    st = score(exp, [Verdict(0.0), Verdict(1.0), Verdict(0.0)])
    assert st.mixed_groups_frac is None and "rollout/mixed_groups_frac" not in st.log()
    assert math.isnan(st.strict_accuracy)
    three = make_exp([2, 3, 3, 1, 2, 3], group_size=3)
    st = score(three, [Verdict(1.0), Verdict(1.0), Verdict(1.0), Verdict(0.0), Verdict(1.0), Verdict(0.0)])
    assert st.mixed_groups_frac == 0.5


# ----------------------------------------------------------------------------- advantages
def scored(lengths, truncated=None, group_size: int = 1, seed: int = 0) -> Experience:
    """An Experience through score and values, with random outcomes and a random critic."""
    exp = make_exp(lengths, truncated, group_size=group_size, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    score(exp, [Verdict(float(torch.rand((), generator=g) > 0.5)) for _ in lengths])
    noise = torch.randn(exp.n, exp.input_ids.shape[1], generator=g, dtype=torch.float64)
    fill_values(exp, lambda ids, attn: noise[: ids.shape[0]] * 0.5, truncation="bootstrap")
    return exp


LENGTHS = [3, 12, 1, 12, 7, 5, 9, 12]


def test_fixed_lambda_shared_by_actor_and_critic():
    exp = scored(LENGTHS)
    st = fill_advantages(exp, AdvantageSettings(lam=0.9, whiten=False))
    want = ref_advantages(exp, [0.9] * exp.n)
    torch.testing.assert_close(exp.advantages.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        exp.returns.double(), (exp.values.double() + want) * exp.mask, rtol=1e-5, atol=1e-6
    )
    mc = ref_advantages(exp, [1.0] * exp.n)
    torch.testing.assert_close(
        exp.mc_returns.double(), (exp.values.double() + mc) * exp.mask, rtol=1e-5, atol=1e-6
    )
    assert exp.lam_policy.tolist() == pytest.approx([0.9] * exp.n)
    assert (
        st.lambda_policy_mean,
        st.lambda_policy_min,
        st.lambda_policy_max,
        st.lambda_policy_clamped,
    ) == pytest.approx((0.9, 0.9, 0.9, 0))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_length_adaptive_and_decoupled_lambdas(gamma):
    exp = scored(LENGTHS, seed=3)
    alpha = 0.3
    st = fill_advantages(
        exp, AdvantageSettings(gamma=gamma, lam=0.95, alpha=alpha, lam_critic=0.5, whiten=True)
    )
    lams = [adaptive_lambda(int(length), alpha, gamma) for length in exp.mask.sum(1).tolist()]
    assert exp.lam_policy.tolist() == pytest.approx(lams, abs=1e-6)
    raw = [(1 - 1 / (alpha * length)) / gamma for length in exp.mask.sum(1).tolist()]
    assert st.lambda_policy_clamped == sum(not 0 <= r <= 1 for r in raw) > 0
    assert (st.lambda_policy_mean, st.lambda_policy_min, st.lambda_policy_max) == pytest.approx(
        (sum(lams) / len(lams), min(lams), max(lams)), abs=1e-6
    )
    assert st.log()["gae/lambda_policy_clamped"] == float(st.lambda_policy_clamped)
    assert st.log()["gae/lambda_policy_mean"] == st.lambda_policy_mean
    actor = whiten(ref_advantages(exp, lams, gamma), exp.mask)
    torch.testing.assert_close(exp.advantages.double(), actor, rtol=1e-4, atol=1e-5)
    critic = ref_advantages(exp, [0.5] * exp.n, gamma)
    torch.testing.assert_close(
        exp.returns.double(), (exp.values.double() + critic) * exp.mask, rtol=1e-5, atol=1e-6
    )


def test_monte_carlo_critic_targets_are_the_outcome():
    """lambda_critic = 1, gamma = 1: on a terminal row the critic target is the outcome at every
    valid token; on a bootstrapped row, the outcome plus V(s_l)."""
    exp = scored(LENGTHS, seed=5)
    assert bool(exp.truncated.any()) and not bool(exp.truncated.all())
    fill_advantages(exp, AdvantageSettings(lam=0.95, alpha=1.0, lam_critic=1.0))
    outcome = (exp.scores + exp.bootstrap)[:, None] * exp.mask
    torch.testing.assert_close(exp.returns.double(), outcome.double(), rtol=0, atol=1e-5)
    torch.testing.assert_close(exp.mc_returns, exp.returns)
    assert not torch.allclose(
        exp.advantages * exp.mask, outcome - exp.values, atol=1e-3
    )  # the actor's lambda < 1


def test_grpo_is_the_group_normalised_outcome():
    exp = scored([3, 5, 2, 6, 4, 4], group_size=3, seed=2)
    exp.scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    st = fill_advantages(exp, AdvantageSettings(estimator="grpo"))
    assert st.log() == {} and exp.returns is None
    g = exp.scores.view(2, 3).double()
    want = torch.zeros(6, dtype=torch.float64)  # the second group is all-equal: exactly 0
    for i in range(3):  # first group: (score - mean) / (unbiased std + 1e-6), by hand
        mean = sum(g[0].tolist()) / 3
        std = math.sqrt(sum((x - mean) ** 2 for x in g[0].tolist()) / 2)
        want[i] = (g[0, i] - mean) / (std + 1e-6)
    want = want.float()
    torch.testing.assert_close(exp.advantages, want[:, None] * exp.mask)
    with pytest.raises(ValueError, match="needs the values stage first"):
        fill_advantages(make_exp([2, 3]), AdvantageSettings())


# ----------------------------------------------------------------------------- diagnostics
def test_rollout_stats():
    exp = make_exp([3, 12, 1, 12, 7, 5, 9, 12], group_size=4)
    st = rollout_stats(exp).log()
    lengths = torch.tensor([3.0, 12, 1, 12, 7, 5, 9, 12])
    assert st == pytest.approx(
        {
            "rollout/response_length": float(lengths.mean()),
            "rollout/response_length_min": 1.0,
            "rollout/response_length_max": 12.0,
            "rollout/response_length_p90": float(torch.quantile(lengths, 0.9)),
            "rollout/truncated_frac": 3 / 8,
            "rollout/prompts": 2.0,
            "rollout/samples_per_prompt": 4.0,
        }
    )


def _ev(v, r):
    """1 - Var(R - V) / Var(R); nan when the returns do not vary (above rounding noise)."""
    var_r = torch.var(r, unbiased=False)
    if var_r < 1e-10:
        return float("nan")
    return float(1 - torch.var(r - v, unbiased=False) / var_r)


@pytest.mark.parametrize("reference", ["targets", "mc"])
def test_value_stats_against_plain_formulas(reference):
    lengths = [3, 40, 1, 25, 60, 5, 19, 50, 33, 8]
    exp = scored(lengths, seed=7)
    fill_advantages(exp, AdvantageSettings(lam=0.8, lam_critic=0.6))
    typed = value_stats(exp, reference)
    st = typed.log()
    ret = exp.returns if reference == "targets" else exp.mc_returns
    v, m = exp.values.double(), exp.mask.bool()
    r = ret.double()
    pos_rows, neg_rows = exp.scores > 0, exp.scores == 0
    sel = lambda rows: m & rows[:, None]  # noqa: E731
    for key, cells in (("", m), ("_pos", sel(pos_rows)), ("_neg", sel(neg_rows))):
        want = _ev(v[cells], r[cells])
        assert st["value/explained_variance" + key] == pytest.approx(want, rel=1e-5, nan_ok=True), key
    assert st["value/mean"] == pytest.approx(float(v[m].mean()), rel=1e-5)
    assert st["value/return_mean"] == pytest.approx(float(r[m].mean()), rel=1e-5)
    assert st["value/bias"] == pytest.approx(float((v - r)[m].mean()), rel=1e-5, abs=1e-7)
    assert st["value/bias_first_token"] == pytest.approx(float((v - r)[:, 0].mean()), rel=1e-5, abs=1e-7)
    pos_of = torch.arange(v.shape[1])[None, :].expand_as(v)
    len_of = exp.mask.sum(1, keepdim=True).expand_as(v)
    for name, key, edges in (("pos", pos_of, (1, 8, 32, 128)), ("len", len_of, (20, 50, 100, 200))):
        bounds = [0, *edges, 10**9]
        for lab, lo, hi in zip(bucket_labels(edges), bounds, bounds[1:]):
            cell = m & (key >= lo) & (key < hi)
            k = f"value/bias_{name}_{lab}"
            if cell.any():
                assert st[k] == pytest.approx(float((v - r)[cell].mean()), rel=1e-5, abs=1e-7), k
            else:
                assert k not in st
    assert "value/bias_pos_32-127" in st and "value/bias_len_50-99" in st and "value/bias_len_lt20" in st
    assert bucket_labels((1, 8, 32, 128)) == ["first", "1-7", "8-31", "32-127", "ge128"]
    assert bucket_labels((20, 50)) == ["lt20", "20-49", "ge50"]
    # the typed fields are what the log shows; the target EV is against the critic's own targets always
    assert typed.explained_variance == st["value/explained_variance"] and typed.bias == st["value/bias"]
    assert st["value/explained_variance_target"] == pytest.approx(
        _ev(v[m], exp.returns.double()[m]), rel=1e-5
    )


# ----------------------------------------------------------------------------- the Experience itself
def test_experience_views_and_select():
    exp = scored([3, 6, 2, 6], seed=4)
    exp.extras["ref"] = torch.arange(4.0)[:, None].expand(4, 6).clone()
    exp.extras["note"] = "kept"
    fill_advantages(exp, AdvantageSettings(alpha=1.0))
    assert torch.equal(exp.input_ids, torch.cat([exp.prompt_ids, exp.response_ids], 1))
    assert torch.equal(exp.attention_mask, torch.cat([exp.prompt_mask, exp.mask.long()], 1))
    assert exp.n == 4 and exp.prompt_width == 5
    idx = torch.tensor([2, 0])
    sub = exp.select(idx)
    for name in (
        "prompt_ids",
        "prompt_mask",
        "response_ids",
        "mask",
        "behaviour_logprobs",
        "lengths",
        "truncated",
        "scores",
        "rewards",
        "values",
        "bootstrap",
        "lam_policy",
        "advantages",
        "returns",
        "mc_returns",
    ):
        assert torch.equal(getattr(sub, name), getattr(exp, name)[idx]), name
    assert sub.problems == [exp.problems[2], exp.problems[0]] and sub.texts == [exp.texts[2], exp.texts[0]]
    assert sub.verdicts == [exp.verdicts[2], exp.verdicts[0]] and sub.group_size == exp.group_size
    assert torch.equal(sub.extras["ref"], exp.extras["ref"][idx]) and sub.extras["note"] == "kept"


def test_from_rollout_keeps_every_field():
    from vapo_lit.rollout import Rollout

    src = make_exp([2, 4, 1])
    ro = Rollout(
        prompt_ids=src.prompt_ids,
        prompt_mask=src.prompt_mask,
        response_ids=src.response_ids,
        response_mask=src.mask,
        logprobs=src.behaviour_logprobs,
        lengths=src.lengths,
        terminated=~src.truncated,
        truncated=src.truncated,
        texts=src.texts,
    )
    exp = Experience.from_rollout(ro, ["a", "b", "c"], group_size=3)
    assert exp.problems == ["a", "b", "c"] and exp.group_size == 3 and exp.texts == src.texts
    for a, b in (
        ("prompt_ids", "prompt_ids"),
        ("mask", "response_mask"),
        ("behaviour_logprobs", "logprobs"),
        ("lengths", "lengths"),
        ("truncated", "truncated"),
        ("response_ids", "response_ids"),
        ("prompt_mask", "prompt_mask"),
    ):
        assert getattr(exp, a) is getattr(ro, b)
    assert Experience.from_rollout(ro, ["a", "b", "c"]).group_size == 1
    with pytest.raises(ValueError, match="2 problems for 3 responses"):
        Experience.from_rollout(ro, ["a", "b"])


def test_length_diagnostics_of_the_advantages_and_the_loss_weight():
    """AdvantageStats.by_length and loss_share_by_length recomputed by hand: per length bucket, the
    mean lambda of its responses, A (before whitening) - A_mc over its tokens and both variances;
    a mini-batch's share of sum w|A| (token- and sample-level weights), buckets of the batch only."""
    from vapo_lit.experience import LENGTH_EDGES, loss_share_by_length

    lengths = [5, 25, 60, 25, 150, 9, 520, 1100]
    exp = scored(lengths, seed=4)
    alpha = 0.05
    st = fill_advantages(exp, AdvantageSettings(alpha=alpha, lam_critic=1.0, whiten=True))
    lams = [adaptive_lambda(length, alpha, 1.0) for length in lengths]
    raw, mc = ref_advantages(exp, lams), ref_advantages(exp, [1.0] * exp.n)
    labels = bucket_labels(LENGTH_EDGES)
    bucket = [sum(length >= e for e in LENGTH_EDGES) for length in lengths]
    assert set(st.by_length) == {labels[b] for b in bucket}  # lt20, 20-49, 50-99, 100-199, 500-999, ge1000
    for b in set(bucket):
        rows = [i for i in range(exp.n) if bucket[i] == b]
        toks = [(float(raw[i, t]), float(mc[i, t])) for i in rows for t in range(lengths[i])]
        n = len(toks)
        got = st.by_length[labels[b]]
        assert got["lambda_policy"] == pytest.approx(sum(lams[i] for i in rows) / len(rows), abs=1e-6)
        assert got["adv_bias"] == pytest.approx(sum(a - m for a, m in toks) / n, abs=1e-5)
        for key, k in (("adv_var", 0), ("adv_var_mc", 1)):
            mean = sum(x[k] for x in toks) / n
            assert got[key] == pytest.approx(sum((x[k] - mean) ** 2 for x in toks) / n, rel=1e-4, abs=1e-6)
    assert st.log()["gae/adv_bias_len_ge1000"] == st.by_length["ge1000"]["adv_bias"]
    assert st.log()["gae/lambda_policy_len_lt20"] == st.by_length["lt20"]["lambda_policy"]
    idx = torch.tensor([0, 2, 4, 6])  # lengths 5, 60, 150, 520
    for aggregation in ("token", "sample"):
        share = loss_share_by_length(
            exp, idx, aggregation, exp.mask[idx].sum() if aggregation == "token" else 4
        )
        mass = {}
        for i in idx.tolist():
            w = 1 / sum(lengths[j] for j in idx.tolist()) if aggregation == "token" else 1 / (4 * lengths[i])
            mass[labels[bucket[i]]] = w * sum(abs(float(exp.advantages[i, t])) for t in range(lengths[i]))
        total = sum(mass.values())
        assert set(share) == set(st.by_length)  # every bucket of the batch; 0 where this mini-batch has none
        for label, s in share.items():
            assert s == pytest.approx(mass.get(label, 0.0) / total, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "settings",
    [
        AdvantageSettings(lam=0.95, whiten=False),  # vanilla PPO: one lambda
        AdvantageSettings(alpha=0.05, lam_critic=0.9, whiten=True),
    ],  # decoupled
    ids=["shared_lambda", "decoupled"],
)
def test_length_diagnostics_measure_against_monte_carlo_not_the_critic_targets(settings):
    """`gae/adv_bias_len_*` and `gae/adv_var_mc_len_*` compare the actor's advantages with the
    Monte-Carlo advantage G - V (lambda = 1), whatever lambda the critic's targets use. Measured
    against the critic's own targets instead, a shared lambda (vanilla PPO) would read bias exactly
    0 and variance ratio exactly 1 in every bucket."""
    from vapo_lit.experience import LENGTH_EDGES

    lengths = [5, 25, 60, 25, 150, 9, 30, 12]
    exp = scored(lengths, seed=6)
    st = fill_advantages(exp, settings)
    lams = (
        [settings.lam] * exp.n
        if settings.alpha is None
        else [adaptive_lambda(length, settings.alpha, 1.0) for length in lengths]
    )
    raw, mc = ref_advantages(exp, lams), ref_advantages(exp, [1.0] * exp.n)
    labels = bucket_labels(LENGTH_EDGES)
    bucket = [sum(length >= e for e in LENGTH_EDGES) for length in lengths]
    logged = st.log()
    for b in set(bucket):
        toks = [
            (float(raw[i, t]), float(mc[i, t]))
            for i in range(exp.n)
            if bucket[i] == b
            for t in range(lengths[i])
        ]
        n = len(toks)
        bias = sum(a - m for a, m in toks) / n
        mean_mc = sum(m for _, m in toks) / n
        var_mc = sum((m - mean_mc) ** 2 for _, m in toks) / n
        assert logged[f"gae/adv_bias_len_{labels[b]}"] == pytest.approx(bias, abs=1e-6)
        assert logged[f"gae/adv_var_mc_len_{labels[b]}"] == pytest.approx(var_mc, rel=1e-5, abs=1e-8)
        assert abs(bias) > 1e-3  # lambda < 1 against a random critic: a bias the reference must show
