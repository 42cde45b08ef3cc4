"""One progress line per finished cell: done / running / waiting / failed and an ETA.

    [table1] 4/9 done · 2 running · 3 waiting · 0 failed · ETA 3m10s (cells take ~1m05s, 2 workers)
"""
from __future__ import annotations

import sys
import time


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def eta_seconds(status, workers: int) -> float | None:
    """Remaining cells x mean cell time / workers (running cells count half)."""
    if status.mean_seconds is None:
        return None
    left = status.waiting + 0.5 * status.running
    return left * status.mean_seconds / max(1, workers, status.running)


def line(grid_id: str, status, workers: int) -> str:
    eta = "ETA 0s" if status.finished else f"ETA {fmt_seconds(eta_seconds(status, workers))}"
    per = f" (cells take ~{fmt_seconds(status.mean_seconds)}, {workers} worker{'s' * (workers != 1)})" \
        if status.mean_seconds is not None else ""
    return (f"[{grid_id}] {status.done}/{status.total} done · {status.running} running · {status.waiting} waiting · "
            f"{status.failed} failed · {eta}{per}")


def show(grid_id: str, status, workers: int, stream=None) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line(grid_id, status, workers)}", file=stream or sys.stdout, flush=True)
