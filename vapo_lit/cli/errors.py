"""How the commands end when something goes wrong: one line on stderr that says what happened and
what to do, and a stable exit code. Tracebacks go to a file, never to the terminal.

    0    done
    1    runtime failure: disk full, storage (database) error, a crash inside a run
    2    bad input: a flag, a config value, a file or folder the command was pointed at
    130  interrupted (Ctrl-C or SIGTERM), with the command that continues
"""

from __future__ import annotations

import shutil
import signal
import traceback
from contextlib import contextmanager
from pathlib import Path

from vapo_lit.faults import is_disk_full, is_storage_error  # noqa: F401 - re-exported

RUNTIME, BAD_INPUT, INTERRUPTED = 1, 2, 130
LOW_SPACE = 1 << 20


class Signals:
    """Set by `catch_signals`: whether SIGINT/SIGTERM arrived (Lightning turns Ctrl-C inside fit()
    into SystemExit(1), so the command must remember that the user asked to stop)."""

    def __init__(self):
        self.hit: str | None = None


@contextmanager
def catch_signals():
    """SIGINT and SIGTERM raise KeyboardInterrupt (SIGTERM behaves like Ctrl-C: work is handed back
    and saved, not lost); the previous handlers come back afterwards (Lightning leaves SIGINT
    ignored after an interrupt)."""
    sig = Signals()

    def handler(signum, frame):
        sig.hit = signal.Signals(signum).name
        raise KeyboardInterrupt

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, handler)
    try:
        yield sig
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disk_full(exc: BaseException, where: Path | None) -> bool:
    """ENOSPC in the chain, a database saying so, or a failed write with (almost) no space left."""
    if is_disk_full(exc):
        return True
    try:
        return (
            where is not None
            and isinstance(exc, (OSError, RuntimeError))
            and shutil.disk_usage(_existing(where)).free < LOW_SPACE
        )
    except OSError:
        return False


def free_text(where: Path) -> str:
    try:
        usage = shutil.disk_usage(_existing(where))
        return f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.0f} MiB"
    except OSError:
        return "free space unknown"


def _existing(p: Path) -> Path:
    p = Path(p).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def save_traceback(folder: Path | None, exc: BaseException, mask=str) -> str:
    """Write the traceback (through `mask`, which hides secrets) next to the work, best effort;
    returns ' (traceback: PATH)' or ''."""
    if folder is None:
        return ""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        path = Path(folder) / "traceback.txt"
        path.write_text(mask("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
        return f" (traceback: {path})"
    except OSError:
        return ""
