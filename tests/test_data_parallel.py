"""Data-parallel VAPO is the single-process algorithm: 2 CPU processes (gloo, float64
models) over the same global batch give the same parameters (1e-10 relative), the same metric
history and the same run folder as one process, with DDP and with FSDP (actor and critic sharded);
2-process runs SIGKILLed and resumed equal the uninterrupted one. Plus the pieces: the gathered batch under
truncation=bootstrap (2 forked gloo processes, seconds), mini-batch slicing per rank, validation of
the global batch shape.

On any CPU: the ranks and the reference run are processes of this machine under one instruction set
(the ranks inherit the environment, ATEN_CPU_CAPABILITY included), and they are compared in float64
within 1e-9 relative (history) / 1e-10 (parameters), never exactly: what differs between them is
the order of the all-reduce sums. It passes under ATEN_CPU_CAPABILITY=default, avx2 and avx512."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vapo_lit import faults
from vapo_lit.config import RunConfig, merge, validate
from vapo_lit.rng import Stream

TASK = {"min_n": 2, "max_n": 7, "n_buckets": 2, "eval_per_bucket": 3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny policy SFT'd on the shrunken chain task (gets some answers right), as an HF folder."""
    from vapo_lit.models.builtin import SFTConfig, TinyModelConfig, train_sft
    from vapo_lit.tasks import get_task

    path = tmp_path_factory.mktemp("dp") / "model"
    task = get_task("chain", **TASK)
    actor = train_sft(
        task,
        TinyModelConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        SFTConfig(steps=150, batch_size=16, lr=1e-2, warmup_steps=5),
        seed=0,
    )
    actor.save_pretrained(path)
    task.tokenizer.save_pretrained(path)
    return path


def flags(model_dir, out, name, cache, *extra):
    return [
        "--preset",
        "smoke",
        "--model",
        str(model_dir),
        "--task",
        "chain",
        "--task_options",
        json.dumps(TASK),
        "--precision",
        "32-true",
        "--model_dtype",
        "float64",
        "--accelerator",
        "cpu",
        "--wandb",
        "disabled",
        "--threads",
        "1",
        "--steps",
        "3",
        "--eval_every",
        "1",
        "--checkpoint_every",
        "1",
        "--ppo.responses_per_step",
        "16",
        "--ppo.mini_batch_size",
        "8",
        "--ppo.micro_batch_size",
        "2",
        "--ppo.ppo_epochs",
        "2",
        "--vapo.samples_per_prompt",
        "4",
        "--vapo.value_pretrain_steps",
        "1",
        "--out_dir",
        str(out),
        "--name",
        name,
        "--cache_dir",
        str(cache),
        *extra,
    ]


@pytest.fixture(scope="module")
def single(tmp_path_factory, model_dir):
    """The single-process reference run (in this process: no interpreter start-up)."""
    from vapo_lit.cli.args import config_from_args
    from vapo_lit.cli.train import build_parser
    from vapo_lit.train import train

    out = tmp_path_factory.mktemp("single")
    train(config_from_args(build_parser().parse_args(flags(model_dir, out, "single", out / "cache"))))
    return out / "single"


def run_cli(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vapo_lit.cli.train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        **kw,
    )


def rows(run) -> list[dict]:
    return list(csv.DictReader(open(Path(run) / "metrics.csv")))


def assert_same_history(a, b, rel=1e-9):
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        keys = {k for k in x if not k.startswith("perf/")}
        assert keys == {k for k in y if not k.startswith("perf/")}
        for k in keys:
            if x[k] == y[k]:
                continue
            fx, fy = float(x[k]), float(y[k])
            assert (math.isnan(fx) and math.isnan(fy)) or fx == pytest.approx(fy, rel=rel, abs=1e-12), (
                x["step"],
                k,
            )


def assert_same_parameters(a, b, rel=1e-10):
    from safetensors.torch import load_file

    for name in ("policy-final", "critic-final", "policy-best"):
        wa, wb = load_file(f"{a}/{name}/model.safetensors"), load_file(f"{b}/{name}/model.safetensors")
        assert wa.keys() == wb.keys()
        for k in wa:
            assert wa[k].dtype == torch.float64
            scale = float(wa[k].abs().max()) or 1.0
            assert float((wa[k] - wb[k]).abs().max()) <= rel * scale, (name, k)


def listing(run) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in Path(run).rglob("*") if "checkpoints" not in p.parts)


@pytest.mark.slow
def test_two_ddp_processes_equal_one(tmp_path, model_dir, single):
    ddp = run_cli(flags(model_dir, tmp_path, "ddp", tmp_path / "c2", "--devices", "2", "--strategy", "ddp"))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in ddp.stderr  # really two processes
    assert_same_history(single, tmp_path / "ddp")
    assert_same_parameters(single, tmp_path / "ddp")
    assert listing(single) == listing(tmp_path / "ddp")
    card = json.loads((tmp_path / "ddp" / "run_card.json").read_text())
    assert card["hardware"]["strategy"] == "vapo_ddp" and card["hardware"]["devices"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_killed_and_resumed_equal_one_uninterrupted(tmp_path, model_dir, single, strategy):
    # Rank 0 SIGKILLs the launcher and its rank-1 child at once right after its second last.ckpt: a
    # fixed point between two iterations, never a race with a run that may finish first on a fast machine.
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "OMP_NUM_THREADS": "1",
        faults.ENV: "last_saved:2:killgroup",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vapo_lit.cli.train",
            *flags(model_dir, tmp_path, "ddp", tmp_path / "c2", "--devices", "2", "--strategy", strategy),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # only if the fault never fired
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "ddp" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "ddp" / "summary.json").exists()  # it really was cut short
    resumed = run_cli(["--resume", str(tmp_path / "ddp")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_history(single, tmp_path / "ddp")
    assert_same_parameters(single, tmp_path / "ddp")
    assert listing(single) == listing(tmp_path / "ddp")
    card = json.loads((tmp_path / "ddp" / "run_card.json").read_text())
    assert card["hardware"]["strategy"] == f"vapo_{strategy}"


def test_each_rank_takes_an_equal_contiguous_slice_of_every_minibatch(monkeypatch):
    """The mini-batches are the single-process ones; rank r's micro-batches cover its 1/W slice."""
    import vapo_lit.module as module_mod
    from vapo_lit.module import VapoModule

    cfg = merge(
        RunConfig(), {"ppo": {"responses_per_step": 24, "mini_batch_size": 12, "micro_batch_size": 2}}
    )

    class Fake:
        pass

    fake = Fake()
    fake.cfg, fake.iteration = cfg, 5
    one = list(VapoModule._minibatches(fake, 24, Stream.CRITIC_MINIBATCH))
    for world in (2, 3, 6):
        parts = []
        for rank in range(world):
            monkeypatch.setattr(module_mod, "rank_and_world", lambda r=rank, w=world: (r, w))
            parts.append(list(VapoModule._minibatches(fake, 24, Stream.CRITIC_MINIBATCH)))
        for j, (idx, _) in enumerate(one):
            assert all(torch.equal(p[j][0], idx) for p in parts)  # the same mini-batch everywhere
            mine = [torch.cat(p[j][1]) for p in parts]
            assert torch.equal(torch.cat(mine), idx)  # contiguous slices, in rank order, cover it
            assert len({len(p[j][1]) for p in parts}) == 1  # the same number of micro-batches on every rank


# ----------------------------------------------------------------------------- the gathered batch
GATHERED = (
    "lengths",
    "truncated",
    "scores",
    "rewards",
    "values",
    "bootstrap",
    "lam_policy",
    "advantages",
    "returns",
    "mc_returns",
)


def _stub_critic(ids, attn):
    """(n, L) values that depend on the real prefix only (token and position), not on padding.
    `attn` None: the update's mask-free pass (passes.left_aligned), real tokens from column 0."""
    if attn is None:
        return torch.sin(0.7 * ids.double() + 0.3 * torch.arange(1, ids.shape[1] + 1, dtype=torch.float64))
    return torch.sin(0.7 * ids.double() + 0.3 * attn.long().cumsum(1)) * attn


def _batch():
    """8 responses (float64): prompts of 2-5 tokens (rank 1's shorter, so the ranks' widths differ),
    responses of 2-7 tokens; rows 1, 2 and 6 truncated (cut at the limit of 7), half of them correct."""
    from vapo_lit.experience import Experience, score
    from vapo_lit.tasks.base import Verdict

    P, R = 5, 7
    plen, rlen = [5, 3, 4, 2, 3, 2, 3, 2], [4, 7, 7, 2, 5, 3, 7, 6]
    g = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask = torch.zeros(8, P, dtype=torch.long), torch.zeros(8, P, dtype=torch.long)
    response_ids, mask = torch.zeros(8, R, dtype=torch.long), torch.zeros(8, R)
    for i, (p, r) in enumerate(zip(plen, rlen)):
        prompt_ids[i, P - p :], prompt_mask[i, P - p :] = torch.randint(1, 30, (p,), generator=g), 1
        response_ids[i, :r], mask[i, :r] = torch.randint(1, 30, (r,), generator=g), 1.0
    lengths = torch.tensor(rlen)
    exp = Experience(
        problems=list(range(8)),
        group_size=2,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        mask=mask,
        behaviour_logprobs=-mask.double(),
        lengths=lengths,
        truncated=torch.tensor([False, True, True, False, False, False, True, False]),
        texts=[str(i) for i in range(8)],
    )
    score(exp, [Verdict(float(i % 3 == 0)) for i in range(8)])
    return exp


SETTINGS = dict(lam=0.8, lam_critic=1.0, alpha=None, gamma=1.0, whiten=True)


def _gather_rank(rank: int, tmp: str) -> None:
    """One of 2 gloo processes: this rank's half of the batch valued (truncation=bootstrap) on its
    own, gathered, then the advantages of the whole batch, as VapoModule.training_step does."""
    import datetime

    import torch.distributed as dist

    from vapo_lit.distributed import gather_experience
    from vapo_lit.experience import AdvantageSettings, fill_advantages, fill_values

    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/rendezvous",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        mine = _batch().select(torch.arange(4 * rank, 4 * rank + 4), trim=True)
        fill_values(mine, _stub_critic, truncation="bootstrap")
        whole = gather_experience(mine, pad_id=0)
        fill_advantages(whole, AdvantageSettings(**SETTINGS))
        torch.save(
            {f: getattr(whole, f) for f in GATHERED} | {"problems": whole.problems}, f"{tmp}/rank{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


def test_two_ranks_keep_the_bootstrap_values_of_truncated_responses(tmp_path):
    """truncation=bootstrap under data parallelism: each rank values its own rows (its own padding),
    the gather hands every rank the whole batch, and the advantages and critic targets are the
    single-process ones: truncated responses keep V(state after their last token)."""
    from vapo_lit.distributed import gather_experience  # noqa: F401  (imported before the fork)
    from vapo_lit.experience import AdvantageSettings, fill_advantages, fill_values

    ref = _batch()
    fill_values(ref, _stub_critic, truncation="bootstrap")
    fill_advantages(ref, AdvantageSettings(**SETTINGS))
    terminal = _batch()
    fill_values(terminal, _stub_critic, truncation="terminal")
    fill_advantages(terminal, AdvantageSettings(**SETTINGS))
    assert bool((ref.bootstrap[ref.truncated] != 0).all())  # the bootstrap matters here:
    assert (ref.returns - terminal.returns).abs().max() > 0.1  # terminal rows would give other targets
    assert (ref.advantages - terminal.advantages).abs().max() > 0.1

    # forked (as DataLoader workers are): the children start with this process's imports, in a second
    torch.multiprocessing.start_processes(
        _gather_rank, args=(str(tmp_path),), nprocs=2, join=True, start_method="fork"
    )
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["problems"] == list(range(8))  # rows in global order
        for f in GATHERED:
            assert got[f] is not None, (rank, f)
            torch.testing.assert_close(got[f], getattr(ref, f), rtol=0, atol=1e-12, msg=f"rank {rank}: {f}")


def test_global_batch_must_split_evenly_across_processes():
    cfg = merge(
        RunConfig(),
        {
            "devices": "2",
            "ppo": {"responses_per_step": 48, "mini_batch_size": 16, "micro_batch_size": 4},
            "vapo": {"samples_per_prompt": 16},
        },
    )
    with pytest.raises(ValueError, match="prompts per step .* = 3 must be a multiple of the 2 processes"):
        validate(cfg)
    validate(merge(cfg, {"ppo": {"responses_per_step": 64}}))
    with pytest.raises(ValueError, match="ppo.mini_batch_size = 15"):
        validate(
            merge(cfg, {"ppo": {"responses_per_step": 64, "mini_batch_size": 15, "micro_batch_size": 5}})
        )
    with pytest.raises(ValueError, match="devices='x' is not valid"):
        validate(merge(RunConfig(), {"devices": "x"}))


# ----------------------------------------------------------------------------- grids: --devices-per-cell
def _cell_flags(model_dir, cache):
    """flags() without --out_dir/--name (vapo-ablate sets them per cell)."""
    f = flags(model_dir, "X", "X", cache)
    for flag in ("--out_dir", "--name"):
        i = f.index(flag)
        del f[i : i + 2]
    return f


@pytest.mark.slow
def test_a_grid_cell_on_two_devices_equals_the_single_process_run(tmp_path, model_dir, single):
    """`vapo-ablate --devices-per-cell 2`: the cell runs as a process of its own whose launcher
    starts the second rank; its history equals the one-process run of the same config."""
    from vapo_lit.ablate.store import CellStore
    from vapo_lit.cli.ablate import main

    grid = tmp_path / "one.yaml"
    grid.write_text("name: one\nrows:\n  - {label: full}\n")
    code = main(
        [
            "--grid",
            str(grid),
            "--seeds",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--devices-per-cell",
            "2",
            "--strategy",
            "ddp",
            "--no-report",
            *_cell_flags(model_dir, tmp_path / "cache"),
        ]
    )
    assert code == 0, [p.read_text()[-2000:] for p in (tmp_path / "out").glob("runs/*/cell.log")]
    (run,) = [p for p in (tmp_path / "out" / "runs").iterdir() if not p.name.startswith(".")]
    card = json.loads((run / "run_card.json").read_text())
    assert card["hardware"]["world_size"] == 2 and card["hardware"]["devices"] == 2, card["hardware"]
    assert_same_history(single, run)
    assert json.loads((run / "cell.json").read_text())["devices"] == "2"
    store = CellStore(f"sqlite:///{tmp_path / 'out' / 'ablate.db'}")
    assert [t.state.name for t in store.trials()] == ["COMPLETE"]


def test_devices_per_cell_input_is_checked_before_anything_is_written(tmp_path, capsys):
    from vapo_lit.cli.ablate import main

    out = tmp_path / "out"
    for extra, msg in (
        (["--devices-per-cell", "0"], "give a number of devices >= 1"),
        (["--devices-per-cell", "2", "--devices", "2"], "give only --devices-per-cell"),
        (["--devices-per-cell", "2", "--num_nodes", "2"], "a grid cell runs on one machine"),
        (
            ["--devices-per-cell", "2", "--workers", "2", "--accelerator", "gpu", "--precision", "32-true"],
            "needs 4 GPUs; 0 visible",
        ),
    ):
        env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            assert (
                main(
                    ["--seeds", "1", "--drop", "clip_higher", "--preset", "smoke", "--out", str(out), *extra]
                )
                == 2
            )
        finally:
            if env_before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES")
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = env_before
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_each_local_worker_gets_its_own_gpus(monkeypatch):
    from vapo_lit.ablate.runner import _devices_per_cell

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5,6,7")
    base = merge(RunConfig(), {"accelerator": "gpu"})
    cfg, slices = _devices_per_cell(base, 2, workers=2)
    assert cfg.devices == "2" and slices == ["3,4", "5,6"]
    cfg, slices = _devices_per_cell(base, 1, workers=5)
    assert cfg.devices == "1" and slices == ["3", "4", "5", "6", "7"]
    with pytest.raises(ValueError, match="needs 6 GPUs; 5 visible"):
        _devices_per_cell(base, 3, workers=2)
    cfg, slices = _devices_per_cell(merge(RunConfig(), {"accelerator": "cpu"}), 2, workers=3)
    assert cfg.devices == "2" and slices is None  # CPU processes: nothing to pin
