"""One rank of a 2-process gloo check (tests/test_collectives.py starts two of these):

    python tests/two_ranks.py CASE RANK PORT OUT_DIR

Each case exits 0 when its rule holds on this rank, else prints why and exits 1.

* route: a "cuda:gloo" group (one that, like an NCCL group, serves only the cuda device type)
  refuses a CPU tensor; our collective helpers hand it the tensor moved to the current CUDA
  device. No CUDA here: the move is recorded (`distributed._move`) and the collectives the helpers
  call are recorders that run the same collective on a second, CPU group, so the values are real.
* values: on a plain gloo group the helpers return correct results on the caller's device.
* min_ev: the value-pretraining stop rule, given an explained variance that differs in its last
  bit between the ranks (at the target on rank 0, just below it on rank 1), ends on both ranks.
* save_fail: rank 0 fails while writing a checkpoint (VAPO_LIT_FAULT=checkpoint:1:enospc) and
  stays up, as an NCCL rank does for its peers; rank 1 must raise at once instead of waiting in a
  barrier (each rank writes the time it raised to OUT_DIR/rank<r>.raised; rank 0 then waits up to 90 s for
  OUT_DIR/rank1.done, which rank 1 writes once it raised).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def case_route(rank: int) -> None:
    from vapo_lit import distributed as D
    from vapo_lit.experience import Experience

    try:
        dist.all_reduce(torch.zeros(1))
        raise AssertionError("the cuda:gloo group accepted a CPU tensor")
    except RuntimeError as e:
        check("No backend type associated with device type cpu" in str(e), f"unexpected refusal: {e}")
    check(D.group_device_types() == ("cuda",), f"device types {D.group_device_types()}")
    cpu_group = dist.new_group(backend="gloo")
    moved: dict[int, torch.device] = {}  # id of the tensor the mover returned -> where it was sent
    reached: list[tuple[str, int]] = []

    def fake_move(t, device):
        out = t.clone()  # stands in for t.to(device): this machine has no CUDA
        moved[id(out)] = device
        return out

    def recorder(name, real):
        def call(t, *args, **kw):
            first = t[0] if isinstance(t, list) else t
            tensor = args[0] if name == "all_gather" else first
            reached.append((name, id(tensor)))
            return real(t, *args, **{**kw, "group": cpu_group})

        return call

    D._move = fake_move
    D._current_cuda = lambda: torch.device("cuda", rank)
    dist.all_reduce = recorder("all_reduce", dist.all_reduce)
    dist.all_gather = recorder("all_gather", dist.all_gather)
    dist.broadcast = recorder("broadcast", dist.broadcast)
    real_objects = dist.all_gather_object  # torch moves an object collective's bytes itself (current device)
    dist.all_gather_object = lambda out, obj, **kw: real_objects(out, obj, group=cpu_group)

    total = D.all_reduce(torch.tensor([1.0 + rank], dtype=torch.float64))
    check(total.tolist() == [3.0] and total.device.type == "cpu", f"all_reduce gave {total}")
    check(
        reached[-1][1] in moved,
        "all_reduce handed the group a tensor that did not go through the device rule",
    )
    check(D.agree_any(rank == 1), "agree_any missed rank 1's flag")
    n, R = 2, 3 + rank
    exp = Experience(
        prompt_ids=torch.full((n, 2), rank),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        response_ids=torch.full((n, R), 5),
        mask=torch.ones(n, R),
        behaviour_logprobs=torch.zeros(n, R),
        lengths=torch.full((n,), R),
        truncated=torch.zeros(n, dtype=torch.bool),
        problems=[0] * n,
        texts=["x"] * n,
        group_size=1,
    )
    whole = D.gather_experience(exp, pad_id=0)
    check(
        whole.prompt_ids[:, 0].tolist() == [0, 0, 1, 1] and whole.mask.shape == (4, 4),
        "gather_experience rows",
    )
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.fill_(float(rank))
    D.broadcast_module(lin)
    check(bool((lin.weight == 0).all()), "broadcast_module did not give rank 0's weights")
    names = {name for name, _ in reached}
    check(names == {"all_reduce", "all_gather", "broadcast"}, f"collectives reached: {names}")
    for name, ident in reached:
        check(ident in moved, f"{name} was handed a tensor that did not go through the device rule")
    check(set(moved.values()) == {torch.device("cuda", rank)}, f"moved to {set(moved.values())}")


def case_values(rank: int) -> None:
    from vapo_lit import distributed as D

    check(D.group_device_types() == ("cpu", "cuda"), f"device types {D.group_device_types()}")
    x = torch.tensor([1.0, 2.0 * rank], dtype=torch.float64)
    s, m = D.all_reduce(x), D.all_reduce(x, "max")
    check(s.tolist() == [2.0, 2.0] and m.tolist() == [1.0, 2.0], f"sum {s} max {m}")
    check(x.tolist() == [1.0, 2.0 * rank], "all_reduce modified its input")
    check(D.agree_any(rank == 0) and not D.agree_any(False), "agree_any")


def case_min_ev(rank: int) -> None:
    from vapo_lit.components import build_callbacks
    from vapo_lit.config import ComponentValues
    from vapo_lit.pretrain import PretrainPhase

    target = 0.5
    (cb,) = build_callbacks(
        ["value_pretraining"], ComponentValues(value_pretrain_steps=50, value_pretrain_min_ev=target)
    )

    class Module:
        pretrain = PretrainPhase(
            active=True, steps_done=3, recent_ev=[target if rank == 0 else target - 1e-12]
        )
        ended = False

        def end_value_pretraining(self):
            self.ended = True

    m = Module()
    cb.on_train_batch_end(None, m, None, None, 0)
    decisions = [None, None]
    dist.all_gather_object(decisions, m.ended)
    check(decisions == [True, True], f"the ranks decided {decisions}")


def case_save_fail(rank: int, out: Path) -> None:
    from vapo_lit.checkpoints import RunCheckpoints

    class Strategy:
        def save_checkpoint(self, checkpoint, path):
            if rank == 0:
                torch.save(checkpoint, path)

        def barrier(self, name=None):
            dist.barrier()

    class Connector:
        def dump_checkpoint(self, weights_only=False):
            return {"state": torch.zeros(4)}

    class Trainer:  # Trainer.save_checkpoint's steps, as Lightning 2.6 runs them
        is_global_zero = rank == 0
        strategy = Strategy()
        _checkpoint_connector = Connector()

        def save_checkpoint(self, path, weights_only=None):
            checkpoint = self._checkpoint_connector.dump_checkpoint(weights_only)
            self.strategy.save_checkpoint(checkpoint, path)
            self.strategy.barrier("Trainer.save_checkpoint")

    try:
        RunCheckpoints(out / "run", every=1)._save(Trainer(), "last.ckpt")
        raised = None
    except Exception as e:
        raised = e
    print(f"rank {rank} raised {type(raised).__name__}: {raised}", flush=True)
    (out / f"rank{rank}.raised").write_text(repr(time.time()))
    if rank == 1:
        (out / "rank1.done").write_text(type(raised).__name__)
        check(
            isinstance(raised, RuntimeError) and "another rank failed" in str(raised), f"rank 1: {raised!r}"
        )
        return
    check(isinstance(raised, OSError), f"rank 0: {raised!r}")
    deadline = time.monotonic() + 90
    while not (out / "rank1.done").exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> int:
    case, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    backend = "cuda:gloo" if case == "route" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    sync = dist.new_group(
        backend="gloo"
    )  # a CPU group for the final barrier (the route case's refuses CPU tensors)
    try:
        if case == "save_fail":
            case_save_fail(rank, out)
        else:
            {"route": case_route, "values": case_values, "min_ev": case_min_ev}[case](rank)
    except Exception:
        traceback.print_exc()
        return 1
    print(f"rank {rank}: {case} ok", flush=True)
    dist.barrier(group=sync)  # neither rank tears its group down while the other still talks to it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: gloo's threads, destroyed there, can abort a finished process
    # ("terminate called without an active exception", 1 in 80 runs before this)
    os._exit(code)
