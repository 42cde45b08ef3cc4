"""The long chain-of-thought testbed: the `longchain` task's shape (lengths, log-uniform
n, log buckets, disjoint split), the built-in models' positions for it, and the two ways its base
policy and reward model are trained in length-sorted micro-batches without a mask, each equal (in
float64) to the one masked pass over the whole batch that the default build uses."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from vapo_lit.models import builtin
from vapo_lit.models.builtin import (
    DemoConfig,
    TinyModelConfig,
    batch_from_texts,
    default_model,
    lm_loss,
    sample_weights,
    sequence_errors,
    value_loss,
    value_loss_micro,
)
from vapo_lit.models.value import ValueModel
from vapo_lit.tasks import get_task
from vapo_lit.tasks.chain import bucket_edges


@pytest.fixture(scope="module")
def long_task():
    return get_task("longchain")


def test_longchain_shape(long_task):
    cfg = long_task.config
    assert (cfg.min_n, cfg.max_n, cfg.n_sampling, cfg.bucket_spacing) == (10, 1000, "log", "log")
    assert long_task.bucket_names() == ["len0023-0065", "len0067-0201", "len0203-0633", "len0635-2003"]
    short, long = (long_task.make_problem(3, n) for n in (10, 1000))
    assert len(long_task.tokenizer(long_task.solution(short))["input_ids"]) - 1 + 1 == 23  # + EOS, - BOS
    assert len(long_task.solution(long).split()) + 1 == 2003
    assert long_task.max_new_tokens == 2008
    assert all(
        task.is_eval_prompt(p.meta["x0"], p.meta["n"])
        for task in [long_task]
        for p in long_task.eval_problems()
    )
    assert len(long_task.eval_problems()) == 32
    assert long_task.name == "longchain" and get_task("longchain", max_n=50).config.max_n == 50


def test_log_sampling_is_log_uniform_and_never_an_eval_prompt(long_task):
    probs = long_task.train_problems(20000, seed=3)
    assert not any(long_task.is_eval_prompt(p.meta["x0"], p.meta["n"]) for p in probs)
    ns = [p.meta["n"] for p in probs]
    # log-uniform: each decade of n (10-99, 100-999) holds about half of the prompts
    below = sum(n < 100 for n in ns) / len(ns)
    assert abs(below - math.log(99.5 / 9.5) / math.log(1000.5 / 9.5)) < 0.015
    counts = Counter(ns)
    assert counts[10] > 5 * counts[100] and min(ns) == 10 and max(ns) == 1000
    assert [p.prompt for p in long_task.train_problems(5, seed=3)] == [p.prompt for p in probs[:5]]


def test_uniform_sampling_of_chain_is_unchanged():
    """The default task draws exactly what it drew before the log option existed."""
    task = get_task("chain")
    rng = random.Random("vapo-lit/chain/train/7")
    want = [task.make_problem(*rng.choice(task._train_pairs)).prompt for _ in range(50)]
    assert [p.prompt for p in task.train_problems(50, seed=7)] == want


@pytest.mark.parametrize("spacing", ["linear", "log"])
def test_bucket_edges(spacing):
    edges = bucket_edges(10, 1000, 4, spacing)
    assert edges[0] == 10 and edges[-1] == 1001 and all(b > a for a, b in zip(edges, edges[1:]))
    if spacing == "log":
        assert edges == [10, 32, 100, 316, 1001]
    else:
        assert edges == [10, 258, 506, 753, 1001]
    with pytest.raises(ValueError, match="too many"):
        bucket_edges(1, 100, 20, "log")  # 1, 1.26, ...: two buckets would start at n = 1


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="n_sampling='exp' is not valid; choose one of: uniform, log"):
        get_task("chain", n_sampling="exp")
    with pytest.raises(ValueError, match="bucket_spacing='geo' is not valid; choose one of: linear, log"):
        get_task("chain", bucket_spacing="geo")


def test_default_model_positions(long_task):
    assert default_model(get_task("chain")) == TinyModelConfig()  # the default task's models are unchanged
    assert default_model(long_task).max_position_embeddings == 2048 >= 16 + long_task.max_new_tokens


def tiny_llama(task, seed=0):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = TinyModelConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(builtin.llama_config(task, cfg)).double()


def grads(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_sft_micro_batches_equal_the_masked_pass():
    task = get_task("chain", min_n=3, max_n=40, n_sampling="log")
    rng = random.Random(0)
    probs = task.train_problems(7, seed=1)
    ids, mask, lm = batch_from_texts(
        task.tokenizer, [p.prompt for p in probs], [task.demonstration(p, DemoConfig(), rng) for p in probs]
    )
    assert len(set(mask.sum(1).tolist())) > 3  # lengths differ: padding to cut
    model = tiny_llama(task)
    tokens = lm[:, 1:].sum()
    lm_loss(model, ids, mask, lm.double(), tokens).backward()
    want = grads(model)
    model.zero_grad()
    order = torch.sort(mask.sum(1), descending=True, stable=True).indices
    for rows in order.chunk(3):
        width = int(mask[rows].sum(1).max())
        lm_loss(model, ids[rows, :width], None, lm[rows, :width].double(), tokens).backward()
    for a, b in zip(want, grads(model)):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    # and the training loop's own micro-batched step gives the same gradient (one step, lr 0)
    sft_one = builtin.SFTConfig(steps=1, batch_size=7, lr=0.0, warmup_steps=1, micro_batches=3)
    sft_all = builtin.SFTConfig(steps=1, batch_size=7, lr=0.0, warmup_steps=1)
    seen = {}
    for name, sft in (("micro", sft_one), ("all", sft_all)):
        torch.set_default_dtype(torch.float64)
        try:
            model = builtin.train_sft(
                task,
                TinyModelConfig(
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=32,
                    max_position_embeddings=128,
                ),
                sft,
                seed=0,
                log=lambda m, n=name: seen.setdefault(n, m),
            )
        finally:
            torch.set_default_dtype(torch.float32)
    loss = {k: float(v.split("loss ")[1].split()[0]) for k, v in seen.items()}
    assert loss["micro"] == pytest.approx(loss["all"], rel=1e-9)


def test_reward_model_micro_batches_equal_the_masked_pass():
    """Left-padded rows (prompts of different lengths) moved left, length-sorted, mask-free: the
    loss and every gradient equal the masked pass's, for the outcome RM and for all-token targets."""
    task = get_task("chain", min_n=3, max_n=40)
    critic = ValueModel.from_causal_lm(tiny_llama(task)).double()
    g = torch.Generator().manual_seed(0)
    n, width = 6, 30
    pad = torch.tensor([0, 2, 0, 1, 3, 0])
    length = torch.tensor([30, 12, 25, 20, 9, 16])  # last real column + 1
    ids = torch.randint(4, len(task.tokenizer), (n, width), generator=g)
    mask = torch.zeros(n, width, dtype=torch.long)
    vmask = torch.zeros(n, width, dtype=torch.float64)
    for i in range(n):
        mask[i, pad[i] : length[i]] = 1
        vmask[i, pad[i] + 2 : length[i] - 1] = 1
        ids[i, : pad[i]] = task.tokenizer.pad_token_id
        ids[i, length[i] :] = task.tokenizer.pad_token_id
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    last = length - 1
    for all_tokens in (False, True):
        critic.zero_grad()
        want = value_loss(critic(ids, mask), vmask, reward, last, all_tokens=all_tokens, balance=True)
        want.backward()
        want_grads = grads(critic)
        critic.zero_grad()
        got = value_loss_micro(critic, ids, mask, vmask, reward, last, 4, all_tokens=all_tokens, balance=True)
        assert float(got) == pytest.approx(float(want), rel=1e-12)
        for a, b in zip(want_grads, grads(critic)):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    w = sample_weights(reward, True)
    assert float(w[reward > 0].sum()) == pytest.approx(float(w[reward == 0].sum()))
    assert (
        sequence_errors(
            torch.zeros(n, width, dtype=torch.float64), vmask, reward, last, all_tokens=False
        ).tolist()
        == reward.tolist()
    )


def test_chain_reward_needs_every_step(long_task):
    """reward='chain': a chain whose wrong values cancel mod 10 lands on the right answer; the default
    'answer' reward pays it, 'chain' does not; a right chain is paid by both."""
    p = long_task.make_problem(4, 30)
    right = long_task.solution(p).split()
    lucky = list(right)
    for i in range(10):  # ten +1 errors on the values of steps 30..21, each carried on: they cancel mod 10
        for j in range(2 * i + 1, 2 * 30, 2):
            lucky[j] = str((int(lucky[j]) + 1) % 10)
    assert lucky[-1] == right[-1] and lucky != right
    answer_task = get_task("longchain", reward="answer")
    assert (
        answer_task.verify(p, " ".join(lucky)).reward == 1.0
        and not answer_task.verify(p, " ".join(lucky)).strict
    )
    assert long_task.verify(p, " ".join(lucky)).reward == 0.0
    for task in (answer_task, long_task):
        v = task.verify(p, " ".join(right))
        assert v.reward == 1.0 and v.strict
    with pytest.raises(ValueError, match="reward='steps' is not valid; choose one of: answer, chain"):
        get_task("chain", reward="steps")


def test_every_step_right_but_a_wrong_final_answer_earns_nothing(long_task):
    """reward='chain' pays a chain whose every step is right only with the right final answer too,
    and `strict` (either reward) requires the right final answer."""
    p = long_task.make_problem(7, 40)
    toks = long_task.solution(p).split()
    toks[-1] = str((int(toks[-1]) + 1) % 10)  # the steps all right, then a wrong "=> v"
    for task in (long_task, get_task("longchain", reward="answer")):
        v = task.verify(p, " ".join(toks))
        assert v.reward == 0.0 and v.strict is False and v.error is None, (task.config.reward, v)


def test_step_errors_judge_each_step_from_the_value_written_before_it(long_task):
    """tools/chain_properties.py: one wrong hard step (+1), carried on consistently, is one error;
    a wrong easy value and a wrong counter are counted where they occur (the counter ends the walk)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from chain_properties import step_errors

    p = long_task.make_problem(2, 12)
    toks = long_task.solution(p).split()
    for j in range(2 * 2 + 1, 2 * 12, 2):  # step k = 10 is the third (index 2): +1 from there on
        toks[j] = str((int(toks[j]) + 1) % 10)
    assert step_errors(long_task, p, " ".join(toks)) == {"hard": [1, 1], "easy": [11, 0], "counter": [12, 0]}
    toks[2 * 5 + 1] = str((int(toks[2 * 5 + 1]) + 5) % 10)  # step k = 7 (easy) wrong, NOT carried on: step 6,
    toks[2 * 8] = "3:"  # judged from it, is wrong too; the counter of step k = 4 wrong: the walk ends there
    assert step_errors(long_task, p, " ".join(toks)) == {"hard": [1, 1], "easy": [7, 2], "counter": [9, 1]}
