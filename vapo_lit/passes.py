"""The training-side forward passes over (prompt, response) rows, with the one column convention.

A row is ``input_ids = [prompt (P columns, left-padded) | response (R columns, right-padded)]``.

* The state before response token t is the prefix ending at column P + t - 1, so the critic's
  V(s_t) and the actor's distribution over token t are both read at column P + t - 1.
* The state after the last response token (length l) is read at column P + l - 1 + 1 = P + l:
  its value bootstraps a row the length limit cut off.

:func:`state_values` returns V(s_0) .. V(s_R) (R + 1 columns), :func:`response_logprobs` the
log-probs (and entropy) of the R response tokens. Nothing else in the project slices columns.
"""
from __future__ import annotations

import torch

from vapo_lit import algos
from vapo_lit.rollout import next_token_logits


def state_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """(n, R + 1): column t is V(s_t), the value of the state before response token t; column l
    of a row of length l is the state after its last token."""
    return critic(input_ids, attention_mask)[:, prompt_width - 1:]


def response_logprobs(actor, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                      response_ids: torch.Tensor, *, temperature: float, entropy: bool = False):
    """log pi(y_t | s_t) for every response token (n, R), and its entropy (n, R) when asked
    (else None). Gradients flow through the log-probs; the entropy is detached."""
    logits = next_token_logits(actor, input_ids, attention_mask, temperature=temperature)[:, prompt_width - 1:]
    logp = algos.token_logprobs(logits, response_ids)
    ent = None
    if entropy:
        with torch.no_grad():
            ent = algos.entropy_from_logits(logits)
    return logp, ent
