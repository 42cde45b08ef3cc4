"""The package as a user installs it: pyproject.toml's package list, data and dependency ranges, the
lookup of shipped grids and sweeps by name, and (slow) a wheel built from this tree, installed into a
fresh virtualenv beside an existing torch and used from an empty folder.

    .venv/bin/python -m pytest tests/test_wheel.py            # -s prints each phase's time and pip's torch line
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml

from vapo_lit.ablate.grid import available_grids, grid_dirs, load_grid
from vapo_lit.ablate.sweep import available_sweeps, load_sweep
from vapo_lit.cli.sweep import main as sweep_main

ROOT = Path(__file__).resolve().parents[1]
GRIDS = sorted(p.stem for p in (ROOT / "ablations").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml"))


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# ----------------------------------------------------------------------------- pyproject.toml
def test_every_source_package_and_data_file_is_listed():
    """Packages are listed by hand (mapped folders cannot be discovered): none may be missing."""
    from setuptools import find_packages

    st = _pyproject()["tool"]["setuptools"]
    mapped = st["package-dir"]
    on_disk = set(find_packages(str(ROOT), include=["vapo_lit", "vapo_lit.*"]))
    assert set(st["packages"]) == on_disk | set(mapped), (
        "pyproject.toml [tool.setuptools] packages is out of date"
    )
    assert mapped == {"vapo_lit.ablations": "ablations", "vapo_lit.sweeps": "sweeps"}
    for package, patterns in st["package-data"].items():
        folder = ROOT / mapped.get(package, package.replace(".", "/"))
        assert all(list(folder.glob(p)) for p in patterns), f"{package}: {patterns} match no file in {folder}"
    assert (ROOT / "vapo_lit" / "algos" / "_gae_kernel.c").is_file()


def test_dependencies_are_ranges_that_admit_the_installed_versions():
    """No exact pins (a user's own torch stays), an upper bound on each, the local versions inside."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    names = {r.name for r in reqs}
    assert {"torch", "lightning", "transformers", "optuna", "wandb", "pandas"} <= names
    for r in reqs:
        ops = {s.operator for s in r.specifier}
        assert "==" not in ops and "<" in ops and ">=" in ops, f"{r}: want a range >=low,<next-major"
        assert r.specifier.contains(version(r.name), prereleases=True), (
            f"installed {r.name} {version(r.name)} not in {r}"
        )
    extras = project["optional-dependencies"]
    assert {"dev", "postgres", "bench"} <= set(extras)
    makefile = (ROOT / "Makefile").read_text()
    setup = makefile[makefile.index("$(STAMP): pyproject.toml") :].split("\n\n")[0]  # the .venv recipe
    assert setup.count('"torch==2.13.0"') == 2  # set-up pins the local CPU wheel, and keeps it


def test_plain_postgresql_url_maps_to_the_postgres_extras_driver():
    """SQLAlchemy >= 2.1 (what [postgres] asks for) maps postgresql:// to psycopg 3, which it ships."""
    from importlib.metadata import version

    import sqlalchemy
    from packaging.requirements import Requirement

    extra = [Requirement(r) for r in _pyproject()["project"]["optional-dependencies"]["postgres"]]
    assert {r.name for r in extra} == {"psycopg", "sqlalchemy"}
    sa = next(r for r in extra if r.name == "sqlalchemy")
    if not sa.specifier.contains(version("sqlalchemy")):
        pytest.skip(f"installed SQLAlchemy {version('sqlalchemy')} is outside the extra's {sa.specifier}")
    assert sqlalchemy.engine.make_url("postgresql://u@h/d").get_dialect().driver == "psycopg"


# ----------------------------------------------------------------------------- shipped definitions
def test_shipped_grids_and_sweeps_found_from_an_unrelated_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert available_grids() == GRIDS and available_sweeps() == SWEEPS
    assert all(d.is_relative_to(ROOT) for d in grid_dirs())
    assert [r.label for r in load_grid("table1").rows][0] == "vapo"
    assert load_sweep("vapo_alpha").study == "vapo_alpha"


def test_own_files_and_folders_come_first(tmp_path, monkeypatch):
    """./ablations/NAME.yaml and ./sweeps/NAME.yaml shadow the shipped ones; a path works anywhere."""
    (tmp_path / "ablations").mkdir()
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "ablations" / "table1.yaml").write_text(
        yaml.safe_dump({"name": "mine", "rows": [{"only": []}]})
    )
    (tmp_path / "sweeps" / "vapo_alpha.yaml").write_text(
        yaml.safe_dump({"study": "mine", "space": {"vapo.mu": {"type": "float", "low": 0.0, "high": 0.2}}})
    )
    own = tmp_path / "elsewhere" / "my_sweep.yml"
    own.parent.mkdir()
    own.write_text(yaml.safe_dump({"space": {"vapo.alpha": {"type": "float", "low": 0.1, "high": 1.0}}}))
    monkeypatch.chdir(tmp_path)
    assert load_grid("table1").grid_id == "mine" and load_grid("critic_free").grid_id == "critic_free"
    assert load_sweep("vapo_alpha").study == "mine"
    assert load_sweep(own).study == "my_sweep" and load_sweep(str(own)).study == "my_sweep"
    assert load_grid(str(ROOT / "ablations" / "pairwise.yaml")).grid_id == "pairwise"


@pytest.mark.parametrize("name", ["nope", "nope.yaml", "some/folder/vapo_alpha"])
def test_unknown_sweep_lists_the_shipped_ones_and_writes_nothing(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    assert sweep_main([name, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert name in err and "no such sweep file or shipped sweep" in err and all(s in err for s in SWEEPS)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the wheel, installed
_CHECK = textwrap.dedent("""
    import json, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import torch
        import vapo_lit
        from vapo_lit.ablate.grid import available_grids, grid_dirs
        from vapo_lit.ablate.sweep import available_sweeps
        from vapo_lit.algos import _native, gae

        g = torch.Generator().manual_seed(0)
        B, T, lam, gamma = 4, 37, 0.9, 0.99
        r, v = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
        adv, ret = gae(r, v, torch.ones(B, T), lam, gamma)
    ref = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):  # terminal rows: the value after the last token is 0
        a = 0.0
        for t in reversed(range(T)):
            nxt = float(v[b, t + 1]) if t + 1 < T else 0.0
            a = float(r[b, t]) + gamma * nxt - float(v[b, t]) + gamma * lam * a
            ref[b, t] = a
    print(json.dumps({
        "vapo_lit": vapo_lit.__file__, "grid_dirs": [str(d) for d in grid_dirs()],
        "grids": available_grids(), "sweeps": available_sweeps(),
        "native": _native._lib is not None, "failure": _native.failure(),
        "max_err": float((adv - ref).abs().max()), "ret_err": float((ret - ref - v).abs().max()),
        "warnings": [str(w.message) for w in caught],
    }))
""")

# torch's version, location and the identity of one of its files (a reinstall writes new files), read
# without importing it (that alone takes seconds).
_TORCH_ID = (
    "import importlib.metadata as m, importlib.util as u, json, os; f = u.find_spec('torch').origin; "
    "s = os.stat(os.path.join(os.path.dirname(f), 'version.py')); "
    "print(json.dumps([m.version('torch'), f, s.st_ino, s.st_mtime_ns]))"
)


class _Phase:
    """A command started now and checked later, so that independent phases overlap (2 cores).
    Its output goes to files (a full pipe would stall it while another phase runs)."""

    def __init__(self, name, cmd, *, cwd, env, times):
        self.name, self.times, self.t0 = name, times, time.perf_counter()
        logs = Path(env["VAPO_LIT_CACHE"]).parent / "logs"
        logs.mkdir(exist_ok=True)
        slug = "".join(c if c.isalnum() else "_" for c in name)
        self.out, self.err = open(logs / f"{slug}.out", "w+"), open(logs / f"{slug}.err", "w+")
        self.proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=cwd, env=env, text=True, stdout=self.out, stderr=self.err
        )

    def result(self, timeout: float) -> str:
        try:
            self.proc.wait(timeout=timeout)
            why = f"exit code {self.proc.returncode}"
        except subprocess.TimeoutExpired:
            self.stop()
            why = f"still running after {timeout} s"
        self.times[self.name] = round(time.perf_counter() - self.t0, 1)
        out, err = (f.seek(0) or f.read() for f in (self.out, self.err))
        self.out.close(), self.err.close()
        assert self.proc.returncode == 0, f"{self.name}: {why}\n{out[-3000:]}\n{err[-3000:]}"
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _run(name, cmd, *, cwd, env, times, timeout=300) -> str:
    return _Phase(name, cmd, cwd=cwd, env=env, times=times).result(timeout)


@pytest.mark.slow
def test_wheel_installs_beside_torch_and_runs_from_an_empty_folder(tmp_path):
    """Build the wheel from a copy of this tree, make a fresh venv holding only this machine's torch,
    install the wheel (dependencies from the package index and pip's cache; --no-compile keeps it
    quick), then from an empty folder: native `gae`, the shipped grids and sweeps, a one-step
    `vapo-ablate --grid table1` and `vapo-sweep vapo_alpha`; the torch that was there is untouched."""
    times: dict[str, float] = {}
    # Not this checkout (PYTHONPATH); and the venv's modules are compiled on first import and kept
    # (--no-compile skips compiling all of torch and transformers up front; no .pyc would make every
    # process recompile what it imports).
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE", "VAPO_LIT_GAE_BACKEND")
    }
    env.update(
        VAPO_LIT_CACHE=str(tmp_path / "cache"), PIP_NO_INPUT="1", PYTHONWARNINGS="ignore::DeprecationWarning"
    )
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("vapo_lit", "ablations", "sweeps"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    build = _Phase(
        "build wheel",
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", src],
        cwd=tmp_path,
        env=env,
        times=times,
    )

    venv = tmp_path / "venv"
    py, bin_ = venv / "bin" / "python", venv / "bin"
    sweep = None
    try:
        _run("venv", [sys.executable, "-m", "venv", venv], cwd=tmp_path, env=env, times=times)
        local_torch = (
            f"torch=={torch.__version__}"  # the exact build this suite runs on (here: the CPU wheel on disk)
        )
        _run(
            "install torch",
            [py, "-m", "pip", "install", "-q", "--no-compile", local_torch],
            cwd=tmp_path,
            env=env,
            times=times,
        )
        before = json.loads(_run("torch id", [py, "-c", _TORCH_ID], cwd=tmp_path, env=env, times=times))
        build.result(timeout=300)
        (wheel,) = (tmp_path / "dist").glob("vapo_lit-*.whl")
        out = _run(
            "install wheel",
            [py, "-m", "pip", "install", "--no-compile", wheel],
            cwd=tmp_path,
            env=env,
            times=times,
            timeout=420,
        )
        torch_lines = [ln for ln in out.splitlines() if "torch" in ln.split("(")[0] and "lightning" not in ln]
        print("\npip, installing the wheel beside torch:\n  " + "\n  ".join(torch_lines))
        assert any(ln.startswith("Requirement already satisfied: torch") for ln in torch_lines), out[-3000:]
        assert "Uninstalling torch" not in out and "Successfully installed" in out

        empty = tmp_path / "empty"
        empty.mkdir()
        site = next((venv / "lib").glob("python3*/site-packages"))
        info = json.loads(
            _run("import + gae", [py, "-c", _CHECK], cwd=empty, env=env, times=times).splitlines()[-1]
        )
        assert Path(info["vapo_lit"]).is_relative_to(site), info["vapo_lit"]  # the wheel, not this checkout
        assert info["native"] and info["failure"] is None, info
        assert not [w for w in info["warnings"] if "GAE" in w], info["warnings"]
        assert info["max_err"] < 1e-9 and info["ret_err"] < 1e-9, info
        assert list((tmp_path / "cache" / "kernels").glob("gae-*.so"))
        assert info["grids"] == GRIDS and info["sweeps"] == SWEEPS
        assert all(Path(d).is_relative_to(site) for d in info["grid_dirs"]), info["grid_dirs"]

        bad = subprocess.run(
            [bin_ / "vapo-ablate", "--grid", "nope"],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode == 2 and all(g in bad.stderr for g in GRIDS), bad.stderr
        smoke = [
            "--preset",
            "smoke",
            "--model",
            "random",
            "--steps",
            "1",
            "--wandb",
            "disabled",
            "--threads",
            "1",
        ]
        runs = tmp_path / "out"
        sweep = _Phase(
            "vapo-sweep vapo_alpha",
            [bin_ / "vapo-sweep", "vapo_alpha", "--n-trials", "1", "--out", runs / "sw", *smoke],
            cwd=empty,
            env=env,
            times=times,
        )
        _run(
            "vapo-ablate --grid table1",
            [
                bin_ / "vapo-ablate",
                "--grid",
                "table1",
                "--seeds",
                "1",
                "--eval_every",
                "0",
                "--out",
                runs / "ab",
                *smoke,
            ],
            cwd=empty,
            env=env,
            times=times,
        )
        rows = len(load_grid(str(ROOT / "ablations" / "table1.yaml")).rows)
        assert len(list((runs / "ab" / "runs").glob("*/summary.json"))) == rows
        assert (runs / "ab" / "reports" / "table1" / "table.md").is_file()
        out = sweep.result(timeout=300)
        assert "trial 0: COMPLETE" in out, out[-2000:]
        assert list(empty.iterdir()) == []  # nothing written into the working folder

        after = json.loads(_run("torch id", [py, "-c", _TORCH_ID], cwd=empty, env=env, times=times))
        assert after == before, (before, after)  # same version, same files (not reinstalled)
        assert before[0] == torch.__version__
    finally:
        for phase in (build, sweep):
            if phase is not None:
                phase.stop()
        print("phases (s):", times)
        shutil.rmtree(venv, ignore_errors=True)  # about 1.4 GB
