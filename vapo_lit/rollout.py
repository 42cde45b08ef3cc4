"""The `Rollout` (what every rollout engine returns) and the conventions it carries.

Conventions (the PPO code relies on them):

* prompts are LEFT-padded, responses RIGHT-padded, both with the pad id (the tokenizer's pad
  token, else its EOS);
* positions are counted over real tokens only: ``position_ids = cumsum(attention_mask) - 1``
  (see :func:`vapo_lit.passes.position_ids_from_mask`), so a left-padded prompt gets the same positions as an
  unpadded one. Any later forward pass over (prompt, response) must use the same positions to
  reproduce the log-probs recorded at sampling time; :func:`vapo_lit.passes.sequence_logprobs` does that.
* ``Rollout.logprobs`` = ``log_softmax(logits / temperature)`` of the sampled token, recorded at
  sampling time, BEFORE top-p truncation (the truncation is treated as part of the sampler, not
  of the policy; with top_p = 1 the two coincide). With ``temperature == 0`` the sampler is greedy
  and logprobs are those of ``log_softmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vapo_lit.rng import sample_seed


@dataclass
class Rollout:
    """One response per prompt; every tensor on the sampling model's device."""

    prompt_ids: torch.LongTensor
    """(N, P) LEFT-padded with the pad id."""
    prompt_mask: torch.Tensor
    """(N, P) 1 on real prompt tokens, 0 on padding (long)."""
    response_ids: torch.LongTensor
    """(N, R) RIGHT-padded with the pad id; includes the EOS token when emitted."""
    response_mask: torch.Tensor
    """(N, R) float 1.0 on response tokens (EOS included), 0.0 on padding."""
    logprobs: torch.Tensor
    """(N, R) behaviour log-prob of each sampled token (temperature-scaled, pre top-p), 0 on padding."""
    lengths: torch.LongTensor
    """(N,) response tokens including EOS."""
    terminated: torch.BoolTensor
    """(N,) ended with EOS."""
    truncated: torch.BoolTensor
    """(N,) hit max_new_tokens without EOS (exactly one of terminated/truncated is True)."""
    texts: list[str]
    """Decoded responses, special tokens stripped."""
    action_mask: torch.Tensor | None = None
    """(N, R) float 1.0 on the tokens the policy sampled; 0.0 on observation tokens an environment
    wrote and on padding. None for single-turn rollouts (every response token is an action)."""
    turns: torch.LongTensor | None = None
    """(N,) policy turns of each episode (multi-turn rollouts only)."""

    @property
    def input_ids(self) -> torch.LongTensor:
        """(N, P + R) prompt and response concatenated."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(N, P + R) long mask of real tokens."""
        return torch.cat([self.prompt_mask.long(), self.response_mask.long()], dim=1)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One Rollout from chunks: prompts re-padded on the left, responses on the right."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.prompt_ids.shape[1] for p in parts)
    R = max(p.response_ids.shape[1] for p in parts)

    def left(t, width, value):
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

    def right(t, width, value):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return Rollout(
        prompt_ids=torch.cat([left(p.prompt_ids, P, pad_id) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, P, 0) for p in parts]),
        response_ids=torch.cat([right(p.response_ids, R, pad_id) for p in parts]),
        response_mask=torch.cat([right(p.response_mask, R, 0.0) for p in parts]),
        logprobs=torch.cat([right(p.logprobs, R, 0.0) for p in parts]),
        lengths=torch.cat([p.lengths for p in parts]),
        terminated=torch.cat([p.terminated for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        texts=[t for p in parts for t in p.texts],
        action_mask=None
        if parts[0].action_mask is None
        else torch.cat([right(p.action_mask, R, 0.0) for p in parts]),
        turns=None if parts[0].turns is None else torch.cat([p.turns for p in parts]),
    )


def response_segments(tokenizer, ids, action, length: int) -> list[tuple[bool, int, int, str]]:
    """One response's runs of action and observation tokens (a multi-turn episode's turns and the
    environment's answers), in order: (is_action, start, end, text) with [start, end) response
    columns and the text decoded as `Rollout.texts` is (special tokens left out). `ids`, `action`:
    the response's row of `response_ids` and of the action mask; `length`: its tokens."""
    ids, action = [int(t) for t in ids[:length]], [bool(a) for a in action[:length]]
    out, start = [], 0
    for col in range(1, length + 1):
        if col == length or action[col] != action[start]:
            out.append(
                (action[start], start, col, tokenizer.decode(ids[start:col], skip_special_tokens=True))
            )
            start = col
    return out


def pad_id_of(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    raise ValueError("tokenizer has neither a pad nor an eos token")


def eos_ids_of(model, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's plus the model's generation_config ones (may be a list)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("no EOS token id: set tokenizer.eos_token_id")
    return sorted(ids)


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """A prompt's tokens as a rollout feeds them: with the tokenizer's own special tokens, except a
    BOS the prompt already starts with (a chat template usually writes it itself)."""
    bos = getattr(tokenizer, "bos_token", None)
    return tokenizer(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))["input_ids"]


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Tokenise (with the tokenizer's own special tokens) and LEFT-pad."""
    if not prompts:
        raise ValueError("no prompts")
    enc = [prompt_ids(tokenizer, p) for p in prompts]
    if any(len(e) == 0 for e in enc):
        raise ValueError("a prompt encodes to zero tokens")
    width = max(len(e) for e in enc)
    pad = pad_id_of(tokenizer)
    ids = torch.full((len(enc), width), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, width - len(e) :] = torch.tensor(e, dtype=torch.long)
        mask[i, width - len(e) :] = 1
    return ids, mask


def as_seeds(seeds, n: int) -> torch.LongTensor:
    """(n,) int64 seeds, one per response; an int is expanded to `sample_seed(seed, i)`."""
    if isinstance(seeds, int):
        seeds = [sample_seed(seeds, i) for i in range(n)]
    t = torch.as_tensor(seeds, dtype=torch.int64)
    if t.shape != (n,):
        raise ValueError(f"need one seed per prompt: {n} prompts, seeds of shape {tuple(t.shape)}")
    return t
