"""A grid held to one instruction set (vapo_lit/cpu_pin.py): the grid file's or the flag's pin is
checked before anything is written, recorded in the manifest and kept for the grid's life; the
command restarts itself under the pin, every process of it computes under it, and the run cards and
attempt ledgers say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_ablate import attempts, flags

from vapo_lit import cpu_pin
from vapo_lit.ablate.grid import grid_from_drop, load_grid
from vapo_lit.ablate.runner import fixed_pin, plan, write_manifest
from vapo_lit.cli.ablate import main
from vapo_lit.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]


def unpinned_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in cpu_pin.PINS["default"]}


def ablate_pinned(tmp_path, pin: str) -> subprocess.CompletedProcess:
    """A one-step `vapo-ablate --cpu-capability PIN` grid into tmp_path/o, started unpinned."""
    return subprocess.run(
        [sys.executable, "-m", "vapo_lit.cli.ablate", *flags(tmp_path, "o", "--drop", "clip_higher")]
        + ["--steps", "1", "--no-report", "--cpu-capability", pin],
        env=unpinned_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_names_parse_case_insensitively_and_bad_ones_list_the_valid():
    assert cpu_pin.parse(" AVX2 ", "--cpu-capability") == "avx2"
    with pytest.raises(ValueError, match=r"--cpu-capability 'avx9': .* valid: default, avx2, avx512"):
        cpu_pin.parse("avx9", "--cpu-capability")


def test_cpu_model_is_the_model_name_the_kernel_reports():
    """The CPU model each attempt and run card record: /proc/cpuinfo's first model name on Linux."""
    model = cpu_pin.cpu_model()
    assert model and "\n" not in model and model == model.strip()
    info = Path("/proc/cpuinfo")
    names = [
        ln.split(":", 1)[1].split() for ln in info.read_text().splitlines() if ln.startswith("model name")
    ]
    if names:
        assert model == " ".join(names[0])


def test_in_effect_needs_every_variable_of_the_pin():
    env = cpu_pin.env_for("avx2")
    assert cpu_pin.in_effect("avx2", env) and not cpu_pin.in_effect("avx512", env)
    assert not cpu_pin.in_effect("avx2", {**env, "MKL_CBWR": "AUTO"})
    assert cpu_pin.recorded({**env, "HOME": "/x"}) == env
    assert cpu_pin.current(env) == "avx2"
    assert cpu_pin.current({"ATEN_CPU_CAPABILITY": "avx2"}) is None  # torch alone: MKL and oneDNN not held
    assert {p: cpu_pin.TORCH_NAME[p] for p in cpu_pin.PINS} == {
        "default": "DEFAULT",
        "avx2": "AVX2",
        "avx512": "AVX512",
    }


def test_check_refuses_a_process_started_without_the_pin(monkeypatch):
    for k in cpu_pin.PINS["default"]:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="started without ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2"):
        cpu_pin.check("avx2")


def test_check_refuses_a_cpu_without_the_pinned_instruction_set(monkeypatch):
    """torch reports whatever ATEN_CPU_CAPABILITY says, even a set the CPU lacks (and then dies of an
    illegal instruction), so the CPU's own set is asked of an unpinned interpreter."""
    for k, v in cpu_pin.env_for("avx512").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cpu_pin, "native", lambda: "AVX2")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with pytest.raises(ValueError, match=r"cpu_capability avx512: this CPU lacks it \(torch runs AVX2 here"):
        cpu_pin.check("avx512")
    monkeypatch.setattr(cpu_pin, "native", lambda: "AVX512")
    cpu_pin.check("avx512")
    for k, v in cpu_pin.env_for("default").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cpu_pin, "native", lambda: "SVE256")  # another architecture: default only
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    cpu_pin.check("default")


def test_native_is_the_unpinned_capability_even_under_a_pin(monkeypatch):
    for k, v in cpu_pin.env_for("default").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cpu_pin, "_native", [])
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=unpinned_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert cpu_pin.native() == proc.stdout.strip()


@pytest.mark.skipif(
    cpu_pin.RANK.get(cpu_pin.native(), -1) >= cpu_pin.RANK["AVX512"],
    reason="this CPU has AVX-512: no pinnable set above it to refuse",
)
def test_a_pin_above_the_cpu_is_refused_before_anything_is_written(tmp_path):
    proc = ablate_pinned(tmp_path, "avx512")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cpu_capability avx512: this CPU lacks it" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_grid_file_names_a_pin(tmp_path):
    good = tmp_path / "g.yaml"
    good.write_text("name: g\nrows: [{}]\ncpu_capability: AVX2\n")
    assert load_grid(str(good)).cpu_capability == "avx2"
    bad = tmp_path / "b.yaml"
    bad.write_text("name: b\nrows: [{}]\ncpu_capability: sse\n")
    with pytest.raises(ValueError, match=r"b.yaml cpu_capability: 'sse': .* valid: default, avx2, avx512"):
        load_grid(str(bad))


def _plan(out: Path, pin: str | None):
    grid = grid_from_drop(["clip_higher"])
    grid.cpu_capability = pin
    return plan(grid, RunConfig(model="random"), [0], out)


def test_the_manifest_keeps_the_pin_for_the_grids_life(tmp_path):
    out = tmp_path / "o"
    p = _plan(out, "avx2")
    write_manifest(p)
    assert json.loads(next((out / "grids").glob("*.json")).read_text())["cpu_capability"] == "avx2"
    assert _plan(out, None).cpu_capability == "avx2"  # a resume without the flag keeps it
    with pytest.raises(ValueError, match=r"cpu_capability avx512: grid .* is pinned to avx2 \(recorded in"):
        _plan(out, "avx512")


def test_a_grid_that_already_ran_on_another_instruction_set_cannot_be_pinned(tmp_path):
    out = tmp_path / "o"
    p = _plan(out, None)
    write_manifest(p)
    run_dir = p.cells[0].run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "attempts.jsonl").write_text(
        json.dumps({"event": "start", "cpu_capability": "AVX512"}) + "\n" + '{"event": "st'  # a cut line
    )
    with pytest.raises(ValueError, match=r"1 of grid .* cells already computed on AVX512 \(e.g. "):
        _plan(out, "avx2")
    assert fixed_pin(p.grid, out, p.cells) is None
    (run_dir / "attempts.jsonl").write_text(json.dumps({"event": "start", "cpu_capability": "AVX2"}) + "\n")
    assert _plan(out, "avx2").cpu_capability == "avx2"  # every attempt so far ran on it: pinned from here


def test_in_process_main_refuses_to_run_unpinned(tmp_path, capsys, monkeypatch):
    for k in cpu_pin.PINS["default"]:
        monkeypatch.delenv(k, raising=False)
    assert main(flags(tmp_path, "o", "--drop", "clip_higher", "--cpu-capability", "default")) == 2
    assert "started without ATEN_CPU_CAPABILITY=default" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_command_restarts_itself_under_the_pin_and_every_record_says_so(tmp_path):
    """From an environment without the pin: the command runs its cell under it (torch's default
    kernels, which every CPU has), the attempt ledger and run card record it, the manifest keeps it."""
    out = tmp_path / "o"
    proc = ablate_pinned(tmp_path, "default")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads(next((out / "grids").glob("*.json")).read_text())
    assert manifest["cpu_capability"] == "default"
    runs = [d for d in (out / "runs").iterdir() if d.is_dir()]
    assert len(runs) == 2
    for d in runs:
        assert [a["cpu_capability"] for a in attempts(d) if a["event"] == "start"] == ["DEFAULT"]
        card = json.loads((d / "run_card.json").read_text())
        assert card["software"]["torch_cpu_capability"] == "DEFAULT"
        assert card["software"]["cpu_pin"] == "default"
        assert card["software"]["cpu_pin_env"] == cpu_pin.env_for("default")
        assert card["hardware"]["cpu"] == cpu_pin.cpu_model()
