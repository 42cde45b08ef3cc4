"""A study-wide lock held while trials are added to a grid, so that two workers enqueueing the same
grid at the same moment cannot both add a trial for the same cell.

The lock lives where the storage lives and its lease is the holder's life: whoever dies while
holding it (SIGKILL, power loss of a laptop worker) releases it at once, with no timeout to wait:

* SQLite: `flock` on ``<database>.lock`` next to the database file (the kernel drops the lock
  when the holding process dies; the database is a local file anyway);
* PostgreSQL: a transaction-level advisory lock (``pg_try_advisory_xact_lock``) on a connection
  of its own (the server drops it when the transaction or the connection ends);
* MySQL / MariaDB: ``GET_LOCK`` (dropped when the connection ends).

Other databases get no lock; the claim rule (only the lowest live trial of a cell runs, see
`store.py`) still keeps a duplicate trial from ever running.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from pathlib import Path


class LockTimeout(RuntimeError):
    """Another worker held the study lock for longer than the timeout."""


def _key64(name: str) -> int:
    """A signed 64-bit key for PostgreSQL advisory locks, stable across machines and runs."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def study_lock(url: str, engine, name: str, timeout: float = 300.0, poll: float = 0.05):
    """Hold the lock `name` of the storage at `url` (`engine`: its SQLAlchemy engine) for the
    duration of the block; LockTimeout after `timeout` seconds of waiting."""
    import sqlalchemy

    backend = sqlalchemy.engine.make_url(url).get_backend_name()
    if backend == "sqlite":
        with _flock(Path(sqlalchemy.engine.make_url(url).database + ".lock"), timeout, poll):
            yield
    elif backend == "postgresql":
        with _pg_lock(engine, _key64(name), timeout, poll):
            yield
    elif backend == "mysql":
        with _mysql_lock(engine, name[-64:], timeout):
            yield
    else:
        yield


@contextmanager
def _flock(path: Path, timeout: float, poll: float):
    import fcntl

    deadline = time.monotonic() + timeout
    with open(path, "a") as f:
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{path} stayed locked for {timeout:.0f} s") from None
                time.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextmanager
def _pg_lock(engine, key: int, timeout: float, poll: float):
    from sqlalchemy import text

    deadline = time.monotonic() + timeout
    conn = engine.connect()
    try:
        # the transaction this connection opens stays open while the block runs: the lock is its
        while not conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key}).scalar():
            conn.rollback()
            if time.monotonic() > deadline:
                raise LockTimeout(f"advisory lock {key} stayed taken for {timeout:.0f} s")
            time.sleep(poll)
        yield
    finally:
        try:
            conn.rollback()  # ends the transaction: releases the lock
        finally:
            conn.close()


@contextmanager
def _mysql_lock(engine, name: str, timeout: float):
    from sqlalchemy import text

    conn = engine.connect()
    try:
        if conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": name, "t": int(timeout)}).scalar() != 1:
            raise LockTimeout(f"MySQL lock {name!r} stayed taken for {timeout:.0f} s")
        try:
            yield
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name})
    finally:
        conn.close()
