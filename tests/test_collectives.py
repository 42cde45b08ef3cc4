"""The rules multi-process runs depend on, checked on CPU: where a tensor handed to a
collective lives, decisions that steer control flow agreed across ranks, a failing rank taking
the others down at once, explicit dtypes under a bf16 default, the cheap checkpoint read.

The 2-process checks run tests/two_ranks.py twice (ranks 0 and 1) on a gloo group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vapo_lit.distributed import choose_comm_device

WORKER = Path(__file__).with_name("two_ranks.py")
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def two_ranks(case: str, tmp_path: Path, timeout: float = 600.0, env: dict | None = None) -> list:
    """Run both ranks of `case`; (returncode, output) per rank. A rank still running after
    `timeout` seconds (generous: starting two processes that import torch takes a minute on a
    loaded 2-core machine) is killed and reported as returncode None (a hang)."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), case, str(r), port, str(tmp_path)],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
        except subprocess.TimeoutExpired:
            p.kill()
            out.append((None, p.communicate()[0]))
    return out


# ----------------------------------------------------------------------------- the device rule
def _cuda(index=0):
    return lambda: torch.device("cuda", index)


def _no_cuda():
    raise AssertionError("the current CUDA device was asked for although the tensor can stay")


@pytest.mark.parametrize(
    "types, where, expected",
    [
        (
            ("cuda",),
            "cpu",
            "cuda:1",
        ),  # NCCL ("cuda:nccl") or "cuda:gloo": a CPU tensor moves to the rank's GPU
        (("cuda",), "cuda:1", "cuda:1"),  # already there
        (("cpu", "cuda"), "cpu", "cpu"),  # gloo: stays on the CPU
        (("cpu", "cuda"), "cuda:0", "cuda:0"),  # gloo also serves CUDA tensors: no copy
        (("cpu",), "meta", "cpu"),  # a group serving only the CPU
    ],
)
def test_a_collective_tensor_goes_where_the_group_has_a_backend(types, where, expected):
    cuda = _cuda(1) if expected.startswith("cuda") and not where.startswith("cuda") else _no_cuda
    assert choose_comm_device(types, torch.device(where), cuda) == torch.device(expected)


def test_a_group_serving_no_device_of_the_tensor_is_refused_by_name():
    with pytest.raises(ValueError, match=r"serves device types \['xpu'\]"):
        choose_comm_device(("xpu",), torch.device("cpu"), _no_cuda)


def test_collective_helpers_hand_a_cuda_only_group_tensors_moved_to_cuda(tmp_path):
    """A "cuda:gloo" group refuses CPU tensors as NCCL does; every helper (all_reduce, agree_any,
    gather_experience, broadcast_module) routes its tensor through the device rule to cuda:rank."""
    results = two_ranks("route", tmp_path)
    for rank, (code, text) in enumerate(results):
        assert code == 0, f"rank {rank}:\n{text}"


def test_collective_helpers_give_correct_results_on_the_callers_device(tmp_path):
    for rank, (code, text) in enumerate(two_ranks("values", tmp_path)):
        assert code == 0, f"rank {rank}:\n{text}"


# ----------------------------------------------------------------------------- agreed decisions
def test_value_pretraining_ends_on_every_rank_when_their_explained_variances_differ_in_the_last_bit(tmp_path):
    for rank, (code, text) in enumerate(two_ranks("min_ev", tmp_path)):
        assert code == 0, f"rank {rank}:\n{text}"


def test_a_rank0_failure_while_saving_stops_the_other_rank_at_once(tmp_path):
    """Rank 0 raises (a full disk) while writing last.ckpt and stays up; rank 1 must raise, saying
    another rank failed, within 60 s of it instead of waiting in a
    barrier (NCCL's would wait 30 minutes; here until rank 0 gives up after 90 s)."""
    results = two_ranks("save_fail", tmp_path, env={"VAPO_LIT_FAULT": "checkpoint:1:enospc"})
    assert results[1][0] is not None, f"rank 1 hung:\n{results[1][1]}"
    for rank, (code, text) in enumerate(results):
        assert code == 0, f"rank {rank}:\n{text}"
    raised = [float((tmp_path / f"rank{r}.raised").read_text()) for r in range(2)]
    assert raised[1] - raised[0] < 60, f"rank 1 raised {raised[1] - raised[0]:.1f} s after rank 0"
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    assert not list((tmp_path / "run" / "checkpoints").glob(".*.tmp"))


# ----------------------------------------------------------------------------- dtypes and the cheap read
def test_the_fixed_gae_lambda_keeps_float32_under_a_bfloat16_default_dtype():
    """bf16-true makes bfloat16 the default dtype inside the training step: lambda 0.95 must not
    become 0.9492. The advantages then match a float64 reference computed with lambda = 0.95."""
    from vapo_lit import algos
    from vapo_lit.experience import AdvantageSettings, Experience, fill_advantages

    g = torch.Generator().manual_seed(0)
    n, R = 4, 6
    lengths = torch.tensor([6, 3, 1, 5])
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(n, R)
    rewards[torch.arange(n), lengths - 1] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    values = torch.rand(n, R, generator=g) * mask
    exp = Experience(
        problems=[0] * n,
        group_size=1,
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        response_ids=torch.zeros(n, R, dtype=torch.long),
        mask=mask,
        behaviour_logprobs=torch.zeros(n, R),
        lengths=lengths,
        truncated=torch.zeros(n, dtype=torch.bool),
        texts=[""] * n,
        rewards=rewards,
        values=values,
    )
    settings = AdvantageSettings(
        estimator="gae", gamma=1.0, lam=0.95, alpha=None, lam_critic=1.0, whiten=False
    )
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        fill_advantages(exp, settings)
    finally:
        torch.set_default_dtype(before)
    assert exp.lam_policy.dtype == torch.float32
    assert float(exp.lam_policy[0]) == pytest.approx(0.95, abs=1e-7)
    ref, _ = algos.gae(rewards.double(), values.double(), mask.double(), 0.95, gamma=1.0)
    torch.testing.assert_close(exp.advantages.double(), ref, rtol=1e-5, atol=1e-6)


def test_resume_reads_the_checkpoint_progress_without_loading_its_tensors(tmp_path, monkeypatch):
    from vapo_lit import checkpoints

    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.arange(6.0)}, "vapo": {"iteration": 7, "ppo_updates": 5}}, path)
    seen = {}
    real = torch.load

    def spy(*args, **kw):
        seen.update(kw)
        return real(*args, **kw)

    monkeypatch.setattr(torch, "load", spy)
    assert checkpoints.checkpoint_progress(path) == {"iteration": 7, "ppo_updates": 5}
    assert seen.get("mmap") is True
