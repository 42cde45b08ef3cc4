"""The GPU user's path on a CPU: a local HF causal-LM directory (built here, never fetched), a
local JSONL math file, `vapo-train --model DIR --critic_init actor --task math`."""

from __future__ import annotations

import csv
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vapo_lit.config import RunConfig, merge
from vapo_lit.presets import PRESETS
from vapo_lit.train import train

WORDS = [
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "Question:",
    "Answer:",
    "what",
    "is",
    "plus",
    "?",
    "\\boxed{",
    "}",
    "The",
    "answer",
    "user",
    "assistant",
    ":",
] + [str(i) for i in range(20)]


def make_model_dir(path):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )
    mc = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    LlamaForCausalLM(mc).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    with open(path, "w") as f:
        for a in range(10):
            for b in range(10):
                f.write(json.dumps({"question": f"what is {a} plus {b} ?", "answer": f"#### {a + b}"}) + "\n")
    return path


def test_own_model_and_math_data_train_end_to_end(tmp_path, data_file):
    model_dir = make_model_dir(tmp_path / "my-model")
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "task": "math",
            "task_options": {"train_path": str(data_file), "max_new_tokens": 12, "max_eval": 8},
            "model": str(model_dir),
            "critic_init": "actor",
            "wandb": "disabled",
            "steps": 2,
            "eval_every": 1,
            "out_dir": str(tmp_path / "runs"),
            "cache_dir": str(tmp_path / "cache"),
            "threads": 1,
            "vapo": {"value_pretrain_steps": 1, "samples_per_prompt": 4},
        },
    )
    summary = train(cfg)
    rows = list(csv.DictReader(open(f"{summary['run_dir']}/metrics.csv")))
    assert len(rows) == 4  # base eval, 1 value-pretraining iteration, 2 PPO iterations
    assert float(rows[-1]["rollout/verifier_errors"]) == 0
    assert "eval/avg@2" in rows[-1] and rows[-1]["eval/avg@2"] != ""
    card = json.loads(open(f"{summary['run_dir']}/run_card.json").read())
    assert card["verifier"]["task"] == "math" and "math-verify" in card["verifier"]["version"]


def test_missing_model_dir_fails_before_training(tmp_path, data_file):
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "task": "math",
            "task_options": {"train_path": str(data_file)},
            "model": str(tmp_path / "nope"),
            "critic_init": "actor",
            "wandb": "disabled",
            "out_dir": str(tmp_path / "runs"),
        },
    )
    with pytest.raises(ValueError, match="nope.*(not a local directory|does not exist)"):
        train(cfg)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.csv"))
