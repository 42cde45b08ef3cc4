"""A synthetic task and word-level tokenizer for benchmarks that need a realistic vocabulary
(full-vocabulary logits dominate memory in real LLMs) without downloading anything."""

from __future__ import annotations

from functools import lru_cache

from vapo_lit.tasks.base import Problem, Task, Verdict


@lru_cache(maxsize=None)
def word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab - 4)]
    wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=wl, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


class SyntheticTask(Task):
    """Prompts of `prompt_len` words; every response scores 1 with probability ~1/2 (a hash of its
    text), so advantages are not all zero; responses run to `max_new_tokens`."""

    name, version = "synthetic", "1"

    def __init__(self, vocab: int = 32_000, prompt_len: int = 16, max_new_tokens: int = 64):
        self.vocab, self.prompt_len, self.max_new_tokens = vocab, prompt_len, max_new_tokens

    @property
    def tokenizer(self):
        return word_tokenizer(self.vocab)

    def train_problems(self, n, seed):
        return [
            Problem(" ".join(f"w{(seed * 31 + i * 7 + j) % 900}" for j in range(self.prompt_len)), "0")
            for i in range(n)
        ]

    def eval_problems(self):
        return self.train_problems(4, 0)

    def verify(self, problem, response):
        return Verdict(float(hash(response) % 2 == 0) if response else 0.0)
