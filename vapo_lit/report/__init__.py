"""vapo-report: tables and figures from the runs' logs only (no network, nothing of the runner).

    from vapo_lit.report import write_report
    print(write_report("runs/ablate"))                 # every grid in runs/ablate/grids/
    print(write_report("runs/ablate", grid_id="table1"))

`write.py` builds a report; `logs.py` reads run folders strictly; `collect.py` gives per-run
numbers; `table.py` aggregates rows; `render.py` formats; `figures.py` plots; the pure statistics
(stdlib only) are `vapo_lit/seed_stats.py`, shared with `vapo-ablate --seeds auto`.
"""

from __future__ import annotations

__all__ = ["write_report", "report_grid", "grids_in", "LogError", "REFERENCE"]


def __getattr__(name: str):
    if name == "LogError":
        from vapo_lit.report.logs import LogError

        return LogError
    if name in __all__:
        from vapo_lit.report import write

        return getattr(write, name)
    raise AttributeError(f"module 'vapo_lit.report' has no attribute {name!r}")
