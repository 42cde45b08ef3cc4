"""What a user with a real model meets first: a status line within a moment of `vapo-train`'s start
and one before every slow step (also in a grid cell's log); checkpoints whose size follows the
documented formula, with or without the optimizers' moments, earlier ones kept on request, and a
run folder holding what getting-started lists; vLLM's start-up kept quiet unless asked."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from vapo_lit import status
from vapo_lit.build import build_module, builtin_cache_dirs, load_models
from vapo_lit.checkpoints import check_checkpoint, checkpoint_bytes, checkpoint_progress, has_optimizer_state
from vapo_lit.config import RunConfig, merge, to_dict
from vapo_lit.presets import PRESETS
from vapo_lit.train import train

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--preset", "smoke", "--model", "random", "--wandb", "disabled", "--threads", "1"]


def smoke_cfg(tmp_path, **delta) -> RunConfig:
    base = {
        "model": "random",
        "out_dir": str(tmp_path / "runs"),
        "wandb": "disabled",
        "cache_dir": str(tmp_path / "cache"),
    }
    return merge(merge(RunConfig(), PRESETS["smoke"]), {**base, **delta})


def env_of(tmp_path, **extra) -> dict:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


# ----------------------------------------------------------------------------- status lines
TORCH_MARKER = "<torch is imported now>"
WRAPPER = textwrap.dedent(f"""
    import importlib.abc, sys

    class Marker(importlib.abc.MetaPathFinder):  # prints when the first slow import starts
        def find_spec(self, name, path, target=None):
            if name == "torch":
                print({TORCH_MARKER!r}, flush=True)
                sys.meta_path.remove(self)
            return None

    sys.meta_path.insert(0, Marker())
    from vapo_lit.cli.train import main
    sys.exit(main(sys.argv[1:]))
""")


def stamped_lines(cmd, env, timeout=300) -> list[tuple[float, str]]:
    """(seconds since the process started, line) of everything it prints on stdout."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
    err = proc.stderr.read()
    assert proc.wait(timeout=timeout) == 0, err[-3000:]
    return lines


def test_vapo_train_says_what_it_loads_before_each_slow_step(tmp_path):
    runs = tmp_path / "runs"
    lines = stamped_lines(
        [
            sys.executable,
            "-c",
            WRAPPER,
            *SMOKE,
            "--out_dir",
            str(runs),
            "--cache_dir",
            str(tmp_path / "cache"),
        ],
        env_of(tmp_path),
    )
    texts = [text for _, text in lines]
    first_at, first = lines[0]
    # the first line comes before torch is even imported, within a moment of the start, and names what loads
    assert "vapo-train: starting" in first and "task chain" in first and "policy random" in first, texts
    assert "loading torch and Lightning" in first
    assert texts.index(TORCH_MARKER) == 1, texts
    assert first_at < 10, lines[:2]
    steps = [
        "run folder " + str(runs / "vapo-s0"),
        "task: chain",
        "policy: an untrained tiny Llama",
        "models ready in",
        "evaluating the initial policy: 8 problems x 2 samples",
        "iteration 1/5: sampling 16",
    ]
    where = [next(i for i, text in enumerate(texts) if step in text) for step in steps]
    assert where == sorted(where), texts  # in the order they happen
    first_progress = next(i for i, text in enumerate(texts) if text.startswith("vapo-s0  it "))
    assert where[-1] < first_progress
    for i in where:
        assert re.match(r"\d\d:\d\d:\d\d ", texts[i]), texts[i]  # stamped plain lines, also in a pipe
    models = texts[where[3]]
    assert "policy 12.2k parameters, critic 11.3k parameters; each checkpoint about" in models
    # the run folder holds exactly what getting-started's list names
    documented = run_folder_names()
    for path in sorted((runs / "vapo-s0").rglob("*")):
        rel = path.relative_to(runs / "vapo-s0")
        if len(rel.parts) == 1 or rel.parts[0] == "checkpoints":
            name = rel.as_posix() + ("/" if path.is_dir() else "")
            assert documented_as(name, documented), (
                f"{name} is in the run folder but not in getting-started's list"
            )


def run_folder_names() -> set[str]:
    """The `names` of docs/getting-started.md's 'The run folder' list."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text.split("### The run folder", 1)[1].split("Load the policy", 1)[0]
    return set(re.findall(r"`([^`\s]+)`", section))


def documented_as(name: str, documented: set[str]) -> bool:
    """Whether run-folder entry `name` ('metrics.csv', 'policy-best/', 'checkpoints/iter-000004.ckpt') is listed."""
    generic = re.sub(r"iter-\d{6}", "iter-NNNNNN", name)
    if name == "checkpoints/":
        return any(n.startswith("checkpoints/") for n in documented)
    return bool({name, generic, generic.split("/", 1)[-1]} & documented)


def test_a_grid_cell_writes_its_status_lines_into_its_log(tmp_path):
    cfg = smoke_cfg(tmp_path, steps=1, name="cell")
    cell = tmp_path / "cell.json"
    cell.write_text(json.dumps(to_dict(cfg)))
    log = tmp_path / "cell.log"
    with open(log, "wb") as f:
        done = subprocess.run(
            [sys.executable, "-m", "vapo_lit.ablate.cell", str(cell)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env_of(tmp_path),
            timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    for step in (
        "run folder",
        "task: chain",
        "policy: an untrained tiny Llama",
        "models ready in",
        "evaluating the initial policy",
        "iteration 1/3",
    ):
        assert step in text, text
    assert " it 1/3 " not in text  # no per-iteration status line in a grid


def test_status_lines_are_off_unless_asked_and_follow_the_switch(capsys, monkeypatch):
    monkeypatch.delenv(status.ENV, raising=False)
    status.say("not shown")
    with status.announcing():
        status.say("shown")
        monkeypatch.setenv(status.ENV, "0")
        status.say("switched off")
    monkeypatch.setenv(status.ENV, "1")
    status.say("switched on")
    out = capsys.readouterr().out.splitlines()
    assert [line[9:] for line in out] == ["shown", "switched on"]


def test_the_builtin_models_build_line_names_the_cache_folder_and_the_time_it_takes(tmp_path, monkeypatch):
    """The status line before a built-in build names the folder the build writes (the one the cache
    really uses, recorded here from the cache itself) and how long the build took when timed."""
    from vapo_lit import cache, models
    from vapo_lit.models import builtin
    from vapo_lit.models.value import ValueModel
    from vapo_lit.tasks import get_task

    used = []

    def cached_build(
        name, config, build, *, cache_dir=None, load=None
    ):  # where it would build, without building
        used.append(cache.cache_root(cache_dir) / f"{name}-{cache.config_key(config)}")
        return used[-1]

    tiny = build_module(smoke_cfg(tmp_path))
    monkeypatch.setattr(cache, "cached_build", cached_build)
    monkeypatch.setattr(builtin, "_load_policy_dir", lambda path: (tiny.actor, tiny.tokenizer))
    monkeypatch.setattr(ValueModel, "from_pretrained", lambda path, **kw: tiny.critic)
    deltas = [
        {},
        {"builtin_shape": "vllm"},
        {"critic_model": {"hidden_size": 32}},
        {"critic_init": "actor"},
        {"advantage_estimator": "grpo"},
    ]
    configs = [smoke_cfg(tmp_path, model="builtin", **delta) for delta in deltas]
    for cfg in [
        *configs,
        merge(RunConfig(), {"cache_dir": str(tmp_path / "cache")}),
    ]:  # the smoke task, the default
        task = get_task(cfg.task, **cfg.task_options)
        used.clear()
        lines = []
        load_models(cfg, task, log=lines.append)
        dirs = builtin_cache_dirs(cfg, task)
        assert set(used) == set(dirs.values()), (cfg, used, dirs)
        assert lines[0].startswith(f"policy: building the built-in base policy into {dirs['policy']} ("), (
            lines
        )
        minutes = "about 1 min on a 2-core CPU" if cfg.task_options else "about 5 min on a 2-core CPU"
        assert minutes in lines[0] and "cached for later runs" in lines[0]
        if "reward model" in dirs:
            assert (
                lines[1].startswith("critic: building the built-in ")
                and str(dirs["reward model"]) in lines[1]
            )
    assert models.resolve_critic_init("auto", "builtin") == "reward_model"


# ----------------------------------------------------------------------------- checkpoints
def parameters(cfg) -> tuple[int, int]:
    """(parameters, parameter tensors) of the run's actor and critic."""
    module = build_module(cfg)
    params = [p for m in (module.actor, module.critic) for p in m.parameters()]
    return sum(p.numel() for p in params), len(params)


OVERHEAD = 96 << 10
"""Bytes beyond the formula a checkpoint of the random model may take: the pickled structure, the
RNG states, the config and the zip records of its tensors (about 45 kB measured)."""


def test_checkpoint_size_follows_the_formula_with_and_without_optimizer_state(tmp_path):
    """12 bytes per parameter (float32 weights and AdamW's two moments) of actor and critic, or 4
    without the moments; what the status line quotes (checkpoint_bytes) is the same formula."""
    sizes = {}
    for keep in (True, False):
        cfg = smoke_cfg(tmp_path, steps=1, eval_every=0, name=f"opt-{keep}", checkpoint_optimizer=keep)
        train(cfg)
        path = Path(cfg.out_dir) / cfg.name / "checkpoints" / "last.ckpt"
        sizes[keep] = path.stat().st_size
        assert has_optimizer_state(path) is keep
    P, tensors = parameters(smoke_cfg(tmp_path))
    assert 0 <= sizes[True] - 12 * P < OVERHEAD, (sizes, P)
    assert 0 <= sizes[False] - 4 * P < OVERHEAD, (sizes, P)
    # the moments, and the zip records of each parameter's two moments and step (about 260 bytes each)
    assert 0 <= sizes[True] - sizes[False] - 8 * P < 3 * tensors * 512, (sizes, P, tensors)
    module = build_module(smoke_cfg(tmp_path))
    assert checkpoint_bytes([module.actor, module.critic], optimizer=True) == 12 * P
    assert checkpoint_bytes([module.actor, module.critic], optimizer=False) == 4 * P


class CrashAt(Callback):
    def __init__(self, iteration):
        self.iteration = iteration

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.iteration == self.iteration:
            raise KeyboardInterrupt


class AdamSteps(Callback):
    """The actor's AdamW step count when this process's first iteration starts."""

    def __init__(self):
        self.step = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.step is None:
            opt = trainer.optimizers[0]
            state = opt.state[opt.param_groups[0]["params"][0]]
            self.step = float(state["step"]) if "step" in state else 0.0


def rows(run_dir) -> list[dict]:
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in csv.DictReader(f)]


@pytest.mark.parametrize("keep", [True, False])
def test_a_run_resumes_from_a_checkpoint_with_or_without_the_optimizers_moments(tmp_path, keep):
    """With the moments the resumed run is the uninterrupted one; without them it resumes, warns, and
    its optimizers start afresh (step 0) where the checkpoint left off, so what follows differs."""
    base = dict(
        steps=4, eval_every=2, checkpoint_every=1, checkpoint_optimizer=keep, vapo={"value_pretrain_steps": 1}
    )
    full = smoke_cfg(tmp_path, name="full", cache_dir=str(tmp_path / "c1"), **base)
    train(full)
    broken = smoke_cfg(tmp_path, name="broken", cache_dir=str(tmp_path / "c2"), **base)
    with pytest.raises(BaseException):
        train(broken, extra_callbacks=[CrashAt(3)])
    steps = AdamSteps()
    if keep:
        train(broken, resume=True, extra_callbacks=[steps])
    else:
        with pytest.warns(
            RuntimeWarning, match="checkpoint_optimizer=false: the actor's and the critic's AdamW moments"
        ):
            train(broken, resume=True, extra_callbacks=[steps])
    a, b = rows(tmp_path / "runs" / "full"), rows(tmp_path / "runs" / "broken")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [str(i) for i in range(6)]
    assert a[:4] == b[:4]  # the base eval and iterations 1-3, written before the crash
    p = (
        broken.ppo
    )  # before the crash: iterations 2 and 3 updated the actor (iteration 1 was value pretraining)
    assert steps.step == (2 * p.ppo_epochs * p.responses_per_step // p.mini_batch_size if keep else 0)
    assert (a[4:] == b[4:]) is keep


def test_checkpoint_keep_keeps_the_earlier_checkpoints_besides_last(tmp_path):
    cfg = smoke_cfg(
        tmp_path, name="kept", steps=3, eval_every=0, checkpoint_keep=2
    )  # iterations 1-5, one save each
    train(cfg)
    folder = Path(cfg.out_dir) / "kept" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["iter-000003.ckpt", "iter-000004.ckpt", "last.ckpt"]
    for name, iteration in (("iter-000003.ckpt", 3), ("iter-000004.ckpt", 4), ("last.ckpt", 5)):
        check_checkpoint(folder / name)
        assert checkpoint_progress(folder / name)["iteration"] == iteration
    assert (
        len({(folder / n).stat().st_ino for n in ("iter-000003.ckpt", "iter-000004.ckpt", "last.ckpt")}) == 3
    )
    (folder / "last.ckpt").write_bytes(
        b"not a checkpoint"
    )  # a damaged last.ckpt points at the newest kept one
    with pytest.raises(ValueError, match=r"continue from iter-000004\.ckpt instead"):
        check_checkpoint(folder / "last.ckpt")


def test_checkpoint_settings_are_checked_in_one_line(tmp_path):
    from vapo_lit.cli.train import main

    for flag, value, message in (
        ("--checkpoint_keep", "-1", "checkpoint_keep=-1 is out of range; valid range: >= 0"),
        ("--checkpoint_optimizer", "maybe", "expected true/false"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "vapo_lit.cli.train", flag, value, "--out_dir", str(tmp_path / "runs")],
            capture_output=True,
            text=True,
            env=env_of(tmp_path),
            timeout=120,
        )
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
    assert main  # imported: the CLI module loads without torch (the first status line's premise)


# ----------------------------------------------------------------------------- vLLM's start-up
FAKE_VLLM = textwrap.dedent('''
    """A stand-in for vLLM: records what the engine set before importing it, and starts noisily."""
    import logging, os, sys, warnings

    SEEN = {"level": os.environ.get("VLLM_LOGGING_LEVEL"), "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
            "logger": logging.getLogger("vllm").level}

    class SamplingParams:
        pass

    class LLM:
        def __init__(self, **kwargs):
            logging.getLogger("vllm.triton_utils.importing").warning(
                "Triton is installed, but doesn't include CPU backend. Disabling Triton.")
            warnings.warn("`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
                          FutureWarning)
            os.write(2, b"[W1205 09:01:15.450597191 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for "
                        b"memory allocation on the NUMA nodes (0). (function init_cpu_memory_env)\\n")
            os.write(2, b"a line vLLM writes that is not known to be harmless\\n")
            logging.getLogger("vllm.engine").error("an error vLLM reports")

        def collective_rpc(self, fn):
            return []

        def reset_prefix_cache(self):
            pass
''')

BUILD = textwrap.dedent("""
    import json, sys
    from transformers import LlamaConfig, LlamaForCausalLM
    from vapo_lit.engines.vllm import VLLMEngine

    actor = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, max_position_embeddings=64))
    engine = VLLMEngine(actor, None)
    engine.start(4, 16)
    import vllm
    print(json.dumps(vllm.SEEN))
""")


@pytest.mark.parametrize("verbose", [False, True])
def test_vllm_starts_quietly_unless_asked(tmp_path, verbose):
    """The engine sets vLLM's log level (and its logger's, which vLLM configures only later) before
    importing it, and drops vLLM's known harmless start-up lines from stderr, passing every other one;
    VAPO_LIT_VLLM_VERBOSE=1 leaves vLLM's logging and every line alone. (No vLLM needed: a stand-in
    prints what vLLM's CPU build prints when it starts.)"""
    (tmp_path / "fake" / "vllm").mkdir(parents=True)
    (tmp_path / "fake" / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    (tmp_path / "fake" / "vllm" / "inputs.py").write_text("TokensPrompt = dict\n")
    env = env_of(
        tmp_path,
        PYTHONPATH=f"{tmp_path / 'fake'}{os.pathsep}{ROOT}",
        **({"VAPO_LIT_VLLM_VERBOSE": "1"} if verbose else {}),
    )
    done = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["multiprocessing"] == "0"
    err = [line for line in done.stderr.splitlines() if line.strip()]
    real = ["a line vLLM writes that is not known to be harmless", "an error vLLM reports"]
    if verbose:
        assert seen["level"] is None and seen["logger"] == 0  # vLLM's own defaults
        for text in (
            "Disabling Triton.",
            "FutureWarning: `torch.distributed.reduce_op`",
            "NUMA binding",
            *real,
        ):
            assert any(text in line for line in err), (text, err)
    else:
        assert seen["level"] == "ERROR" and seen["logger"] == 40  # set before vLLM was imported
        assert err == real, err
