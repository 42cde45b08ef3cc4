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

import contextlib
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
# One rule decides where a tensor handed to a collective lives: on a device type the process group
# has a backend for. An NCCL group ("cuda:nccl") has none for CPU tensors and refuses them ("No
# backend type associated with device type cpu"); gloo ("cpu:gloo,cuda:gloo") takes either. Every
# collective below moves its tensor there and returns the result on the caller's device.
_DEFAULT_DEVICE_TYPES = {"nccl": ("cuda",), "gloo": ("cpu", "cuda"), "mpi": ("cpu", "cuda")}


def group_device_types(group=None) -> tuple[str, ...]:
    """The device types `group` has a backend for, from its backend config ('cuda:nccl',
    'cpu:gloo,cuda:gloo', or a bare backend name)."""
    config = str(dist.get_backend_config(group))
    if ":" in config:
        return tuple(part.split(":")[0].strip() for part in config.split(","))
    return _DEFAULT_DEVICE_TYPES.get(config, ("cpu", "cuda"))


def choose_comm_device(device_types, tensor_device: torch.device, cuda_device) -> torch.device:
    """Where a tensor on `tensor_device` must go for a group serving `device_types`: where it is if
    the group serves that type, else the current CUDA device (`cuda_device()`, called only then),
    else the CPU."""
    tensor_device = torch.device(tensor_device)
    if tensor_device.type in device_types:
        return tensor_device
    if "cuda" in device_types:
        return torch.device(cuda_device())
    if "cpu" in device_types:
        return torch.device("cpu")
    raise ValueError(
        f"the process group serves device types {list(device_types)}; none can hold a tensor "
        f"on {tensor_device}"
    )


def _current_cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())  # Lightning sets it to the rank's device


def _move(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device)


def comm_tensor(t: torch.Tensor, group=None) -> torch.Tensor:
    """`t` (or a copy) on the device the group's collectives accept."""
    return _move(t, choose_comm_device(group_device_types(group), t.device, _current_cuda))


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum (or max) of `t` over the ranks, on `t`'s device; `t` itself is not modified."""
    if not is_distributed():
        return t
    buf = comm_tensor(t)
    buf = buf.clone() if buf is t else buf
    dist.all_reduce(buf, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return buf.to(t.device)


def agree_any(flag: bool) -> bool:
    """True on every rank when `flag` is True on any: a decision that steers control flow (stop
    a phase, abort after a failed write) must be the same on all ranks, or one rank enters a
    collective alone and hangs."""
    return bool(all_reduce(torch.tensor(1.0 if flag else 0.0, dtype=torch.float64), "max") > 0)


def _broadcast_inplace(t: torch.Tensor, src: int) -> None:
    buf = comm_tensor(t)
    dist.broadcast(buf, src=src)
    if buf is not t:
        t.copy_(buf)


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
            _broadcast_inplace(t.data, src)


def _gather_rows(t: torch.Tensor, width: int | None, left: bool, pad) -> torch.Tensor:
    """all_gather of (n, ...) tensors with n equal on every rank; dim 1 padded to `width`."""
    if width is not None and t.shape[1] < width:
        extra = width - t.shape[1]
        t = torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=pad)
    buf = comm_tensor(t.contiguous())
    out = [torch.empty_like(buf) for _ in range(dist.get_world_size())]
    dist.all_gather(out, buf)
    return torch.cat(out).to(t.device)


def gather_experience(exp, pad_id: int):
    """The whole batch on every rank, rows in global order (rank 0's first). Prompts are
    re-padded on the left, responses on the right, to the widest rank's."""
    if not is_distributed():
        return exp
    from vapo_lit.experience import Experience

    widths = torch.tensor([exp.prompt_ids.shape[1], exp.mask.shape[1]], device=exp.mask.device)
    P, R = all_reduce(widths, "max").tolist()
    prompt_fields = {"prompt_ids": pad_id, "prompt_mask": 0}
    response_fields = {
        "response_ids": pad_id,
        "mask": 0.0,
        "behaviour_logprobs": 0.0,
        "rewards": 0.0,
        "values": 0.0,
        "obs_mask": 0.0,
    }
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

    def forward(
        self,
        input_ids,
        attention_mask,
        prompt_width: int,
        response_ids,
        temperature: float,
        entropy: bool = False,
        chunk: int | None = None,
    ):
        return passes.response_logprobs(
            self.actor,
            input_ids,
            attention_mask,
            prompt_width,
            response_ids,
            temperature=temperature,
            entropy=entropy,
            chunk=chunk,
        )


class VapoDDPStrategy(DDPStrategy):
    """Lightning's DDP with one DistributedDataParallel per trained model (see the module doc)."""

    strategy_name = "vapo_ddp"

    def configure_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = self.determine_ddp_device_ids()
        # buffers (rotary tables) are identical on every rank: no need to broadcast them each forward
        params = inspect.signature(DistributedDataParallel.__init__).parameters
        kwargs = {
            ("forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"): False,
            **self._ddp_kwargs,
        }
        self.lightning_module.set_data_parallel(
            lambda m: DistributedDataParallel(m, device_ids=device_ids, **kwargs)
        )


# ----------------------------------------------------------------------------- FSDP (FSDP2 on Lightning)
def _fsdp2():
    from torch.distributed.fsdp import FSDPModule, fully_shard

    return FSDPModule, fully_shard


def is_sharded(module) -> bool:
    return isinstance(module, _fsdp2()[0])


def _blocks(model: torch.nn.Module) -> list:
    """The repeated transformer blocks (transformers' `_no_split_modules` names them), each its own
    FSDP unit, so only one block's parameters are gathered at a time."""
    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def mixed_precision_policy(precision: str | None):
    """FSDP2's policy for a Lightning precision: under bf16-mixed (16-mixed) the parameters are
    all-gathered in bf16 (fp16), half the traffic and half the unsharded memory of float32, and the
    gradients reduced in float32; None otherwise (gathered in the weights' own dtype). The
    sharded master weights and the optimizer stay float32 either way."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision))
    return None if low is None else MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)


def shard_model(module: torch.nn.Module, precision: str | None = None) -> torch.nn.Module:
    """fully_shard every transformer block of `module`, then `module` itself (the root unit holds
    the embeddings, final norm, output layer or value head), with the mixed-precision policy of
    the Trainer's `precision`. A value head stays float32 (its own unit): values are compared to
    ~1e-3 (vapo_lit/models/value.py)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    fully_shard = _fsdp2()[1]
    policy = mixed_precision_policy(precision)
    kw = {} if policy is None else {"mp_policy": policy}
    for block in _blocks(module):
        fully_shard(block, **kw)
    head = getattr(module, "head", None)
    if policy is not None and isinstance(head, torch.nn.Linear):
        fully_shard(
            head, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        )
    fully_shard(module, **kw)
    return module


def vapo_fsdp_strategy(cfg, accelerator: str):
    """Lightning's ModelParallelStrategy (FSDP2) sharding the actor and the critic separately over
    all processes (data-parallel size = world size, no tensor parallelism); full checkpoints."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    class VapoFSDPStrategy(ModelParallelStrategy):
        strategy_name = "vapo_fsdp"

        def setup_environment(self) -> None:
            self._data_parallel_size = (
                self.num_nodes * self.num_processes
            )  # every process is one data-parallel rank
            super().setup_environment()

    return VapoFSDPStrategy(
        data_parallel_size="auto",
        tensor_parallel_size=1,
        save_distributed_checkpoint=False,
        process_group_backend="nccl" if accelerator == "cuda" else "gloo",
    )


def is_fsdp_strategy(strategy) -> bool:
    return getattr(strategy, "strategy_name", None) == "vapo_fsdp"


@torch.no_grad()
def full_state_dict(module: torch.nn.Module) -> dict | None:
    """The module's full (unsharded) state dict on CPU, on rank 0 only (None elsewhere). A
    collective when the module is sharded: every rank must call it."""
    if not any(is_sharded(m) for m in module.modules()):
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank_and_world()[0] != 0:
        return None
    # tied parameters (an output layer sharing the embedding) come back as separate copies: keep the
    # first name only, as an unsharded model's state dict sharing one tensor would be saved
    first: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
    tied = {name for name, p in module.named_parameters(remove_duplicate=False) if first[id(p)] != name}
    return {k: v for k, v in sd.items() if k not in tied}


@torch.no_grad()
def load_full_state_dict(module: torch.nn.Module, state: dict | None) -> None:
    """Load rank 0's full state dict (`state`; None on the other ranks) into `module` on every rank:
    sharded parameters receive their shards, replicated ones a broadcast."""
    if not any(is_sharded(m) for m in module.modules()):
        if state is not None:
            module.load_state_dict(state)
        broadcast_module(module)
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    rank = rank_and_world()[0]
    for name, live in module.state_dict().items():
        if isinstance(live, DTensor):
            full = (
                state[name].to(live.device, live.dtype)
                if rank == 0
                else torch.empty(live.shape, dtype=live.dtype, device=live.device)
            )
            shard = distribute_tensor(full, live.device_mesh, live.placements, src_data_rank=0)
            live.to_local().copy_(shard.to_local())
        else:
            if rank == 0:
                live.copy_(state[name])
            _broadcast_inplace(live, 0)


class gathered_for_sampling:
    """Context: the sharded actor's parameters gathered for token-by-token sampling (every block
    keeps its gathered parameters for the whole rollout instead of re-gathering at every token).
    Under bf16-mixed they are gathered in bf16 (`mixed_precision_policy`): sampling then runs on
    that bf16 copy, whose whole-model size is half the float32 actor's."""

    def __init__(self, root):
        self.units = [m for m in root.modules() if is_sharded(m)] if root is not None else []

    def __enter__(self):
        for i, m in enumerate(self.units):
            if i:  # (the root unit never reshards after its forward anyway)
                m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        return self

    def __exit__(self, *exc):
        for i, m in enumerate(self.units):
            m.reshard()
            if i:
                m.set_reshard_after_forward(True, recurse=False)
        return False


class DataParallel:
    """The DDP/FSDP wrappers the training forwards go through, one per trained model (keyed by its
    role); empty (the plain modules are used) until a data-parallel strategy calls `wrap`. The
    models stay attributes of the LightningModule, so checkpoints and state dicts are unchanged."""

    def __init__(self):
        self.wrappers: dict = {}

    def __bool__(self) -> bool:
        return bool(self.wrappers)

    def wrap(self, models: dict, wrap) -> None:
        """`models`: {role: module}; `wrap(module)` returns its DDP/FSDP wrapper."""
        self.wrappers = {role: wrap(m) for role, m in models.items()}

    def model(self, role, plain):
        """What role's training forward runs through: its wrapper, else `plain`."""
        return self.wrappers.get(role, plain)

    def sharded(self, role) -> bool:
        return role in self.wrappers and is_sharded(self.wrappers[role])

    def grad_sync(self, role, last: bool):
        """Gradients are synchronised across ranks on the last micro-batch of a mini-batch only."""
        if self.sharded(role):
            self.wrappers[role].set_requires_gradient_sync(last)
        elif role in self.wrappers and not last:
            return self.wrappers[role].no_sync()
        return contextlib.nullcontext()

    def gathered(self, role):
        """Context: role's sharded parameters gathered for sampling (nothing to do unless sharded)."""
        return gathered_for_sampling(self.wrappers[role]) if self.sharded(role) else contextlib.nullcontext()

    @torch.no_grad()
    def lazy_init(self, forwards: dict) -> None:
        """FSDP initialises on the first forward through each ROOT unit; sampling calls the actor's
        blocks directly, so run `forwards[role](wrapper)` (one tiny forward) through each root first,
        then shard the roots again (a root unit keeps its gathered parameters after a forward)."""
        if not any(self.sharded(role) for role in self.wrappers):
            return
        for role, root in self.wrappers.items():
            forwards[role](root)
        for root in self.wrappers.values():
            for m in root.modules():
                if is_sharded(m):
                    m.reshard()
