"""What `vapo-ablate` prints while a grid runs.

One line per finished cell: done / running / waiting / failed and an ETA,

    [table1] 4/9 done · 2 running · 3 waiting · 0 failed · ETA 3m10s (cells take ~1m05s, 2 workers)

and, between those, a live view of each running cell (`LiveView`), read from the cell's own files
(attempts.jsonl says it runs and since when, metrics.csv's last row where it is):

    [table1] running no_clip_higher-s0: it 12/40 · ppo 2/30 · phase value-pretrain · eval avg@8 0.31 @0 · 1.9 s/it · ETA 53s

On a terminal it is a block of lines redrawn in place every second; into a pipe or a file, the
lines are printed every 30 seconds (VAPO_LIT_LIVE_EVERY, seconds, changes that; tests use less).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path

EVERY_ENV = "VAPO_LIT_LIVE_EVERY"
CLEAR = "\r\x1b[J"
"""Carriage return + erase to the end of the screen: a line printed with it replaces the live block."""


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
    per = (
        f" (cells take ~{fmt_seconds(status.mean_seconds)}, {workers} worker{'s' * (workers != 1)})"
        if status.mean_seconds is not None
        else ""
    )
    return (
        f"[{grid_id}] {status.done}/{status.total} done · {status.running} running · {status.waiting} waiting · "
        f"{status.failed} failed · {eta}{per}"
    )


def say(text: str, stream=None) -> None:
    """Print one line of ours; on a terminal it first erases the live block (the view redraws it below)."""
    out = stream or sys.stdout
    out.write((CLEAR if _isatty(out) else "") + text + "\n")
    out.flush()


def show(grid_id: str, status, workers: int, log=say) -> None:
    log(f"{time.strftime('%H:%M:%S')} {line(grid_id, status, workers)}")


def _isatty(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


# ----------------------------------------------------------------------------- the live view
def live_every() -> float:
    """Seconds between the live lines printed into a pipe: VAPO_LIT_LIVE_EVERY, default 30."""
    text = os.environ.get(EVERY_ENV, "").strip()
    if not text:
        return 30.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{EVERY_ENV}={text!r}: give a number of seconds > 0 (default 30)")
    return seconds


def running_since(run_dir: Path) -> float | None:
    """When the cell's attempt in progress started: attempts.jsonl's last record is a start (of a
    fresh or resumed run) without its end; None when the cell is not running."""
    try:
        lines = (Path(run_dir) / "attempts.jsonl").read_text().splitlines()
        last = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):  # no file yet, or a line being written
        return None
    return last.get("start") if last.get("event") == "start" and last.get("mode") != "reused" else None


def cell_line(cell, since: float, now: float) -> str:
    """Where a running cell is: iteration, PPO update, phase, last eval, s/it and ETA, from the last
    row of its metrics.csv (one row per finished iteration)."""
    from vapo_lit.loggers import read_rows

    cfg = cell.cfg
    pre = cfg.vapo.value_pretrain_steps if "value_pretraining" in cfg.components else 0
    total = cfg.steps + pre
    try:
        _, rows, _ = read_rows(Path(cell.run_dir) / "metrics.csv")
    except (OSError, ValueError):
        rows = []
    if not rows:
        return f"{cfg.name}: starting (models, first rollout) · {fmt_seconds(now - since)} so far"
    last = rows[-1]
    it, ppo = int(_float(last, "train/iteration", 0)), int(_float(last, "train/ppo_update", 0))
    # the step-0 row is the base eval: whether value pretraining follows (or a cached critic skips
    # it) shows only in the next row
    phase = (
        ("value-pretrain" if _float(last, "train/value_pretraining", 0) > 0 else "ppo")
        if it > 0
        else "base eval done"
    )
    key = f"eval/avg@{cfg.eval_k}"
    evals = [r for r in rows if r.get(key, "") != ""]
    shown = (
        "-" if not evals else f"{_float(evals[-1], key):.2f} @{int(_float(evals[-1], 'train/ppo_update', 0))}"
    )
    per_it = _float(last, "perf/cumulative_seconds") / it if it > 0 else float("nan")
    eta = fmt_seconds(per_it * max(0, total - it)) if math.isfinite(per_it) else "?"
    rate = f"{per_it:.1f} s/it" if math.isfinite(per_it) else "- s/it"
    return f"{cfg.name}: it {it}/{total} · ppo {ppo}/{cfg.steps} · phase {phase} · eval avg@{cfg.eval_k} {shown} · {rate} · ETA {eta}"


def _float(row: dict, key: str, default: float = float("nan")) -> float:
    try:
        return float(row.get(key, ""))
    except ValueError:
        return default


class LiveView:
    """A thread of the `vapo-ablate` process that shows what the running cells do (module doc).
    `note`: what the grid does while no cell runs yet (the runner sets it while it builds models).
    Use as a context manager; print our own lines through `around(log)` so they do not tear the block."""

    def __init__(self, grid_id: str, cells, stream=None, every: float | None = None):
        self.grid_id, self.cells = grid_id, list(cells)
        self.stream = stream or sys.stdout
        self.tty = _isatty(self.stream)
        self.every = live_every() if every is None else every
        self.note: str | None = None
        self._lock, self._stop, self._thread = threading.Lock(), threading.Event(), None
        self._drawn = False

    def lines(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        running = [(c, t) for c in self.cells if (t := running_since(c.run_dir)) is not None]
        if not running:
            return [f"[{self.grid_id}] {self.note}"] if self.note else []
        return [f"[{self.grid_id}] running {cell_line(c, t, now)}" for c, t in running]

    def draw(self) -> None:
        lines = self.lines()
        with self._lock:
            if self.tty:  # the block below the cursor, the cursor back at its first line
                width = max(
                    20, shutil.get_terminal_size().columns - 1
                )  # a wrapped line would break the redraw
                block = [x[:width] for x in lines]
                if not block and not self._drawn:
                    return
                up = f"\x1b[{len(block) - 1}F" if len(block) > 1 else "\r"
                self.stream.write(CLEAR + "\n".join(block) + (up if block else ""))
                self._drawn = bool(block)
            else:
                stamp = time.strftime("%H:%M:%S")
                self.stream.write("".join(f"{stamp} {x}\n" for x in lines))
            self.stream.flush()

    def around(self, log):
        """`log` that erases the live block first (on a terminal), so its line replaces it."""

        def logged(text: str) -> None:
            with self._lock:
                if self._drawn:
                    self.stream.write(CLEAR)
                    self.stream.flush()
                    self._drawn = False
                log(text)

        return logged

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every) if self.tty else self.every):
            try:
                self.draw()
            except Exception:  # noqa: BLE001 - a view that cannot read a file must not stop the grid
                pass

    def __enter__(self) -> "LiveView":
        self._thread = threading.Thread(target=self._run, name="vapo-ablate-live", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            if self._drawn:
                self.stream.write(CLEAR)
                self.stream.flush()
                self._drawn = False
