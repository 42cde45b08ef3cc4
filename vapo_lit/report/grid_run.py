"""The grid run: one W&B run per grid (job_type `report`, in the grid's group) that holds what the
report folder holds, so the grid can be compared in W&B as it is on disk.

    from vapo_lit.report.grid_run import log_grid_run
    print(log_grid_run("runs/ablate/reports/table1"))

It reads only the report folder that `write_report` wrote and the run cards of the runs listed in
its seeds.csv (their W&B id, project, group and mode):
- `grid/table`: table.csv, every column (paired deltas, Holm p, ...), one row per table row;
  `grid/seeds`: seeds.csv; every other CSV of the folder as `grid/<name>`;
- `figures/<name>`: each PNG of the folder;
- `grid/caveats`: the lines of "What these deltas do and do not support"; `grid/report`: all of
  table.md as preformatted text;
- `grid/cells`: row, seed, run folder and W&B run id (and URL, online) of every cell run; the ids
  are in the config too.
The run's id is derived from project and group (`vapo_lit.wandb_runs.stable_id`), so rerunning the
report updates this one run. Mode (`auto`): offline when the cells were logged offline; when some
were online, online if logged in, else offline. No grid run when no cell was logged to W&B.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

CAVEATS_HEADER = "## What these deltas do and do not support"
PREFIX = "grid/"


def parse_cell(text: str):
    """A CSV field as W&B should show it: '' -> None, integers and finite floats as numbers, the rest as text."""
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def read_csv(path: Path) -> tuple[list[str], list[list]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return [], []
    return rows[0], [[parse_cell(x) for x in r] for r in rows[1:]]


def caveat_lines(markdown: str) -> list[str]:
    """The caveats section of table.md, one entry per paragraph or bullet."""
    if CAVEATS_HEADER not in markdown:
        return []
    body = markdown.split(CAVEATS_HEADER, 1)[1]
    out = []
    for line in body.splitlines():
        if line.startswith("## ") or line.startswith("Figures:"):
            break
        if line.strip():
            out.append(line.strip())
    return out


def cell_runs(folder: Path) -> list[dict]:
    """Every run of seeds.csv with its W&B record from its run card (empty where it has none)."""
    header, rows = read_csv(folder / "seeds.csv")
    cells = []
    for r in rows:
        rec = dict(zip(header, r))
        card_path = folder / str(rec["run"]) / "run_card.json"
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
        wb = card.get("wandb") or {}
        cells.append(
            {
                "row": rec["row"],
                "seed": rec["seed"],
                "run": str(rec["run"]),
                "id": wb.get("id"),
                "project": wb.get("project"),
                "group": wb.get("group"),
                "mode": wb.get("mode"),
            }
        )
    return cells


def _common(values, fallback: str) -> str:
    values = [v for v in values if v]
    return Counter(values).most_common(1)[0][0] if values else fallback


def log_grid_run(
    folder, *, grid: str | None = None, mode: str = "auto", settings: dict | None = None
) -> str | None:
    """Log the report in FOLDER as its grid's run; returns one line saying where it went (None when
    no cell was logged to W&B or the mode is disabled)."""
    from vapo_lit.wandb_runs import offline_folder, summary_run

    folder = Path(folder)
    cells = cell_runs(folder)
    logged = [c for c in cells if c["id"]]
    if not logged or mode == "disabled":
        return None
    if mode == "auto" and "online" not in {c["mode"] for c in logged}:
        mode = (
            "offline"  # like the cells: a grid run online that links to runs not uploaded yet would mislead
        )
    project = _common([c["project"] for c in logged], "vapo-lit")
    group = _common([c["group"] for c in logged], grid or folder.name)
    config = {
        "grid": grid or group,
        "report_folder": folder.name,
        "rows": list(dict.fromkeys(c["row"] for c in cells)),
        "cell_run_ids": [c["id"] for c in logged],
        "report_settings": dict(settings or {}),
    }
    run = summary_run(
        folder, kind="report", project=project, group=group, name=f"{group}-report", config=config, mode=mode
    )
    if run is None:
        return None
    try:
        where = offline_folder(run)
        base = "" if where else run.url.rsplit("/runs/", 1)[0] + "/runs/"  # (an offline run has no URL)
        run.log(report_row(folder, cells, base))
        run.summary.update({"cells": len(cells), "cells_in_wandb": len(logged)})
    finally:
        run.finish()
    if where:
        return (
            f"W&B grid run {run.id} (group {group}, offline); upload it with: wandb sync {where} "
            f"(the cells' command is in {folder / 'table.md'})"
        )
    return f"W&B grid run {run.id} (group {group}): {run.url}"


def report_row(folder: Path, cells: list[dict], base: str) -> dict:
    """The grid run's one row: the report's CSV files as tables, the cells (each linked under `base`,
    the project's runs URL; "" offline), the caveats, the report's text and its figures."""
    import wandb

    row = {}
    for path in sorted(folder.glob("*.csv")):
        columns, data = read_csv(path)
        row[PREFIX + path.stem] = wandb.Table(columns=columns, data=data, allow_mixed_types=True)
    row[PREFIX + "cells"] = wandb.Table(
        columns=["row", "seed", "run", "wandb_id", "project", "group", "mode", "url"],
        data=[
            [
                c["row"],
                c["seed"],
                c["run"],
                c["id"],
                c["project"],
                c["group"],
                c["mode"],
                base + c["id"] if base and c["id"] else None,
            ]
            for c in cells
        ],
        allow_mixed_types=True,
    )
    markdown = (folder / "table.md").read_text() if (folder / "table.md").is_file() else ""
    row[PREFIX + "caveats"] = wandb.Table(
        columns=["caveat"], data=[[line] for line in caveat_lines(markdown)]
    )
    row[PREFIX + "report"] = wandb.Html("<pre>" + _escape(markdown) + "</pre>")
    for png in sorted(folder.glob("*.png")):
        row[f"figures/{png.stem}"] = wandb.Image(str(png))
    return row


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def log_grid_runs(
    out,
    grid_id: str | None = None,
    *,
    to=None,
    since: float = 0.0,
    mode: str = "auto",
    settings: dict | None = None,
) -> list[str]:
    """`log_grid_run` for each report folder that `write_report(out, grid_id, to=to)` wrote at or
    after `since` (a time.time(); grids skipped for want of logs keep no fresh folder)."""
    from vapo_lit.report.write import grids_in

    out = Path(out)
    ids = [grid_id] if grid_id else (grids_in(out) or [None])
    lines = []
    for gid in ids:
        folder = Path(to) if to is not None else out / "reports" / (gid or "runs")
        table = folder / "table.csv"
        if table.is_file() and table.stat().st_mtime >= since - 1.0:
            try:
                line = log_grid_run(folder, grid=gid, mode=mode, settings=settings)
            except Exception as e:  # noqa: BLE001 - the report is written; W&B trouble must not fail it
                line = f"W&B grid run not logged for {folder}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            lines += [line] if line else []
    return lines
