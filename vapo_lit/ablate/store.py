"""The cell store: one Optuna study on RDB storage (SQLite by default, PostgreSQL/MySQL for many
machines) in which every attempt at a cell is one trial (user attrs: cell_id, row, seed, run_dir).

Claiming is done here, not by a sampler (Optuna's GridSampler documents that concurrent workers
can occasionally suggest the same grid point, and RDBStorage's own WAITING -> RUNNING change reads
and then writes, which SQLite through pysqlite does not run in one transaction). Every state
change of ours is ONE conditional UPDATE (`... SET state = :to WHERE trial_id = :id AND
state = :from`) whose row count says who won; a single statement is atomic in every SQL database.

Two workers never add a trial for the same cell: `enqueue` (and a retry after a failure) runs under
the study lock of `lock.py` (flock for SQLite, an advisory lock for PostgreSQL, GET_LOCK for MySQL),
which a worker killed while holding it releases at once.

Two workers never run the same cell:
1. a worker claims a WAITING trial of its grid with the conditional UPDATE (one winner);
2. it then reads all trials of that cell: if one is COMPLETE it reuses that result; if a
   lower-numbered trial of the cell is WAITING or RUNNING it releases its own as a duplicate
   (state PRUNED, user attr `duplicate_of`). Only the lowest live trial of a cell runs, so a
   duplicate trial that the lock could not prevent (a database without a lock, a worker of an
   older version) is marked and never run.

Dead workers: a RUNNING trial records a heartbeat every `heartbeat_interval` seconds (Optuna's
RDB heartbeat table). Any worker periodically fails RUNNING trials whose heartbeat is older
than `grace_period` (again with the conditional UPDATE, so exactly one worker wins) and the
winner calls Optuna's retry-stale-trial callback, which enqueues a copy; whoever claims the copy
resumes the run from its `checkpoints/last.ckpt`. A live worker whose trial was failed under it
(a pause longer than the grace period) notices on its next heartbeat and stops its run.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone

from vapo_lit import faults
from vapo_lit.ablate.lock import study_lock
from vapo_lit.ablate.urls import check_url, engine_url, is_sqlite  # noqa: F401 - re-exported
from vapo_lit.masking import mask_text, mask_url  # noqa: F401 - re-exported

STUDY = "vapo-ablate"


def open_storage(url: str, heartbeat_interval: int = 10, grace_period: int = 60, retries: int = 2):
    """Optuna RDBStorage with heartbeats and the retry-stale-trial callback (max `retries`)."""
    import optuna
    from optuna.storages import RDBStorage

    retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    kw = (
        {"engine_kwargs": {"connect_args": {"timeout": 120}}}
        if is_sqlite(url)
        else {"engine_kwargs": {"pool_pre_ping": True}}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental" notices
        if retry_cls is not None:
            kw["heartbeat_stale_trial_callback"] = retry_cls(max_retry=retries)
        else:
            kw["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=retries)
    for attempt in range(20):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeat arguments are "experimental"
            try:
                return RDBStorage(
                    engine_url(url), heartbeat_interval=heartbeat_interval, grace_period=grace_period, **kw
                )
            except Exception as e:  # noqa: BLE001 - report any connection error, masked
                # another worker is creating the same tables at this moment: try again
                racing = (
                    type(e).__name__ == "IntegrityError" or "already exists" in str(e) or "locked" in str(e)
                )
                if racing and attempt < 19:
                    time.sleep(0.25 + 0.1 * attempt)
                    continue
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise ValueError(
                    f"cannot open storage {mask_url(url)}: {type(e).__name__}: {mask_text(first, url)} "
                    "(is the server running, and the URL's host, port, user and database right?)"
                ) from None


# ----------------------------------------------------------------------------- status
@dataclass
class Status:
    done: int = 0
    running: int = 0
    waiting: int = 0
    failed: int = 0
    total: int = 0
    mean_seconds: float | None = None  # mean wall time of the cells that were trained (not reused)
    errors: dict | None = None  # cell_id -> last error of failed cells

    @property
    def finished(self) -> bool:
        return self.running == 0 and self.waiting == 0


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# ----------------------------------------------------------------------------- store
class CellStore:
    """The grid's cells as trials of one study (see the module doc for the claim protocol)."""

    def __init__(
        self,
        url: str,
        study_name: str = STUDY,
        heartbeat_interval: int = 10,
        grace_period: int = 60,
        retries: int = 2,
    ):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.url, self.study_name = url, study_name
        self.heartbeat_interval, self.retries, self.grace_period = heartbeat_interval, retries, grace_period
        self.rdb = open_storage(url, heartbeat_interval, grace_period, retries)
        for attempt in range(10):
            try:
                self.study = optuna.create_study(
                    storage=self.rdb, study_name=study_name, load_if_exists=True, direction="maximize"
                )
                break
            except Exception:  # noqa: BLE001 - two processes creating the study at once: retry the load
                if attempt == 9:
                    raise
                time.sleep(0.5)
        self.study_id = self.study._study_id

    # ------------------------------------------------------------------ reading
    def trials(self):
        """All trials, read from the database (never from a cache)."""
        return self._retry(lambda: self.rdb.get_all_trials(self.study_id, deepcopy=False))

    def by_cell(self, cell_ids) -> dict:
        out = {cid: [] for cid in cell_ids}
        for t in self.trials():
            cid = t.user_attrs.get("cell_id")
            if cid in out and "duplicate_of" not in t.user_attrs:
                out[cid].append(t)
        return out

    def status(self, cell_ids) -> Status:
        from optuna.trial import TrialState as S

        st = Status(total=len(set(cell_ids)), errors={})
        durations = []
        for cid, trials in self.by_cell(set(cell_ids)).items():
            states = {t.state for t in trials}
            if S.COMPLETE in states:
                st.done += 1
                for t in trials:
                    if (
                        t.state == S.COMPLETE
                        and t.user_attrs.get("mode") in ("fresh", "resume")
                        and t.datetime_start
                    ):
                        durations.append((t.datetime_complete - t.datetime_start).total_seconds())
            elif S.RUNNING in states:
                st.running += 1
            elif S.WAITING in states or not trials:
                st.waiting += 1
            else:
                st.failed += 1
                last = max(trials, key=lambda t: t.number)
                st.errors[cid] = last.user_attrs.get("error", "failed")
        st.mean_seconds = sum(durations) / len(durations) if durations else None
        return st

    # ------------------------------------------------------------------ writing
    def locked(self):
        """The study lock (see lock.py): held while trials are added, so no two workers add one
        for the same cell."""
        return study_lock(self.url, self.rdb.engine, f"vapo-lit/{self.study_name}")

    def enqueue(self, cells, grid_id: str) -> dict:
        """One WAITING trial per cell that has no COMPLETE, WAITING or RUNNING trial (cells whose
        every attempt failed get a fresh set of retries). Returns {'new', 'reused', 'pending'}.
        Reads and adds under the study lock: two workers enqueueing at once add each cell once."""
        from optuna.trial import TrialState as S

        counts = {"new": 0, "reused": 0, "pending": 0}
        with self.locked():
            existing = self.by_cell([c.cell_id for c in cells])
            for c in cells:
                states = {t.state for t in existing[c.cell_id]}
                if S.COMPLETE in states:
                    counts["reused"] += 1
                elif states & {S.WAITING, S.RUNNING}:
                    counts["pending"] += 1
                else:
                    attrs = {
                        "cell_id": c.cell_id,
                        "row": c.row,
                        "seed": c.seed,
                        "run_name": c.cfg.name,
                        "grid": grid_id,
                    }
                    self._retry(lambda: self.study.enqueue_trial({}, user_attrs=attrs))
                    counts["new"] += 1
                    faults.reach("enqueue")
        return counts

    def claim(self, cell_ids):
        """Atomically take the first WAITING trial of these cells in queue order; None when there is
        none. A cell keeps the place its first trial was queued at: a retry of a dead worker's cell
        runs next, not after the rest of the grid (which would break the seed-by-seed order).
        Applies the lowest-live-trial rule (module doc) before handing a trial out."""
        from optuna.trial import TrialState as S

        cell_ids = set(cell_ids)
        while True:
            trials = self.trials()
            place = {}
            for t in trials:
                cid = t.user_attrs.get("cell_id")
                place[cid] = min(place.get(cid, t.number), t.number)
            waiting = sorted(
                (t for t in trials if t.state == S.WAITING and t.user_attrs.get("cell_id") in cell_ids),
                key=lambda t: (place[t.user_attrs["cell_id"]], t.number),
            )
            if not waiting:
                return None
            for t in waiting:
                if not self._transition(t._trial_id, S.WAITING, S.RUNNING):
                    continue  # another worker won this one
                self._retry(lambda: self.rdb.record_heartbeat(t._trial_id))
                self._retry(lambda: self.rdb.set_trial_user_attr(t._trial_id, "worker", worker_id()))
                verdict = self._lowest_live(t)
                if verdict is None:
                    return self._retry(lambda: self.rdb.get_trial(t._trial_id))
                self._retry(lambda: self.rdb.set_trial_user_attr(t._trial_id, "duplicate_of", verdict))
                self._transition(t._trial_id, S.RUNNING, S.PRUNED)
                break  # re-read: the picture changed
            else:
                return None

    def _lowest_live(self, mine):
        """None if `mine` may run; else the number of the trial that owns (or finished) the cell."""
        from optuna.trial import TrialState as S

        for t in sorted(
            self.by_cell([mine.user_attrs["cell_id"]])[mine.user_attrs["cell_id"]], key=lambda t: t.number
        ):
            if t.number == mine.number:
                continue
            if t.state == S.COMPLETE or (t.number < mine.number and t.state in (S.WAITING, S.RUNNING)):
                return t.number
        return None

    def _set_attr(self, trial_id: int, key: str, value) -> bool:
        """A user attribute on an unfinished trial; False once it is finished (e.g. failed as stale
        by another worker in the meantime: Optuna refuses to change a finished trial)."""
        from optuna.exceptions import UpdateFinishedTrialError

        try:
            self._retry(lambda: self.rdb.set_trial_user_attr(trial_id, key, value))
        except UpdateFinishedTrialError:
            return False
        return True

    def complete(self, trial, value: float, **attrs) -> bool:
        """RUNNING -> COMPLETE with the value; False when the trial is no longer this worker's."""
        from optuna.trial import TrialState as S

        if not all(self._set_attr(trial._trial_id, k, v) for k, v in attrs.items()):
            return False
        return self._transition(trial._trial_id, S.RUNNING, S.COMPLETE, value=value)

    def fail(self, trial, error: str) -> bool:
        """Record the error, fail the trial and enqueue a retry while retries are left; False when
        the trial is no longer this worker's."""
        from optuna.trial import TrialState as S

        if not self._set_attr(trial._trial_id, "error", error[-2000:]):
            return False
        with self.locked():  # the retry copy and a concurrent enqueue of the failed cell: only one
            if not self._transition(trial._trial_id, S.RUNNING, S.FAIL):
                return False
            self._run_retry_callback(trial._trial_id)
        return True

    def release(self, trial) -> bool:
        """Give a claimed trial back (interrupted worker): RUNNING -> WAITING, not counted as a retry."""
        from optuna.trial import TrialState as S

        return self._transition(trial._trial_id, S.RUNNING, S.WAITING)

    def fail_stale(self) -> list:
        """Fail RUNNING trials whose heartbeat is older than the grace period; one retry each.
        Returns the trials this worker failed (as they were while RUNNING)."""
        from optuna.trial import TrialState as S

        failed = []
        for trial_id in self._retry(lambda: self.rdb._get_stale_trial_ids(self.study_id)):
            if not self._set_attr(trial_id, "error", "worker stopped sending heartbeats"):
                continue  # another worker failed it between the query and here
            with self.locked():
                trial = self._retry(lambda: self.rdb.get_trial(trial_id))
                if self._transition(trial_id, S.RUNNING, S.FAIL):
                    self._run_retry_callback(trial_id)
                    failed.append(trial)
        return failed

    def _run_retry_callback(self, trial_id: int) -> None:
        cb = (
            self.rdb.get_heartbeat_stale_trial_callback()
            if hasattr(self.rdb, "get_heartbeat_stale_trial_callback")
            else self.rdb.get_failed_trial_callback()
        )
        if cb is not None:
            self._retry(lambda: cb(self.study, self.rdb.get_trial(trial_id)))

    def trial_state(self, trial_id: int):
        return self._retry(lambda: self.rdb.get_trial(trial_id).state)

    def heartbeat(self, trial_id: int) -> None:
        self._retry(lambda: self.rdb.record_heartbeat(trial_id))

    # ------------------------------------------------------------------ the atomic step
    def _transition(self, trial_id: int, frm, to, value: float | None = None) -> bool:
        """ONE conditional UPDATE: state frm -> to; True for the single caller that changed it."""
        from optuna.storages._rdb import models

        def once():
            session = self.rdb.scoped_session()
            try:
                cols = models.TrialModel.__table__.c
                # Optuna >= 5 stores naive UTC datetimes, older versions naive local time
                utc = hasattr(models.TrialModel, "_datetime_start_utc")
                now = datetime.now(timezone.utc).replace(tzinfo=None) if utc else datetime.now()
                values = {cols.state: to}
                if to.name == "RUNNING":
                    values[cols.datetime_start] = now
                if to.is_finished():
                    values[cols.datetime_complete] = now
                n = (
                    session.query(models.TrialModel)
                    .filter(cols.trial_id == trial_id, cols.state == frm)
                    .update(values, synchronize_session=False)
                )
                if n == 1 and value is not None:
                    stored, kind = models.TrialValueModel.value_to_stored_repr(float(value))
                    session.add(
                        models.TrialValueModel(trial_id=trial_id, objective=0, value=stored, value_type=kind)
                    )
                session.commit()
                return n == 1
            except BaseException:
                session.rollback()
                raise
            finally:
                self.rdb.scoped_session.remove()

        return self._retry(once)

    def _retry(self, fn, attempts: int = 30):
        """Run a storage call, retrying transient 'database is locked' / connection errors."""
        import sqlalchemy.exc

        for i in range(attempts):
            try:
                return fn()
            except sqlalchemy.exc.OperationalError as e:
                if i == attempts - 1 or faults.is_disk_full(e):  # a full disk does not clear by waiting
                    raise
                time.sleep(min(0.05 * 2**i, 2.0))


class Heartbeat:
    """Records the trial's heartbeat every interval in a daemon thread; `lost` turns True when the
    trial is no longer RUNNING (another worker failed it as stale)."""

    def __init__(self, store: CellStore, trial_id: int, interval: float):
        self.store, self.trial_id, self.interval = store, trial_id, interval
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"heartbeat-{trial_id}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.store.heartbeat(self.trial_id)
                if self.store.trial_state(self.trial_id).name != "RUNNING":
                    self.lost = True
            except Exception:  # noqa: BLE001 - a missed beat is what the grace period is for
                pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
