"""The worker loop: claim a cell, run it through `train()` (resuming from its last checkpoint when
a previous attempt died), record the outcome, print progress; until the grid has no waiting or
running cell left. Any number of these, on any machine, can share one storage URL.

Each run folder gets `attempts.jsonl`, one line per attempt: trial number, worker (host:pid),
mode (fresh / resume / reused), start and end time, the CPU's torch capability and outcome;
nothing else is written into it except by `train()` and, for a cell on several devices
(`--devices-per-cell K`, run as a process of its own by `vapo_lit.ablate.cell`), its resolved
config `cell.json` and output `cell.log`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from vapo_lit import cpu_pin
from vapo_lit.ablate import progress
from vapo_lit.ablate.store import CellStore, Heartbeat, mask_text, worker_id
from vapo_lit.faults import is_disk_full, is_storage_error


class CellLost(RuntimeError):
    """This worker's trial was failed as stale by another worker; stop without recording."""


class WorkerStopped(RuntimeError):
    """A fault that is not the cell's (disk full, the database unreachable): the cell was handed
    back (or will be taken over after the grace period) and this worker stops; `str()` says what
    happened and what to do, password masked."""


@dataclass
class WorkerSpec:
    """Everything a worker process needs (picklable: spawned workers get it as-is)."""

    url: str
    study: str
    grid_id: str
    cells: list
    heartbeat_interval: int = 10
    grace_period: int = 60
    retries: int = 2
    workers: int = 1
    poll_seconds: float = 2.0
    gpus: str | None = None
    """CUDA_VISIBLE_DEVICES of this worker and its cells (--devices-per-cell on GPUs)."""


def _lease_guard(hb: Heartbeat):
    from lightning.pytorch.callbacks import Callback

    class LeaseGuard(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if hb.lost:
                raise CellLost("another worker took this cell over (missed heartbeats)")

    return LeaseGuard()


def _ledger(run_dir: Path, record: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "attempts.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def read_ledger(run_dir: Path) -> list:
    """A run folder's attempt records, [] when it has none (a line cut by a crash is skipped)."""
    try:
        lines = (Path(run_dir) / "attempts.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def note_stale(run_dir: Path, trial_number: int, grace: int) -> None:
    """End the attempt of a trial failed as stale in its run folder's ledger (its worker died or
    hung, so it never wrote an end): outcome 'lost'. Only where this machine has the folder and its
    last record is that attempt's start (a worker that wakes up later records its own end)."""
    records = read_ledger(run_dir)
    if not records or records[-1].get("event") != "start" or records[-1].get("trial") != trial_number:
        return
    _ledger(
        Path(run_dir),
        {
            **{k: records[-1][k] for k in ("trial", "worker", "pid", "mode", "start") if k in records[-1]},
            "event": "end",
            "end": time.time(),
            "outcome": "lost",
            "error": f"no heartbeat for over {grace} s (the worker died or hung); the cell is queued again",
        },
    )


def _final_eval(summary: dict, k: int) -> float:
    v = (summary.get("last_metrics") or {}).get(f"eval/avg@{k}")
    best = summary.get("best_eval")
    for x in (v, best):
        if isinstance(x, (int, float)) and x == x and abs(x) != float("inf"):
            return float(x)
    return 0.0


def _start_mode(run_dir: Path, trial_number: int) -> str:
    """How a claimed cell starts: 'reused' (its run finished), 'resume' (from a readable checkpoint)
    or 'fresh' (a run that died before its first checkpoint is moved aside first)."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if (run_dir / "summary.json").is_file():
        return "reused"
    if ckpt.is_file() and _readable(ckpt):
        return "resume"
    if (
        run_dir / "metrics.csv"
    ).exists():  # died before its first checkpoint: start over, keep the old one aside
        aside = run_dir.parent / ".partial" / f"{run_dir.name}-t{trial_number}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(aside))
    return "fresh"


def _run_or_reuse(store: CellStore, trial, cell, mode: str) -> dict:
    """The cell's summary: the finished run's, or that of a run trained (or resumed) under a heartbeat."""
    from vapo_lit.devices import spans_devices
    from vapo_lit.train import train

    if mode == "reused":
        return json.loads((cell.run_dir / "summary.json").read_text())
    with Heartbeat(store, trial._trial_id, store.heartbeat_interval) as hb, warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*exists and is not empty.*")  # attempts.jsonl is ours
        if spans_devices(cell.cfg):
            return _train_apart(cell, mode == "resume", hb)
        return train(cell.cfg, resume=mode == "resume", extra_callbacks=[_lease_guard(hb)])


def _cpu_capability() -> str:
    """The instruction set torch's CPU kernels dispatch to here (AVX2, AVX512, ...): float32 results
    differ in their last bits from one to another, so the report names a grid run on several."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def run_cell(store: CellStore, trial, cell, url: str | None = None) -> str:
    """Run one claimed cell; returns 'done', 'failed', 'lost'. KeyboardInterrupt releases the cell."""
    run_dir = cell.run_dir
    mode = _start_mode(run_dir, trial.number)
    record = {
        "trial": trial.number,
        "worker": worker_id(),
        "pid": os.getpid(),
        "mode": mode,
        "start": time.time(),
    }
    where = {"cpu_capability": _cpu_capability(), "cpu": cpu_pin.cpu_model()}
    _ledger(run_dir, {**record, "event": "start", **where})
    try:
        summary = _run_or_reuse(store, trial, cell, mode)
    except (KeyboardInterrupt, SystemExit) as e:  # Lightning turns Ctrl-C inside fit() into SystemExit(1)
        _ledger(run_dir, {**record, "event": "end", "end": time.time(), "outcome": "interrupted"})
        store.release(trial)
        raise KeyboardInterrupt from e
    except CellLost:
        _ledger(run_dir, {**record, "event": "end", "end": time.time(), "outcome": "lost"})
        return "lost"
    except Exception as e:  # noqa: BLE001 - any crash of a cell is recorded, the grid goes on
        if is_disk_full(e) or is_storage_error(
            e
        ):  # not the cell's fault: retrying it would fail the same way
            _hand_back(store, trial, run_dir, record, e, url)
        err = mask_text(
            f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc().splitlines(True)[-12:]), url
        )
        _ledger(
            run_dir, {**record, "event": "end", "end": time.time(), "outcome": "failed", "error": err[-500:]}
        )
        try:
            store.fail(trial, err)
        except Exception as e2:  # noqa: BLE001
            _hand_back(store, trial, run_dir, record, e2, url)
        return "failed"
    try:
        _ledger(run_dir, {**record, "event": "end", "end": time.time(), "outcome": "done"})
        store.complete(trial, _final_eval(summary, cell.cfg.eval_k), mode=mode, run_dir=str(run_dir))
    except Exception as e:  # noqa: BLE001 - the run is finished on disk; the next worker reuses it
        _hand_back(store, trial, run_dir, record, e, url)
    return "done"


def _train_apart(cell, resume: bool, hb: Heartbeat) -> dict:
    """Run a multi-device cell as `python -m vapo_lit.ablate.cell` (its launcher starts the other
    ranks by re-running that command); this worker keeps the heartbeat, kills the process group if
    the cell is taken over, and turns the exit code into the exception `run_cell` records."""
    from vapo_lit.ablate.cell import DISK_FULL
    from vapo_lit.config import to_dict

    run_dir = cell.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "cell.json"
    tmp = cfg_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_dict(cell.cfg), indent=1))
    os.replace(tmp, cfg_path)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH")) if x)
    with open(run_dir / "cell.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vapo_lit.ablate.cell", str(cfg_path)] + (["--resume"] if resume else []),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                if hb.lost:
                    _kill(proc, signal.SIGKILL)
                    raise CellLost("another worker took this cell over (missed heartbeats)")
                time.sleep(0.5)
        except BaseException:
            if proc.poll() is None:
                _kill(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _kill(proc, signal.SIGKILL)
            raise
    if proc.returncode == 0 and (run_dir / "summary.json").is_file():
        return json.loads((run_dir / "summary.json").read_text())
    lines = (run_dir / "cell.log").read_text(errors="replace").strip().splitlines()
    last = lines[-1] if lines else ""
    if proc.returncode == DISK_FULL:
        raise OSError(errno.ENOSPC, f"disk full in the cell's process: {last}")
    if proc.returncode == 130:
        raise KeyboardInterrupt
    raise RuntimeError(
        f"the cell's process exited with code {proc.returncode}: {last} (see {run_dir / 'cell.log'})"
    )


def _kill(proc, sig) -> None:
    """Signal the cell's whole process group (the launcher and its ranks)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    if sig == signal.SIGKILL:
        proc.wait()


def _readable(ckpt: Path) -> bool:
    """A checkpoint that cannot be read (never written by us half: see checkpoints.py) means start over."""
    from vapo_lit.checkpoints import check_checkpoint

    try:
        check_checkpoint(ckpt)
        return True
    except ValueError:
        return False


def _hand_back(store: CellStore, trial, run_dir: Path, record: dict, e: BaseException, url) -> None:
    """Give the claimed trial back (RUNNING -> WAITING, no retry used) and stop this worker with a
    message saying what to do. Best effort: on a full disk the database may refuse the write too."""
    what = "disk full" if is_disk_full(e) else "storage error"
    try:
        _ledger(
            run_dir,
            {
                **record,
                "event": "end",
                "end": time.time(),
                "outcome": "handed back",
                "error": mask_text(f"{type(e).__name__}: {e}", url)[-500:],
            },
        )
    except OSError:
        pass
    try:
        handed = store.release(trial)
    except Exception:  # noqa: BLE001
        handed = False
    first = mask_text(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, url)
    where = (
        ""
        if handed
        else (
            f"; the cell could not be handed back ({what}): another run takes it over "
            f"{store.grace_period} s after its last heartbeat"
        )
    )
    fix = "free some space" if what == "disk full" else "check the database server"
    raise WorkerStopped(
        f"{what} in cell {run_dir.name} ({type(e).__name__}: {first}){where}; {fix}, then rerun "
        "the same command to continue (finished cells are kept, this one resumes from its last "
        "checkpoint)"
    ) from e


def work(spec: WorkerSpec, log=progress.say, stop=None) -> None:
    """Claim and run cells of the grid until none is waiting or running, or until `stop` (an Event
    the parent sets when it stops early) is set: then it claims nothing more."""
    if spec.gpus is not None:  # before anything touches CUDA in this process
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.gpus
    import torch

    from vapo_lit.progress_line import quiet_libraries

    quiet_libraries()  # the grid's own progress lines, not Lightning's banners and tips per cell

    torch.set_num_threads(max(1, min(c.cfg.threads or 1 for c in spec.cells)))
    store = CellStore(spec.url, spec.study, spec.heartbeat_interval, spec.grace_period, spec.retries)
    by_id = {c.cell_id: c for c in spec.cells}
    last_stale_check = 0.0
    said_waiting = False
    while stop is None or not stop.is_set():
        if time.time() - last_stale_check >= min(spec.heartbeat_interval, spec.poll_seconds):
            for t in store.fail_stale():
                if t.user_attrs.get("cell_id") in by_id:
                    note_stale(by_id[t.user_attrs["cell_id"]].run_dir, t.number, spec.grace_period)
            last_stale_check = time.time()
        trial = store.claim(by_id)
        if trial is None:
            status = store.status(by_id)
            if status.finished:
                return
            if not said_waiting:
                log(
                    f"{time.strftime('%H:%M:%S')} [{spec.grid_id}] nothing to claim: {status.running} cell(s) running "
                    f"in other workers; a dead worker's cell is taken over after {spec.grace_period}s without heartbeat"
                )
                said_waiting = True
            time.sleep(spec.poll_seconds)
            continue
        cell = by_id[trial.user_attrs["cell_id"]]
        outcome = run_cell(store, trial, cell, spec.url)
        note = f"{cell.cfg.name}: {outcome}"
        if outcome == "failed":
            retries_left = spec.retries - len(trial.system_attrs.get("retry_history", []))
            note += f" ({'retrying' if retries_left > 0 else 'no retries left'})"
        log(f"{time.strftime('%H:%M:%S')} [{spec.grid_id}] {note}")
        progress.show(spec.grid_id, store.status(by_id), spec.workers, log=log)


def work_in_subprocess(spec: WorkerSpec, stop=None) -> None:
    """Entry of a spawned local worker (`--workers N`); `stop`: the parent's stop Event."""
    import warnings

    warnings.filterwarnings("ignore")
    try:
        work(spec, stop=stop)
    except KeyboardInterrupt:
        pass
    except WorkerStopped as e:
        print(f"vapo-ablate worker {worker_id()}: error: {e}", file=sys.stderr)
        sys.exit(1)
