"""The training-side forward passes over (prompt, response) rows, with the one column convention.

A row is ``input_ids = [prompt (P columns, left-padded) | response (R columns, right-padded)]``.

* The state before response token t is the prefix ending at column P + t - 1, so the critic's
  V(s_t) and the actor's distribution over token t are both read at column P + t - 1.
* The state after the last response token (length l) is the prefix ending at that token, read at
  column P + l - 1 (column l of :func:`state_values`): its value bootstraps a row the length limit
  cut off.

:func:`state_values` returns V(s_0) .. V(s_R) (R + 1 columns), :func:`response_logprobs` the
log-probs (and entropy) of the R response tokens. Nothing else in the project slices columns.

Memory: with ``chunk`` set, :func:`response_logprobs` runs the backbone once, then the output
layer over `chunk` response positions at a time, each chunk under activation checkpointing, so
at most (n, chunk, vocab) logits exist at once in the forward and in the backward pass (instead
of (n, P + R, vocab) in float32). The result is the same as the unchunked pass (tested).

No attention mask: :func:`state_values` and :func:`response_logprobs` move each row left by its
prompt padding (:func:`left_aligned`) and run the model causally, without a mask, so SDPA takes its
fused causal kernel instead of a dense (n, 1, L, L) mask (faster: benchmarks/passes.py compares
the two on a padded micro-batch). Every real token sees the same tokens at the same positions as
with the mask: the left padding is gone, and a right-padded response's padding comes after every
real token, where causal attention never looks. The outputs are read back at the same state
columns, so the numbers equal the masked passes' (tested, float64, Llama, Qwen2 and Mistral).
Columns after a row's last state hold whatever the padding computes, as they always did: every
consumer masks them.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from vapo_lit import algos
from vapo_lit.algos.losses import at_least_float32


def left_aligned(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int):
    """(ids, positions, states) for a causal, mask-free pass over [prompt | response] rows: each row
    shifted left by its prompt padding (the freed columns at the right repeat the row's last column:
    they come after every real token, so causal attention never lets a real token see them),
    positions 0, 1, ... (the real tokens' own: ``cumsum(mask) - 1``), and `states` (n, R + 1), the
    shifted column of each state column P - 1 .. P + R - 1 of the unshifted row."""
    n, width = input_ids.shape
    shift = prompt_width - attention_mask[:, :prompt_width].long().sum(1)  # left padding per row
    cols = torch.arange(width, device=input_ids.device)
    ids = input_ids.gather(1, (cols[None, :] + shift[:, None]).clamp(max=width - 1))
    states = (prompt_width - 1 - shift)[:, None] + cols[None, : width - prompt_width + 1]
    return ids, cols[None, :].expand(n, width), states


def _at(x: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """x (n, L, ...) at per-row `columns` (n, C): (n, C, ...)."""
    index = columns.reshape(*columns.shape, *[1] * (x.dim() - 2)).expand(*columns.shape, *x.shape[2:])
    return x.gather(1, index)


def state_values(
    critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int
) -> torch.Tensor:
    """(n, R + 1): column t is V(s_t), the value of the state before response token t; column l
    of a row of length l is the state after its last token. `critic(ids, None)`: a causal pass
    without a mask (see the module docstring)."""
    ids, _, states = left_aligned(input_ids, attention_mask, prompt_width)
    return _at(critic(ids, None), states)


def response_logprobs(
    actor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    response_ids: torch.Tensor,
    *,
    temperature: float,
    entropy: bool = False,
    chunk: int | None = None,
):
    """log pi(y_t | s_t) for every response token (n, R), and its entropy (n, R) when asked
    (else None). Gradients flow through the log-probs; the entropy is detached. `chunk`:
    response positions per output-layer chunk (None: all at once). A causal pass without a
    mask (see the module docstring)."""
    ids, pos, states = left_aligned(input_ids, attention_mask, prompt_width)
    states = states[:, :-1]  # the states that choose the response tokens
    split = output_layer_split(actor) if chunk else None
    if split is None:
        logits = _scaled(
            at_least_float32(_at(actor(input_ids=ids, position_ids=pos).logits, states)), temperature
        )
        logp = algos.token_logprobs(logits, response_ids)
        ent = None
        if entropy:
            with torch.no_grad():
                ent = algos.entropy_from_logits(logits)
        return logp, ent
    backbone, head = split
    h = _at(backbone(input_ids=ids, position_ids=pos).last_hidden_state, states)  # (n, R, H)
    logps, ents = [], []
    for s in range(0, h.shape[1], chunk):
        hs, ys = h[:, s : s + chunk], response_ids[:, s : s + chunk]
        if torch.is_grad_enabled() and hs.requires_grad:
            lp = checkpoint(_chunk_logprobs, head, hs, ys, temperature, use_reentrant=False)
        else:
            lp = _chunk_logprobs(head, hs, ys, temperature)
        logps.append(lp)
        if entropy:
            with torch.no_grad():
                ents.append(algos.entropy_from_logits(_scaled_logits(head, hs.detach(), temperature)))
    return torch.cat(logps, 1), (torch.cat(ents, 1) if entropy else None)


@torch.no_grad()
def micro_batch_logprobs(
    scorer, exp, micro_batches: list, *, temperature: float, chunk: int | None = None
) -> torch.Tensor:
    """(N, R) log-probs of `exp`'s sampled tokens by `scorer` (an ActorScorer or its DDP/FSDP
    wrapper), 0 outside the rows of `micro_batches` and on padding. Each micro-batch is scored as
    the update scores it (`exp.select(rows, trim=True)`: the same rows, width and padding), since
    bf16 kernels round a row differently at another width (up to 1e-4 in the PPO ratio): with the
    update's own micro-batches its first mini-batch's ratio is exactly 1. Rows in no micro-batch
    (another rank's share) stay 0, so a sum over ranks fills every row."""
    out = torch.zeros_like(exp.behaviour_logprobs)
    for rows in micro_batches:
        mb = exp.select(rows, trim=True)
        lp = scorer(
            mb.input_ids, mb.attention_mask, mb.prompt_width, mb.response_ids, temperature, False, chunk
        )[0]
        out[rows.to(out.device), : lp.shape[1]] = lp.to(out.dtype) * mb.mask
    return out


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature if temperature > 0 else logits


def _scaled_logits(head, hs: torch.Tensor, temperature: float) -> torch.Tensor:
    return _scaled(algos.at_least_float32(head(hs)), temperature)


def _chunk_logprobs(head, hs: torch.Tensor, ys: torch.Tensor, temperature: float) -> torch.Tensor:
    return algos.token_logprobs(_scaled_logits(head, hs, temperature), ys)


def output_layer_split(model):
    """(backbone returning last_hidden_state, output layer) when the model's logits are exactly
    output_layer(last hidden state); None for models that post-process logits (soft-capping,
    logit scaling), which then take the unchunked path."""
    cfg = getattr(model, "config", None)
    if (
        cfg is None
        or getattr(cfg, "final_logit_softcapping", None)
        or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0)
    ):
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    backbone = getattr(model, "base_model", None)
    if head is None or backbone is None or backbone is model:
        return None
    return backbone, head


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.LongTensor:
    """Positions over real tokens only (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def next_token_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """(N, L-1, V) logits / T (at least float32) predicting token t+1 from tokens <= t, with the same positions
    as the rollout engines (``cumsum(mask) - 1``). Gradients flow (no no_grad). The PPO update reads
    its log-probs and entropy from these, so the ratio compares like with like."""
    pos = position_ids_from_mask(attention_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
    return _scaled(at_least_float32(logits[:, :-1]), temperature)


def sequence_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """(N, L-1) log-prob of token t+1 given tokens <= t under ``log_softmax(logits / T)``.

    For a :class:`Rollout` ``ro``: ``sequence_logprobs(model, ro.input_ids, ro.attention_mask)[:,
    P - 1:]`` lines up with ``ro.logprobs`` (P = prompt width).
    """
    logp = torch.log_softmax(next_token_logits(model, input_ids, attention_mask, temperature=temperature), -1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
