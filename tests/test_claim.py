"""The grid store's claim protocol (vapo_lit/ablate/store.py): every state change is ONE conditional
UPDATE, so of two workers that both believe a trial is WAITING (one of them from a stale read)
exactly one wins, and no transition happens from a state other than the one named.

Two `CellStore`s on one SQLite file play two workers; a worker's stale read is simulated by
handing `claim()` the trial list it read before the other worker claimed.
"""

from __future__ import annotations

import threading

import pytest
from optuna.trial import TrialState as S

from vapo_lit.ablate.store import CellStore, worker_id


def two_workers(tmp_path, n_trials: int = 1, cell: str = "c0"):
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    a, b = (
        CellStore(url, heartbeat_interval=60, grace_period=120),
        CellStore(url, heartbeat_interval=60, grace_period=120),
    )
    for i in range(n_trials):
        a.study.enqueue_trial(
            {}, user_attrs={"cell_id": cell if n_trials == 1 else f"c{i}", "row": "r", "seed": i}
        )
    return a, b


def state(store, trial_id):
    return store.rdb.get_trial(trial_id).state


def test_a_stale_second_claim_of_one_trial_fails(tmp_path):
    a, b = two_workers(tmp_path)
    stale = b.trials()  # b reads: trial 0 is WAITING
    assert [t.state for t in stale] == [S.WAITING]
    won = a.claim(["c0"])
    assert won is not None and won.state == S.RUNNING and won.user_attrs["worker"] == worker_id()
    assert won.datetime_start is not None
    b.trials = lambda: stale  # b acts on its stale read
    assert b.claim(["c0"]) is None
    # the same at the level of the one statement: WAITING -> RUNNING again, from either store
    assert not b._transition(won._trial_id, S.WAITING, S.RUNNING)
    assert not a._transition(won._trial_id, S.WAITING, S.RUNNING)
    assert state(a, won._trial_id) == S.RUNNING


def test_each_transition_happens_once_and_only_from_its_state(tmp_path):
    a, b = two_workers(tmp_path)
    t = a.study.trials[0]
    assert not a.complete(t, 1.0) and state(a, t._trial_id) == S.WAITING  # never claimed: cannot complete
    assert not a.fail(t, "boom") and state(a, t._trial_id) == S.WAITING
    assert len(a.trials()) == 1  # a refused fail enqueues no retry
    assert not a.release(t)  # WAITING -> WAITING is not a release
    t = a.claim(["c0"])
    assert a.release(t) and state(a, t._trial_id) == S.WAITING
    assert not b.release(t)  # released once
    t = b.claim(["c0"])
    assert t is not None and a.complete(t, 0.25, mode="fresh")
    done = a.rdb.get_trial(t._trial_id)
    assert done.state == S.COMPLETE and done.value == 0.25 and done.user_attrs["mode"] == "fresh"
    assert done.datetime_complete is not None and done.datetime_complete >= done.datetime_start
    assert not b.complete(t, 0.75)  # a second completion changes nothing
    assert a.rdb.get_trial(t._trial_id).value == 0.25
    assert not b._transition(t._trial_id, S.RUNNING, S.FAIL) and state(a, t._trial_id) == S.COMPLETE
    assert len(a.trials()) == 1 and a.claim(["c0"]) is None  # nothing WAITING


def test_a_failure_is_recorded_once_and_retried_once(tmp_path):
    a, b = two_workers(tmp_path)
    t = a.claim(["c0"])
    assert a.fail(t, "RuntimeError: boom")
    failed = a.rdb.get_trial(t._trial_id)
    assert (
        failed.state == S.FAIL
        and failed.datetime_complete is not None
        and "boom" in failed.user_attrs["error"]
    )
    assert not b._transition(
        t._trial_id, S.RUNNING, S.FAIL
    )  # a second worker's stale view: no second failure
    retries = [x for x in a.trials() if x.state == S.WAITING]
    assert len(retries) == 1 and retries[0].user_attrs["cell_id"] == "c0"
    again = b.claim(["c0"])
    assert again is not None and again.number == retries[0].number


def test_only_the_lowest_live_trial_of_a_cell_runs(tmp_path):
    a, b = two_workers(tmp_path)
    first = a.claim(["c0"])
    a.study.enqueue_trial(
        {}, user_attrs={"cell_id": "c0", "row": "r", "seed": 0}
    )  # a duplicate while it runs
    assert b.claim(["c0"]) is None
    dup = [t for t in a.trials() if t.number == 1][0]
    assert dup.state == S.PRUNED and dup.user_attrs["duplicate_of"] == first.number
    assert a.complete(first, 0.5)
    a.study.enqueue_trial(
        {}, user_attrs={"cell_id": "c0", "row": "r", "seed": 0}
    )  # a duplicate of a finished cell
    assert b.claim(["c0"]) is None
    late = [t for t in a.trials() if t.number == 2][0]
    assert late.state == S.PRUNED and late.user_attrs["duplicate_of"] == first.number
    # a different cell is not held up by c0's trials
    a.study.enqueue_trial({}, user_attrs={"cell_id": "c1", "row": "r", "seed": 1})
    other = b.claim(["c0", "c1"])
    assert other is not None and other.user_attrs["cell_id"] == "c1"


def test_concurrent_workers_claim_every_trial_exactly_once(tmp_path):
    a, b = two_workers(tmp_path, n_trials=12)
    got = {"a": [], "b": []}
    start = threading.Barrier(2)

    def work(store, key):
        start.wait()
        while (t := store.claim([f"c{i}" for i in range(12)])) is not None:
            got[key].append(t.number)

    threads = [threading.Thread(target=work, args=(s, k)) for s, k in ((a, "a"), (b, "b"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert not set(got["a"]) & set(got["b"]), got
    assert sorted(got["a"] + got["b"]) == list(range(12))
    assert all(t.state == S.RUNNING for t in a.trials())


@pytest.mark.parametrize("frm,to", [(S.RUNNING, S.COMPLETE), (S.RUNNING, S.FAIL), (S.COMPLETE, S.RUNNING)])
def test_transition_from_a_state_the_trial_is_not_in_changes_nothing(tmp_path, frm, to):
    a, _ = two_workers(tmp_path)
    tid = a.study.trials[0]._trial_id
    assert not a._transition(tid, frm, to, value=1.0)
    t = a.rdb.get_trial(tid)
    assert t.state == S.WAITING and t.value is None and t.datetime_start is None


def test_completing_a_trial_failed_under_its_worker_returns_false(tmp_path):
    """A worker whose trial was failed as stale under it, and whose run then ends before its lease
    guard notices: complete()/fail() say False (Optuna refuses attributes on a finished trial)."""
    a, b = two_workers(tmp_path)
    t = a.claim(["c0"])
    assert b._transition(t._trial_id, S.RUNNING, S.FAIL)  # another worker failed it as stale
    assert a.complete(t, 0.5, mode="fresh", run_dir="x") is False
    assert a.fail(t, "RuntimeError: crashed after losing the lease") is False


def test_a_stale_trial_failed_by_another_worker_meanwhile_is_skipped(tmp_path, monkeypatch):
    """Two workers see the same stale trial; the second one reaches it after the first failed it:
    it neither raises (Optuna refuses attributes on a finished trial) nor counts it."""
    a, b = two_workers(tmp_path)
    t = a.claim(["c0"])
    monkeypatch.setattr(
        b.rdb, "_get_stale_trial_ids", lambda study_id: [t._trial_id]
    )  # b's query saw it RUNNING
    assert a._transition(t._trial_id, S.RUNNING, S.FAIL)  # a failed it first
    assert b.fail_stale() == []
    assert state(b, t._trial_id) == S.FAIL and len(b.trials()) == 1  # no retry added by b


def test_a_dead_workers_cell_is_retried_in_its_place_in_the_queue(tmp_path, monkeypatch):
    """Cells are queued seed by seed so that a grid stopped part-way holds whole seeds; the retry
    of a cell whose worker died is queued after every other cell, yet it is the next one taken."""
    a, b = two_workers(tmp_path, n_trials=3)  # cells c0, c1, c2 queued in that order
    t = a.claim(["c0", "c1", "c2"])
    assert t.user_attrs["cell_id"] == "c0"
    monkeypatch.setattr(b.rdb, "_get_stale_trial_ids", lambda study_id: [t._trial_id])  # a died
    (lost,) = b.fail_stale()
    assert lost.number == t.number and lost.user_attrs["cell_id"] == "c0"
    assert state(b, t._trial_id) == S.FAIL
    retry = max(b.trials(), key=lambda x: x.number)
    assert retry.state == S.WAITING and retry.user_attrs["cell_id"] == "c0" and retry.number == 3
    assert [b.claim(["c0", "c1", "c2"]).user_attrs["cell_id"] for _ in range(3)] == ["c0", "c1", "c2"]
