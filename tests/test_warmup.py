"""The supervised warm-up (vapo_lit.warmup, `vapo-warmup`): demonstrations are played through the
environment exactly as a rollout plays sampled turns, every one scores, the loss is the NLL of the
model's own tokens only, and the command refuses bad input before anything is written."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_chat_episodes import IdScripted, chat_tokenizer

from vapo_lit.engines.episodes import generate_episodes, scripted_episodes
from vapo_lit.rollout import encode_prompts
from vapo_lit.tasks import get_task
from vapo_lit.tasks import wordproblems
from vapo_lit.tasks.math_tools import calculate
from vapo_lit.warmup import WARMUP_FILE, WarmupSettings, _batches, demonstration_rows, warm_up

pytestmark = pytest.mark.filterwarnings(
    "ignore:task 'math_tools'. the tokenizer's chat template has no tools block"
)


@pytest.mark.parametrize("level", wordproblems.LEVELS)
@pytest.mark.parametrize("split", wordproblems.SPLITS)
def test_every_built_in_problems_expression_evaluates_to_its_answer(level, split):
    for seed in (0, 3):
        records = wordproblems.problems(split, seed, level)
        assert all(calculate(r["expression"]) == int(r["answer"]) for r in records)


def _task(tmp_path, family="chatml", **options):
    tok = chat_tokenizer(family)
    tok.save_pretrained(tmp_path / f"tok-{family}")
    return get_task(
        "math_tools", tokenizer=str(tmp_path / f"tok-{family}"), level="one-step", max_turns=2, **options
    )


@pytest.mark.parametrize("family", ["chatml", "plain"])  # plain: no tools block, tools in a system message
def test_a_scripted_episode_is_the_rollout_of_a_model_that_writes_the_script(tmp_path, family):
    task = _task(tmp_path, family)
    tok = task.tokenizer
    problems = task.train_problems(5, seed=1)
    scripts = [task.demonstration(p) for p in problems]
    played = scripted_episodes(task, tok, [p.prompt for p in problems], scripts, max_new_tokens=160)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = [[t for text in s for t in [*enc(text), tok.eos_token_id]] for s in scripts]
    ro = generate_episodes(
        IdScripted(ids, len(tok)), tok, task, [p.prompt for p in problems], max_new_tokens=160, seeds=0
    )
    for i, (got_ids, got_action, got_text) in enumerate(played):
        n = int(ro.lengths[i])
        assert got_ids == ro.response_ids[i, :n].tolist()
        assert got_action == ro.action_mask[i, :n].tolist()
        assert got_text == ro.texts[i] and int(ro.turns[i]) == 2
        assert sum(got_action) == len(ids[i])  # the model's own tokens, each turn's end included
    assert [v.reward for v in task.verify_batch(problems, [t for _, _, t in played])] == [1.0] * 5
    with pytest.raises(ValueError, match="the episode ended before its script"):  # 2 turns at most
        scripted_episodes(task, tok, [problems[0].prompt], [scripts[0] * 2], max_new_tokens=160)
    with pytest.raises(ValueError, match="the script ended before the episode"):
        scripted_episodes(task, tok, [problems[0].prompt], [scripts[0][:1]], max_new_tokens=160)
    task.close()


def test_rows_train_on_the_models_own_tokens_and_refuse_a_wrong_demonstration(tmp_path, monkeypatch):
    task = _task(tmp_path)
    tok = task.tokenizer
    problems = task.train_problems(3, seed=0)
    rows = demonstration_rows(task, tok, problems, max_new_tokens=160)
    for p, row in zip(problems, rows):
        ids, mask = encode_prompts(tok, [p.prompt])  # as a rollout feeds the prompt
        prompt = ids[0][mask[0].bool()].tolist()
        assert row["ids"][: len(prompt)] == prompt and not any(row["targets"][: len(prompt)])
        own = tok.decode([t for t, m in zip(row["ids"], row["targets"]) if m])
        assert own.count("<|im_end|>") == 2 and "<tool_response>" not in own and p.answer in own
    real = type(task).demonstration
    monkeypatch.setattr(
        type(task), "demonstration", lambda self, p: [*real(self, p)[:1], "The answer is \\boxed{0}."]
    )
    with pytest.raises(ValueError, match="a demonstration scores 0.0, not 1"):
        demonstration_rows(task, tok, problems, max_new_tokens=160)
    monkeypatch.undo()
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is 2 + {k}?", "answer": str(2 + k)}) + "\n" for k in range(4))
    )
    own_data = get_task("math_tools", train_path=str(data), tokenizer=str(tmp_path / "tok-chatml"))
    with pytest.raises(ValueError, match="need problems with a worked expression"):
        demonstration_rows(own_data, tok, own_data.train_problems(1, seed=0), max_new_tokens=160)
    task.close()
    own_data.close()


def _tiny_chat_model(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = chat_tokenizer("chatml")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    path = tmp_path / "chat-model"
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _cfg(model, **delta):
    from vapo_lit.config import RunConfig, merge

    options = {"level": "one-step", "max_turns": 2, "instruction": ""}
    return merge(RunConfig(), {"task": "math_tools", "task_options": options, "model": str(model), **delta})


def test_the_first_steps_loss_is_the_nll_of_the_models_own_tokens(tmp_path):
    """Against a float64 reference on the untouched model: the mean NLL over the first batch's target
    tokens (each predicted from the tokens before it)."""
    from vapo_lit.build import task_options_of
    from vapo_lit.models import load_policy

    model_dir = _tiny_chat_model(tmp_path)
    cfg = _cfg(model_dir, ppo={"max_new_tokens": 160})
    settings = WarmupSettings(demonstrations=6, steps=3, batch_size=4, lr=1e-3, seed=2)
    task = get_task(cfg.task, **task_options_of(cfg))
    model, tok = load_policy(cfg.model, task)
    before = copy.deepcopy(model).double()
    rows = demonstration_rows(task, tok, task.train_problems(6, seed=2), max_new_tokens=160)
    ids, mask, loss_mask = _batches(rows, settings, tok.pad_token_id)[0]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(ids.shape[0]):
            n = int(mask[i].sum())
            logp = torch.log_softmax(before(input_ids=ids[i : i + 1, :n]).logits[0], -1)
            for t in range(1, n):
                if loss_mask[i, t]:
                    total -= float(logp[t - 1, ids[i, t]])
                    count += 1
    record = warm_up(cfg, settings, tmp_path / "warm", log=lambda *_: None)
    assert record["loss"][0] == pytest.approx(total / count, rel=1e-5)
    assert len(record["loss"]) == 3 and record["settings"]["seed"] == 2
    task.close()


def test_warm_up_lowers_the_loss_and_writes_a_model_that_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = _tiny_chat_model(tmp_path)
    cfg = _cfg(model_dir, ppo={"max_new_tokens": 160})
    out = tmp_path / "warm"
    record = warm_up(cfg, WarmupSettings(demonstrations=8, steps=24, batch_size=4, lr=3e-3), out, log=print)
    assert sum(record["loss"][-4:]) < 0.7 * sum(record["loss"][:4]), record["loss"]
    assert json.loads((out / WARMUP_FILE).read_text()) == record
    assert not list(tmp_path.glob(".warm.partial"))
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert reloaded.config.vocab_size == len(chat_tokenizer("chatml"))
    with pytest.raises(ValueError, match="exists"):
        warm_up(cfg, WarmupSettings(steps=1), out)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--warmup.steps", "0"], "--steps must be an integer >= 1"),
        (["--warmup.lr", "-1"], "--lr and --grad_clip must be > 0"),
        (["--model", "builtin"], "--model: a warm-up fine-tunes a local chat model folder"),
        (["--task_options", '{"level": "two-step"}'], "level='two-step' is not valid"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, message):
    from vapo_lit.cli.warmup import main

    model_dir = _tiny_chat_model(tmp_path)
    capsys.readouterr()
    out = tmp_path / "warm"
    argv = ["--task", "math_tools", "--model", str(model_dir), "--out", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob(".warm*"))


def test_an_existing_out_is_refused(tmp_path, capsys):
    from vapo_lit.cli.warmup import main

    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "keep.txt").write_text("mine")
    assert main(["--task", "math_tools", "--model", str(tmp_path), "--out", str(tmp_path / "warm")]) == 2
    assert "exists" in capsys.readouterr().err and (tmp_path / "warm" / "keep.txt").read_text() == "mine"
