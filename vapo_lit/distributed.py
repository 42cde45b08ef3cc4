"""Data-parallel VAPO on Lightning's strategies, with the single-process semantics kept exactly.

How one iteration runs on W ranks (rank r):

1. rollout, score, values: rank r samples its share of the prompts (whole prompt groups; response
   i seeded by its GLOBAL index), scores and values them;
2. `gather_experience`: every rank receives the whole batch (the tensors are small next to a
   forward pass), so advantages, whitening, metrics and the value-pretraining stop rule are the
   single-process ones, computed identically on every rank;
3. updates: the mini-batches are the single-process ones (one permutation seeded by the
   iteration); rank r runs its 1/W slice of each, normalised by the WHOLE mini-batch's token
   counts and multiplied by W, so DDP's gradient average is the single-process gradient; gradients
   are synchronised once per mini-batch (no_sync on the other micro-batches);
4. update statistics are summed (or maxed) across ranks; non-finite losses are agreed on.

`VapoDDPStrategy` is Lightning's DDPStrategy (launcher, process group, collectives, checkpoints)
except that it wraps the actor and the critic in one DistributedDataParallel each (through
`ActorScorer`, so every training forward, chunked or not, goes through its DDP wrapper) instead of
wrapping the LightningModule that holds both: two models under manual optimization, several
backward passes per step.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from vapo_lit import passes


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def is_global_zero_env() -> bool:
    """Whether this process is global rank 0, before the process group exists (from the
    launcher's environment: RANK, or LOCAL_RANK and NODE_RANK; True for a single process). Only
    rank 0 writes the run folder's files before `fit`."""
    import os

    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").strip().isdigit():
            return int(os.environ[key]) == 0
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK"))


# ----------------------------------------------------------------------------- collectives
def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    if not is_distributed():
        return t
    t = t.clone()
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t


def broadcast_object(obj, src: int = 0):
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Make every rank hold rank `src`'s parameters and buffers."""
    if not is_distributed():
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=src)


def _gather_rows(t: torch.Tensor, width: int | None, left: bool, pad) -> torch.Tensor:
    """all_gather of (n, ...) tensors with n equal on every rank; dim 1 padded to `width`."""
    if width is not None and t.shape[1] < width:
        extra = width - t.shape[1]
        t = torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=pad)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return torch.cat(out)


def gather_experience(exp, pad_id: int):
    """The whole batch on every rank, rows in global order (rank 0's first). Prompts are
    re-padded on the left, responses on the right, to the widest rank's."""
    if not is_distributed():
        return exp
    from vapo_lit.experience import Experience

    widths = torch.tensor([exp.prompt_ids.shape[1], exp.mask.shape[1]], device=exp.mask.device)
    P, R = all_reduce(widths, "max").tolist()
    prompt_fields = {"prompt_ids": pad_id, "prompt_mask": 0}
    response_fields = {"response_ids": pad_id, "mask": 0.0, "behaviour_logprobs": 0.0, "rewards": 0.0, "values": 0.0}
    out = {}
    for name, pad in prompt_fields.items():
        out[name] = _gather_rows(getattr(exp, name), P, True, pad)
    for name, pad in response_fields.items():
        v = getattr(exp, name)
        out[name] = None if v is None else _gather_rows(v, R, False, pad)
    for name in ("lengths", "truncated", "scores", "bootstrap"):
        v = getattr(exp, name)
        out[name] = None if v is None else _gather_rows(v, None, False, 0)
    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, (exp.problems, exp.texts, exp.verdicts))
    out["problems"] = [p for part in objects for p in part[0]]
    out["texts"] = [t for part in objects for t in part[1]]
    out["verdicts"] = None if exp.verdicts is None else [v for part in objects for v in part[2]]
    return Experience(group_size=exp.group_size, **out)


# ----------------------------------------------------------------------------- the strategy
class ActorScorer(torch.nn.Module):
    """The actor's training forward as one module call (what DDP and FSDP wrap): log-probs and
    entropy of the response tokens (vapo_lit.passes.response_logprobs)."""

    def __init__(self, actor: torch.nn.Module):
        super().__init__()
        self.actor = actor

    def forward(self, input_ids, attention_mask, prompt_width: int, response_ids, temperature: float,
                entropy: bool = False, chunk: int | None = None):
        return passes.response_logprobs(self.actor, input_ids, attention_mask, prompt_width, response_ids,
                                        temperature=temperature, entropy=entropy, chunk=chunk)


class VapoDDPStrategy(DDPStrategy):
    """Lightning's DDP with one DistributedDataParallel per trained model (see the module doc)."""

    strategy_name = "vapo_ddp"

    def configure_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = self.determine_ddp_device_ids()
        # buffers (rotary tables) are identical on every rank: no need to broadcast them each forward
        params = inspect.signature(DistributedDataParallel.__init__).parameters
        kwargs = {("forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"): False,
                  **self._ddp_kwargs}
        self.lightning_module.set_data_parallel(lambda m: DistributedDataParallel(m, device_ids=device_ids, **kwargs))
