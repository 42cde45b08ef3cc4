"""`plan()` validates everything and writes nothing; `run()` enqueues, works, reports.

    from vapo_lit.ablate.runner import plan, run
    p = plan(grid_from_drop(["value_pretraining"]), base_cfg, seeds=[0], out="runs/ablate")
    exit_code = run(p, workers=2)

Output folder layout:
    OUT/ablate.db               the default storage (SQLite), one study 'vapo-ablate'
    OUT/runs/<row>-s<seed>-<id>/ one run folder per cell (train()'s files + attempts.jsonl)
    OUT/grids/<grid>.json       which cells make up a grid (rows in order), for vapo-report
    OUT/reports/<grid>/         table.md, table.tex, table.csv, figures (vapo-report)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from vapo_lit import cpu_pin, protocol
from vapo_lit.ablate import progress
from vapo_lit.ablate.grid import Grid, cells_of
from vapo_lit.ablate.store import STUDY, CellStore, check_url, is_sqlite, mask_url
from vapo_lit.ablate.worker import WorkerSpec, read_ledger, work, work_in_subprocess
from vapo_lit.config import RunConfig, merge
from vapo_lit.labels import row_order
from vapo_lit.preflight import check_writable, preflight_grid


@dataclass
class Plan:
    grid: Grid
    cells: list
    out: Path
    url: str
    study: str = STUDY
    heartbeat_interval: int = 10
    grace_period: int = 60
    retries: int = 2
    gpu_slices: list | None = None
    """--devices-per-cell on GPUs: the CUDA_VISIBLE_DEVICES value of each local worker."""
    endpoint: str = protocol.DEFAULT_ENDPOINT
    """The grid's primary endpoint (vapo_lit/protocol.py), as its manifest records it."""
    tuning_seeds: list = field(default_factory=list)
    """Seeds the grid's settings were chosen on: its cells with these seeds are tuning cells."""
    cpu_capability: str | None = None
    """The instruction set every process of the grid is held to (vapo_lit/cpu_pin.py), or None."""


def default_storage(out: Path) -> str:
    return f"sqlite:///{(Path(out) / 'ablate.db').resolve()}"


def plan(
    grid: Grid,
    base: RunConfig,
    seeds,
    out,
    storage: str | None = None,
    *,
    workers: int = 1,
    retries: int = 2,
    heartbeat_interval: int = 10,
    grace_period: int = 60,
    study: str = STUDY,
    devices_per_cell: int | None = None,
) -> Plan:
    """Resolve and validate every cell and the storage URL; raises ValueError; writes nothing."""
    out = Path(out)
    if workers < 1 or retries < 0 or heartbeat_interval < 1 or grace_period < 1:
        raise ValueError("--workers, --heartbeat and --grace must be >= 1 and --retries >= 0")
    if not seeds:
        raise ValueError("--seeds must be >= 1")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    check_writable(out, "--out")
    gpu_slices = None
    if devices_per_cell is not None:
        base, gpu_slices = _devices_per_cell(base, devices_per_cell, workers)
    if base.threads is None:  # one torch thread per worker: multi-threaded torch stalls under CPU contention
        base = merge(base, {"threads": 1})
    cells = cells_of(grid, base, list(seeds), out / "runs")
    preflight_grid(cells)  # model dirs, data files, critic_init, task options: the whole grid or nothing
    url = storage or default_storage(out)
    if storage is not None:
        check_url(storage, creates=out)
    endpoint, tuning = fixed_protocol(grid, out)
    pin = fixed_pin(grid, out, cells)
    return Plan(
        grid,
        cells,
        out,
        url,
        study,
        heartbeat_interval,
        grace_period,
        retries,
        gpu_slices,
        endpoint,
        tuning,
        pin,
    )


def manifest_path(out: Path, grid: Grid) -> Path:
    return Path(out) / "grids" / f"{grid.grid_id}.json"


def read_manifest(path: Path) -> dict | None:
    """A grid's manifest as it was recorded, None when the grid has not run yet."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{path}: the grid's manifest cannot be read ({e}); move it away to start the grid afresh"
        ) from None


def fixed_protocol(grid: Grid, out: Path) -> tuple[str, list]:
    """The grid's endpoint and tuning seeds: as its manifest recorded them when it first ran (a grid
    recorded before the protocol existed was reported on the last eval), else as the grid names them
    (default: protocol.DEFAULT_ENDPOINT, no tuning seeds). Naming others than the recorded ones is
    refused: the protocol is fixed before a grid runs."""
    path = manifest_path(out, grid)
    recorded = read_manifest(path)
    if recorded is None:
        return grid.endpoint or protocol.DEFAULT_ENDPOINT, list(grid.tuning_seeds or [])
    endpoint = protocol.parse_endpoint(
        recorded.get("endpoint", protocol.RECORDED_BEFORE), f"{path} endpoint"
    ).name
    tuning = recorded.get("tuning_seeds")
    if grid.endpoint is not None and grid.endpoint != endpoint:
        raise ValueError(
            f"endpoint {grid.endpoint}: grid {grid.grid_id!r} was started with endpoint {endpoint} "
            f"(recorded in {path}); a primary endpoint is fixed before the grid runs: drop --endpoint, or "
            "start a new grid (another --out)"
        )
    if tuning is not None and grid.tuning_seeds is not None and sorted(grid.tuning_seeds) != sorted(tuning):
        raise ValueError(
            f"tuning seeds {grid.tuning_seeds}: grid {grid.grid_id!r} was started with tuning seeds "
            f"{tuning} (recorded in {path}); they are fixed before the grid runs: drop --tuning-seeds, or "
            "start a new grid (another --out)"
        )
    return endpoint, sorted(tuning if tuning is not None else (grid.tuning_seeds or []))


def _devices_per_cell(base: RunConfig, k: int, workers: int):
    """Every cell on k devices; on GPUs, local worker i gets GPUs [i*k, (i+1)*k) of the visible
    ones (CUDA_VISIBLE_DEVICES), so workers never share a GPU. Returns (base, slices or None)."""
    from vapo_lit.devices import resolve_accelerator, visible_gpus

    if k < 1:
        raise ValueError(f"--devices-per-cell {k}: give a number of devices >= 1")
    if base.devices != "1":
        raise ValueError(f"--devices {base.devices} and --devices-per-cell {k}: give only --devices-per-cell")
    if base.num_nodes != 1:
        raise ValueError(
            f"--num_nodes {base.num_nodes}: a grid cell runs on one machine (workers on other machines "
            "join through --storage); use vapo-train for a multi-node run"
        )
    base = merge(base, {"devices": str(k)})
    if resolve_accelerator(base.accelerator) != "cuda":
        return base, None  # CPU processes (gloo): nothing to pin
    gpus = visible_gpus()
    if workers * k > len(gpus):
        raise ValueError(
            f"--workers {workers} x --devices-per-cell {k} needs {workers * k} GPUs; {len(gpus)} visible "
            f"({','.join(gpus) or 'none'}); use fewer workers or devices per cell"
        )
    return base, [",".join(gpus[i * k : (i + 1) * k]) for i in range(workers)]


def fixed_pin(grid: Grid, out: Path, cells) -> str | None:
    """The instruction set the grid is held to: as its manifest recorded it, else as the grid names
    it. Naming another than the recorded one is refused, and so is pinning a grid whose cells have
    already computed on another instruction set (their attempt ledgers say which)."""
    path = manifest_path(out, grid)
    recorded = (read_manifest(path) or {}).get("cpu_capability")
    if recorded is not None and grid.cpu_capability is not None and grid.cpu_capability != recorded:
        raise ValueError(
            f"cpu_capability {grid.cpu_capability}: grid {grid.grid_id!r} is pinned to {recorded} (recorded "
            f"in {path}); its cells compute alike only under one pin: drop --cpu-capability, or start a new "
            "grid (another --out)"
        )
    pin = recorded or grid.cpu_capability
    if pin is not None and recorded is None:
        others = sorted(
            {
                (rec.get("cpu_capability"), c.run_dir.name)
                for c in cells
                for rec in read_ledger(c.run_dir)
                if rec.get("cpu_capability") not in (None, cpu_pin.TORCH_NAME[pin])
            }
        )
        if others:
            sets = ", ".join(sorted({cap for cap, _ in others}))
            raise ValueError(
                f"cpu_capability {pin}: {len({run for _, run in others})} of grid {grid.grid_id!r}'s cells already "
                f"computed on {sets} (e.g. {others[0][1]}); pinning it now would mix instruction sets: start a "
                "new grid (another --out), or leave this one unpinned"
            )
    return pin


def write_manifest(p: Plan) -> Path:
    path = manifest_path(p.out, p.grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(
        {c.row: c for c in p.cells}.values(),
        key=lambda c: row_order(c.cfg.components, c.cfg.advantage_estimator, c.row),
    )
    data = {
        "grid": p.grid.grid_id,
        "description": p.grid.description,
        "storage": mask_url(p.url),
        "study": p.study,
        "wandb_group": p.grid.grid_id,
        "rows": [c.row for c in rows],
        **({"reference": p.grid.reference} if p.grid.reference else {}),
        **({"contrasts": [list(c) for c in p.grid.contrasts]} if p.grid.contrasts else {}),
        "endpoint": p.endpoint,
        "tuning_seeds": p.tuning_seeds,
        "cpu_capability": p.cpu_capability,
        "cells": [
            {
                "row": c.row,
                "seed": c.seed,
                "cell_id": c.cell_id,
                "run_dir": os.path.relpath(c.run_dir, p.out),
                "role": protocol.role(c.seed, p.tuning_seeds),
            }
            for c in p.cells
        ],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path


def open_store(p: Plan) -> CellStore:
    """Open the storage (creating OUT only now, after validation). Remote URLs are opened first,
    so a bad server leaves nothing on disk."""
    if is_sqlite(p.url):
        p.out.mkdir(parents=True, exist_ok=True)
        return CellStore(p.url, p.study, p.heartbeat_interval, p.grace_period, p.retries)
    store = CellStore(p.url, p.study, p.heartbeat_interval, p.grace_period, p.retries)
    p.out.mkdir(parents=True, exist_ok=True)
    return store


def prepare_models(cells, log=print) -> None:
    """Build (or load) each distinct built-in base policy and reward model once, here, before
    workers start: parallel workers would otherwise each build the same cache entry."""
    from vapo_lit.build import builtin_variant, load_models
    from vapo_lit.tasks import get_task

    seen = set()
    for c in cells:
        cfg = c.cfg
        key = (
            cfg.task,
            repr(sorted(cfg.task_options.items())),
            cfg.model,
            cfg.critic_init,
            cfg.model_seed,
            cfg.cache_dir,
            bool(builtin_variant(cfg)),
            repr(sorted(cfg.critic_model.items())),
            cfg.advantage_estimator == "grpo",
        )
        if cfg.model != "builtin" or key in seen:
            continue
        seen.add(key)
        t0 = time.time()
        load_models(cfg, get_task(cfg.task, **cfg.task_options))
        log(
            f"built-in models (model_seed {cfg.model_seed}) ready ({time.time() - t0:.0f} s; cached for later runs)"
        )


def seed_major(cells) -> list:
    """The cells seed by seed (rows in grid order within a seed): workers take waiting cells in the
    order they were queued, so a grid stopped part-way holds every row of its first seeds, which pair,
    rather than every seed of its first rows, which do not."""
    seeds = list(dict.fromkeys(c.seed for c in cells))
    return sorted(cells, key=lambda c: seeds.index(c.seed))


SETTLE_SECONDS, HAND_BACK_SECONDS = 10.0, 120.0


def stop_local_workers(
    procs, log, settle: float = SETTLE_SECONDS, hand_back: float = HAND_BACK_SECONDS
) -> None:
    """This process stopped early: stop its local worker processes so that their running cells are
    handed back now, not left running (nor left to time out); the caller has told them to claim no
    more cells. Ctrl-C on a terminal reaches every process of the group, `kill PID` or a scheduler's
    SIGTERM only this one: each worker gets `settle` seconds to stop on its own, then SIGINT (what
    Ctrl-C would have sent it) and `hand_back` seconds to hand its cell back; one still running after
    that, or when this process is interrupted again, is killed (its cell is retried once the grace
    period has passed)."""
    alive = [proc for proc in procs if proc.is_alive()]
    try:
        deadline = time.time() + settle
        for proc in alive:
            proc.join(max(0.0, deadline - time.time()))
        alive = [proc for proc in alive if proc.is_alive()]
        if alive:
            log(f"stopping {len(alive)} local worker process(es); their running cells are handed back")
        for proc in alive:
            os.kill(proc.pid, signal.SIGINT)
        deadline = time.time() + hand_back
        for proc in alive:
            proc.join(max(0.0, deadline - time.time()))
    except KeyboardInterrupt:
        pass
    killed = [proc for proc in procs if proc.is_alive()]
    for proc in killed:
        proc.kill()
        proc.join()
    if killed:
        log(
            f"killed {len(killed)} local worker process(es) that did not stop; their cells are taken over "
            "after the grace period (--grace) by the next run of the same command"
        )


def run(p: Plan, *, workers: int = 1, report=None, log=progress.say) -> int:
    """Enqueue the grid, work on it with `workers` local processes, then `report(plan)` (a callable
    returning the report's text, given by the CLI: the runner does not import the report).
    Returns 0 when every cell finished, 1 when some failed (after their retries). While the cells
    run, `progress.LiveView` shows what each running one is doing."""
    t0 = time.time()
    with progress.LiveView(p.grid.grid_id, p.cells) as view:
        code, status = _work(p, workers, view, view.around(log))
    for cid, err in (status.errors or {}).items():
        name = next(c.cfg.name for c in p.cells if c.cell_id == cid)
        log(f"FAILED {name}: {err.strip().splitlines()[0] if err.strip() else err}")
    if report is not None:
        log(report(p))
    log(f"[{p.grid.grid_id}] finished in {progress.fmt_seconds(time.time() - t0)}")
    return code


def _work(p: Plan, workers: int, view: progress.LiveView, log):
    """Enqueue, build the models, run the local workers; (exit code, the grid's status)."""
    if p.cpu_capability is not None:  # before anything is written or built
        cpu_pin.check(p.cpu_capability)
    store = open_store(p)
    write_manifest(p)
    counts = store.enqueue(seed_major(p.cells), p.grid.grid_id)
    log(
        f"[{p.grid.grid_id}] {len(p.cells)} cells ({len({c.row for c in p.cells})} rows x "
        f"{len({c.seed for c in p.cells})} seeds): {counts['new']} queued, {counts['reused']} already finished "
        f"(reused), {counts['pending']} queued or running from before · storage {mask_url(p.url)} · W&B group "
        f"{p.grid.grid_id}"
    )
    if any(c.cfg.model == "builtin" for c in p.cells):
        view.note = "building or loading the built-in models (no cell running yet)"
    prepare_models(p.cells, log=log)
    view.note = None
    specs = [
        WorkerSpec(
            p.url,
            p.study,
            p.grid.grid_id,
            p.cells,
            p.heartbeat_interval,
            p.grace_period,
            p.retries,
            workers,
            gpus=p.gpu_slices[i] if p.gpu_slices else None,
        )
        for i in range(workers)
    ]
    spec = specs[0]
    procs, stop = [], None
    if workers > 1:
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()  # set when this process stops early: the workers claim no more cells
        procs = [ctx.Process(target=work_in_subprocess, args=(s, stop), daemon=False) for s in specs[1:]]
        for proc in procs:
            proc.start()
    try:
        work(spec, log=log)
    except BaseException:  # interrupted (or stopped by an error): the other workers stop too
        if stop is not None:
            stop.set()
        stop_local_workers(procs, log)
        raise
    finally:
        for proc in procs:
            proc.join()
    crashed = [proc.exitcode for proc in procs if proc.exitcode != 0]
    if crashed:
        log(f"[{p.grid.grid_id}] {len(crashed)} local worker process(es) exited with codes {crashed}")
    status = store.status([c.cell_id for c in p.cells])
    return (0 if status.failed == 0 and not crashed else 1), status
