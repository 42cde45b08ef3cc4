"""The functions a newcomer reads first stay short enough to read top to bottom:
the iteration, the two updates, the report and the evaluation, each at most MAX_LINES lines
(signature and docstring included); and no function anywhere in vapo_lit grows past MAX_ANY_LINES."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

MAX_LINES = 40
MAX_ANY_LINES = 60
ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "vapo_lit").rglob("*.py"))


def _functions():
    from vapo_lit.evaluation import evaluate
    from vapo_lit.module import VapoModule
    from vapo_lit.report.write import report_grid

    return {
        "VapoModule.training_step": VapoModule.training_step,
        "VapoModule.update_actor": VapoModule.update_actor,
        "VapoModule.update_critic": VapoModule.update_critic,
        "report.write.report_grid": report_grid,
        "evaluation.evaluate": evaluate,
    }


@pytest.mark.parametrize("name", list(_functions()))
def test_reads_in_one_screen(name):
    lines = len(inspect.getsource(_functions()[name]).splitlines())
    assert lines <= MAX_LINES, (
        f"{name} is {lines} lines; keep it at most {MAX_LINES} (move a step into a helper)"
    )


def test_no_function_is_long():
    assert len(MODULES) > 50  # the package was found
    long = {
        f"{path}:{n.name}": n.end_lineno - n.lineno + 1
        for path in MODULES
        for n in ast.walk(ast.parse((ROOT / path).read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.end_lineno - n.lineno + 1 > MAX_ANY_LINES
    }
    assert not long, f"{long} lines; keep each function at most {MAX_ANY_LINES} (split it into helpers)"
