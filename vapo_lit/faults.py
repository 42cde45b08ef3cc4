"""Fault-injection points for the crash tests (tests/test_faults.py), and how faults are classified.

A write path that must survive a crash calls ``reach("name")`` (or asks ``due("name")`` when it wants
to leave a half-written file first). Nothing happens unless the environment variable

    VAPO_LIT_FAULT=<point>:<n>[:<action>]      e.g. csv_append:5  or  checkpoint:2:enospc

is set: then the n-th time this process reaches <point> it performs <action>: ``kill`` (default;
SIGKILL itself, like the OOM killer: no handler, no cleanup), ``killgroup`` (SIGKILL its whole process
group at once, a launcher and its ranks: a lost machine; only where this process leads its group, as a
command started in a session of its own does, else like ``kill``) or ``enospc`` (raise OSError(ENOSPC), what a
full disk gives). Points: ``csv_append`` (half a metrics.csv row on disk),
``checkpoint`` (a half-written .last.ckpt.tmp), ``cache_write`` (a built cache entry not yet moved
into place), ``enqueue`` (after each trial a grid adds to its study), ``last_saved`` (on rank 0, after
each last.ckpt is in place: a kill between two iterations, at a known point).
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "VAPO_LIT_FAULT"
_seen: dict[str, int] = {}


def due(point: str) -> str | None:
    """Count this visit of `point`; the action to perform now, or None (the normal case)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    parts = spec.split(":")
    if parts[0] != point:
        return None
    _seen[point] = _seen.get(point, 0) + 1
    return (parts[2] if len(parts) > 2 else "kill") if _seen[point] == int(parts[1]) else None


def fire(action: str, point: str) -> None:
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {point})")
    if action == "killgroup" and os.getpgid(0) == os.getpid():  # never the caller's shell or test runner
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def reach(point: str) -> None:
    action = due(point)
    if action:
        fire(action, point)


# ----------------------------------------------------------------------------- classification
_FULL = (
    "no space left on device",
    "database or disk is full",
    "disk is full",
    "could not extend file",
    "disk full",
)


def is_disk_full(exc: BaseException | None) -> bool:
    """True for ENOSPC/EDQUOT anywhere in the exception chain, or a database saying its disk is full
    (SQLite 'database or disk is full', PostgreSQL 'could not extend file')."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(exc).lower() for s in _FULL):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def is_storage_error(exc: BaseException | None) -> bool:
    """An error of the database behind --storage (SQLAlchemy's, a driver's or Optuna's storage layer)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        mod = type(exc).__module__ or ""
        if (
            mod.startswith(("sqlalchemy", "psycopg", "pymysql", "sqlite3"))
            or type(exc).__name__ == "StorageInternalError"
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
