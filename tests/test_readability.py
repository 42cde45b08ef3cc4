"""The functions a newcomer reads first stay short enough to read top to bottom:
the iteration, the two updates, the report and the evaluation, each at most MAX_LINES lines
(signature and docstring included); and no function of the modules in SPLIT (one small function
per figure, one per run-card section) grows past MAX_SPLIT_LINES."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

MAX_LINES = 40
MAX_SPLIT_LINES = 60
ROOT = Path(__file__).resolve().parents[1]
SPLIT = ("vapo_lit/report/figures.py", "vapo_lit/run_card.py")


def _functions():
    from vapo_lit.evaluation import evaluate
    from vapo_lit.module import VapoModule
    from vapo_lit.report.write import report_grid

    return {"VapoModule.training_step": VapoModule.training_step, "VapoModule.update_actor": VapoModule.update_actor,
            "VapoModule.update_critic": VapoModule.update_critic, "report.write.report_grid": report_grid,
            "evaluation.evaluate": evaluate}


@pytest.mark.parametrize("name", list(_functions()))
def test_reads_in_one_screen(name):
    lines = len(inspect.getsource(_functions()[name]).splitlines())
    assert lines <= MAX_LINES, f"{name} is {lines} lines; keep it at most {MAX_LINES} (move a step into a helper)"


@pytest.mark.parametrize("path", SPLIT)
def test_no_function_of_the_split_modules_is_long(path):
    tree = ast.parse((ROOT / path).read_text())
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_SPLIT_LINES}
    assert not long, f"{path}: {long} lines; keep each at most {MAX_SPLIT_LINES} (split it into helpers)"
