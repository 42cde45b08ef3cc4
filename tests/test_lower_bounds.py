"""tools/lower_bounds.py (the constraints of `make test-lower`) pins every `>=` bound of
pyproject.toml, read independently here with tomllib; and the bounds known to matter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from lower_bounds import lower_bounds  # noqa: E402

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def reference(extras) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out: dict[str, str] = {}
    for req in project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]:
        name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()
        low = re.search(r">=\s*([0-9][^,; ]*)", req)
        if low:
            key = lambda v: tuple(int(x) for x in re.findall(r"\d+", v))  # noqa: E731
            if name not in out or key(low.group(1)) > key(out[name]):
                out[name] = low.group(1)
    return out


@pytest.mark.parametrize("extras", [[], ["dev"], ["dev", "postgres"], ["dev", "postgres", "bench"]])
def test_every_lower_bound_is_pinned(extras):
    assert lower_bounds(extras) == reference(extras)


def test_the_cli_prints_constraints_and_refuses_an_unknown_extra():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "lower_bounds.py"), "dev", "postgres"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out and all(re.fullmatch(r"[a-z0-9_.\-]+==[0-9][0-9.]*", x) for x in out), out
    assert "sqlalchemy==2.1" in out  # the postgres extra and the base list agree on 2.1
    bad = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "lower_bounds.py"), "gpu"], capture_output=True, text=True
    )
    assert (
        bad.returncode != 0
        and "unknown extra(s) ['gpu']; valid: ['bench', 'dev', 'docs', 'gguf', 'postgres', 'vllm', 'vllm-cpu', 'workspace']"
        in bad.stderr
    )


def test_lightning_before_2_6_is_excluded():
    """Lightning < 2.6 runs a bf16-mixed training_step under autocast with its weight cache on: with
    manual optimization the update passes reuse weight casts cached during the no-grad rollout."""
    assert tuple(map(int, lower_bounds([])["lightning"].split("."))) >= (2, 6)


def test_extras_with_brackets_and_the_higher_of_two_bounds():
    text = (
        '[project]\nname = "x"\ndependencies = ["b[fast]>=0.5",\n    "a>=1.0,<2",  # why [sic]\n]\n'
        '[project.optional-dependencies]\npg = ["c[binary]>=3.2,<4", "a>=1.2,<2"]\nother = ["d>=9"]\n'
    )
    assert lower_bounds([], text) == {"a": "1.0", "b": "0.5"}
    assert lower_bounds(["pg"], text) == {"a": "1.2", "b": "0.5", "c": "3.2"}
