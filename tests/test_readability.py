"""The functions a newcomer reads first stay short enough to read top to bottom:
the iteration, the two updates, the report and the evaluation, each at most MAX_LINES lines
(signature and docstring included)."""
from __future__ import annotations

import inspect

import pytest

MAX_LINES = 40


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
