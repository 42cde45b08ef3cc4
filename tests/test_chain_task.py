"""The built-in chain task: prompts, split, tokenizer and an adversarially tested verifier."""

import random

import pytest

from vapo_lit.tasks import get_task, task_names
from vapo_lit.tasks.base import Verdict
from vapo_lit.tasks.chain import ARROW, ChainTask, ChainTaskConfig, DemoConfig, chain_values


@pytest.fixture(scope="module")
def task():
    return get_task("chain")


def test_registered(task):
    assert "chain" in task_names()
    assert isinstance(task, ChainTask)
    small = get_task("chain", max_n=20, n_buckets=2)
    assert small.config.max_n == 20 and len(small.bucket_names()) == 2


def test_chain_values_rule(task):
    # default: v_k = (v_{k+1} + 3) mod 10, counting down from n, v_{n+1} = x0
    assert chain_values(3, 4) == [6, 9, 2, 5]
    assert task.values(3, 4) == [6, 9, 2, 5] and task.make_problem(3, 4).answer == "5"
    # the variant that adds the counter: v_k = (v_{k+1} + k) mod 10
    assert chain_values(3, 4, add_counter=True, add_const=0) == [7, 0, 2, 3]
    t = get_task("chain", add_counter=True, add_const=0, max_n=10)
    p = t.make_problem(3, 4)
    assert p.answer == "3" and t.verify(p, t.solution(p)).reward == 1.0


def test_solution_and_lengths(task):
    tok = task.tokenizer
    for n in (task.config.min_n, 37, task.config.max_n):
        p = task.make_problem(5, n)
        sol = task.solution(p)
        v = task.verify(p, sol)
        assert v == Verdict(1.0, strict=True)
        ids = tok(sol, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert len(ids) + 1 == 2 * n + 3  # + EOS
    assert 2 * task.config.min_n + 3 < 20 and 2 * task.config.max_n + 3 >= 200
    assert task.max_new_tokens >= 2 * task.config.max_n + 3


def test_tokenizer_roundtrip(task, tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = task.tokenizer
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert None not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    p = task.make_problem(2, 12)
    enc = tok(p.prompt)["input_ids"]
    assert enc[0] == tok.bos_token_id and tok.unk_token_id not in enc
    sol = task.solution(p)
    ids = tok(sol, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == sol
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert again(p.prompt)["input_ids"] == enc
    assert again.decode(ids, skip_special_tokens=True) == sol


def test_split_disjoint_and_seeded(task):
    ev = {(p.meta["x0"], p.meta["n"]) for p in task.eval_problems()}
    assert len(ev) == len(task.eval_problems())  # no duplicates
    for seed in range(5):
        tr = {(p.meta["x0"], p.meta["n"]) for p in task.train_problems(500, seed)}
        assert not (tr & ev)
    assert task.train_problems(50, 3) == task.train_problems(50, 3)
    assert task.train_problems(50, 3) != task.train_problems(50, 4)
    assert task.eval_problems() == get_task("chain").eval_problems()
    assert all(not task.is_eval_prompt(p.meta["x0"], p.meta["n"]) for p in task.train_problems(200, 0))


def test_buckets_mixed(task):
    names = task.bucket_names()
    assert len(names) == task.config.n_buckets
    evb = [task.bucket(p) for p in task.eval_problems()]
    assert all(evb.count(b) == task.config.eval_per_bucket for b in names)
    trb = {task.bucket(p) for p in task.train_problems(64, 0)}
    assert trb == set(names)  # difficulty mixed within a batch
    ns = [p.meta["n"] for p in task.eval_problems()]
    assert min(ns) <= 8 and max(ns) >= 99


def test_demonstrations(task):
    rng = random.Random(0)
    p = task.make_problem(4, 60)
    perfect = task.demonstration(p, DemoConfig(error_prob=0.0), rng)
    assert perfect == task.solution(p)
    always = task.demonstration(p, DemoConfig(error_prob=1.0), rng)
    v = task.verify(p, always)
    assert v.reward == 0.0 and v.strict is False  # 6 hard steps, each +1: final off by 6
    # structure of an erroneous demonstration is still valid; errors only on hard steps
    toks = always.split()
    assert len(toks) == 2 * 60 + 2
    good = task.solution(p).split()
    first_diff = next(i for i, (a, b) in enumerate(zip(toks, good)) if a != b)
    assert toks[first_diff - 1] == "60:"
    assert first_diff == 1 and toks[1] == str((4 + 3 + 1) % 10)  # v_60 = x0 + 3 + error_offset
    assert toks[3] == str((4 + 3 + 1 + 3) % 10)  # and the chain goes on from the written value
    # success rate of demonstrations ~ (1 - q) ** (#hard steps)
    wins = sum(task.verify(p, task.demonstration(p, DemoConfig(), rng)).reward for _ in range(2000))
    assert abs(wins / 2000 - 0.6**6) < 0.02


@pytest.mark.parametrize(
    "response",
    [
        "",
        " ",
        "\n\t",
        "<eos>",
        "<pad> <pad>",
        "<unk>",
        "=>",
        "=> 7",
        "7",
        "garbage tokens here ### \x00 \u202e ☃",
        "chain 1 from 7:",
    ],
)
def test_verifier_rejects_malformed(task, response):
    p = task.make_problem(1, 7)
    v = task.verify(p, response)
    assert v.reward == 0.0 and v.error is None and v.strict is False


def test_verifier_adversarial(task):
    p = task.make_problem(1, 7)
    sol = task.solution(p)
    toks = sol.split()
    ans = p.answer
    bad = [
        f"the answer is {ans} {ARROW} {ans}",  # answer buried in junk
        f"junk {sol}",
        f"{sol} junk",
        f"{sol} {sol}",  # extra text
        " ".join(toks[2:]),  # skipped first step
        " ".join(toks[:4] + toks[6:]),  # skipped middle step
        " ".join(toks[:-2]),  # no final answer
        " ".join(toks[:-1] + [toks[-1], ans]),  # two answers
        " ".join(toks[:-2] + [ans, ARROW]),  # right number, wrong place
        " ".join(toks[:-2] + [ARROW, str((int(ans) + 1) % 10)]),  # wrong final answer
        " ".join(t if i != 2 else "5:" for i, t in enumerate(toks)),  # wrong counter
        " ".join(toks[:1] + ["12"] + toks[2:]),  # two-digit value
        " ".join(toks[:1] + ["1", "2"] + toks[2:]),  # two values in one step
        sol.replace(" ", ""),
        f"{ARROW} {ans} " * 10000,  # long repetition
        "1: " * 300000 + ans,  # extremely long text
        "x" * 5_000_000,
    ]
    for r in bad:
        v = task.verify(p, r)
        assert v.reward == 0.0 and v.error is None, r[:80]
    # whitespace variants of the right answer are fine (the tokenizer decodes with single spaces)
    assert task.verify(p, "  " + sol.replace(" ", "\n") + "\n").reward == 1.0


def test_verifier_reward_vs_strict(task):
    p = task.make_problem(6, 23)
    toks = task.solution(p).split()
    # a wrong intermediate value with the right final answer: reward 1 (format + answer), strict False
    toks[1] = str((int(toks[1]) + 3) % 10)
    v = task.verify(p, " ".join(toks))
    assert v.reward == 1.0 and v.strict is False


def test_verifier_never_raises(task):
    from vapo_lit.tasks.base import Problem

    broken = Problem(prompt="chain ? from ?:", answer="1", meta={})
    v = task.verify(broken, "1: 1 => 1")
    assert v.reward == 0.0 and v.error is not None
    v = task.verify(task.make_problem(1, 5), None)  # type: ignore[arg-type]
    assert v.reward == 0.0
    rng = random.Random(1)
    vocab = task.vocab()
    p = task.make_problem(3, 9)
    for _ in range(300):
        text = " ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 40)))
        v = task.verify(p, text)
        assert v.reward in (0.0, 1.0) and v.error is None


def test_bad_config():
    with pytest.raises(ValueError):
        ChainTask(ChainTaskConfig(min_n=10, max_n=5))
    with pytest.raises(ValueError):
        ChainTask(eval_fraction=0.0)
