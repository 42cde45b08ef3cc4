"""avg@k evaluation: metric arithmetic on scripted responses, and a real (tiny) run."""

import math

import pytest
import torch

from vapo_lit.evaluation import evaluate, format_table, sample_responses, summarize
from vapo_lit.rollout import Rollout
from vapo_lit.tasks import get_task
from vapo_lit.tasks.base import Verdict


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=20, n_buckets=2, eval_per_bucket=3)


def scripted_generate(script):
    """A stand-in rollout engine: response text chosen by script(prompt, call_index)."""
    calls = {"i": 0}

    def fake(prompts, sampling, seed):
        texts = []
        for p in prompts:
            texts.append(script(p, calls["i"]))
            calls["i"] += 1
        n = len(prompts)
        lengths = torch.tensor([len(t.split()) + 1 for t in texts])
        trunc = torch.tensor(["TRUNC" in t for t in texts])
        R = int(lengths.max())
        mask = (torch.arange(R)[None] < lengths[:, None]).float()
        return Rollout(
            prompt_ids=torch.ones(n, 3, dtype=torch.long),
            prompt_mask=torch.ones(n, 3, dtype=torch.long),
            response_ids=torch.zeros(n, R, dtype=torch.long),
            response_mask=mask,
            logprobs=torch.zeros(n, R),
            lengths=lengths,
            terminated=~trunc,
            truncated=trunc,
            texts=texts,
        )

    class Scripted:
        generate = staticmethod(fake)

        def load_weights(self, actor):
            pass

    return Scripted()


def test_metrics_arithmetic(task):
    problems = task.eval_problems()
    by_prompt = {p.prompt: p for p in problems}
    easy, hard = task.bucket_names()

    def script(prompt, i):
        p = by_prompt[prompt]
        j = i % 4  # k = 4 samples per problem, consecutive
        if p.meta["bucket"] == easy:
            return task.solution(p) if j < 3 else "junk"  # 3/4 right, 2 distinct texts
        if j == 0:  # right final answer after a wrong chain: reward 1, strict 0
            toks = task.solution(p).split()
            toks[1] = str((int(toks[1]) + 5) % 10)
            return " ".join(toks)
        return "TRUNC " + str(j)  # distinct garbage, truncated

    engine = scripted_generate(script)
    m = evaluate(engine, task, problems, k=4, batch_size=5)
    assert m["eval/avg@4"] == pytest.approx((0.75 + 0.25) / 2)
    assert m[f"eval/avg@4/{easy}"] == pytest.approx(0.75)
    assert m[f"eval/avg@4/{hard}"] == pytest.approx(0.25)
    assert m["eval/strict_avg@4"] == pytest.approx(0.75 / 2)
    assert m["eval/distinct_per_prompt"] == pytest.approx((2 + 4) / 2)
    assert m["eval/truncated_frac"] == pytest.approx(3 / 8)
    assert m["eval/verifier_errors"] == 0
    assert m["eval/correct_len_min"] == min(2 * p.meta["n"] + 3 for p in problems)
    table = format_table(m, task)
    assert easy in table and hard in table and "overall" in table and "50.00%" in table


def test_verifier_errors_counted(task):
    class Flaky(type(task)):
        def verify(self, problem, response):
            if response == "boom":
                return Verdict(0.0, error="RuntimeError: boom")
            return super().verify(problem, response)

    flaky = Flaky(task.config)
    problems = flaky.eval_problems()[:2]
    engine = scripted_generate(
        lambda prompt, i: "boom" if i % 2 else flaky.solution(next(p for p in problems if p.prompt == prompt))
    )
    m = evaluate(engine, flaky, problems, k=2)
    assert m["eval/verifier_errors"] == 2 and m["eval/avg@2"] == pytest.approx(0.5)


def test_no_strict_key_without_strict(task):
    class NoStrict(type(task)):
        def verify(self, problem, response):
            return Verdict(0.0)

    t = NoStrict(task.config)
    engine = scripted_generate(lambda prompt, i: "x")
    m = evaluate(engine, t, t.eval_problems()[:2], k=2)
    assert "eval/strict_avg@2" not in m and m["eval/avg@2"] == 0.0
    assert math.isnan(m["eval/correct_len_max"])


def test_real_tiny_model_is_deterministic(task):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = task.tokenizer
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    probs = task.eval_problems()
    a = evaluate(model, task, probs, k=3, max_new_tokens=12, batch_size=7, seed=1)
    b = evaluate(model, task, probs, k=3, max_new_tokens=12, batch_size=7, seed=1)
    assert a == b or all((a[k] == b[k]) or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)
    for key in (
        "eval/avg@3",
        "eval/strict_avg@3",
        "eval/response_length",
        "eval/distinct_per_prompt",
        "eval/verifier_errors",
        "eval/truncated_frac",
    ):
        assert key in a
    assert 1 <= a["eval/distinct_per_prompt"] <= 3
    assert a["eval/response_length"] <= 12
    samples = sample_responses(model, task, probs[:2], k=2, max_new_tokens=5)
    assert len(samples) == 4 and samples[0].problem == probs[0] and samples[3].problem == probs[1]
    got, want = (
        summarize(task, probs[:2], samples, 2).log(),
        evaluate(model, task, probs[:2], k=2, max_new_tokens=5),
    )
    assert got.keys() == want.keys() and all(
        got[k] == want[k] or math.isnan(got[k]) and math.isnan(want[k]) for k in got
    )


def test_bad_arguments(task):
    with pytest.raises(ValueError):
        evaluate(None, task, [], k=2)
    with pytest.raises(ValueError):
        evaluate(None, task, task.eval_problems(), k=0)
