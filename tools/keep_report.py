"""Keep a grid's study in reports/: copy its manifest (`grids/<grid>.json`) and, for every cell the
manifest names, the logs a report is computed from (metrics.csv, config.yaml, run_card.json,
attempts.jsonl, summary.json, and samples.jsonl where the run kept samples; no checkpoints, exported
models or W&B files) into TO, in the same `runs/<run>/` layout, then write the report there. A run
whose policy was loaded from a `vapo-warmup` folder also keeps that folder's WARMUP.json (what the
warm-up was: its settings and loss per step). Only finished cells are kept (those with a
`summary.json`, which a run writes at its end): a cell still running, failed or not started is left
out and named, and the report says which seeds are missing, so a grid's finished cells can be kept
as they complete.

    python tools/keep_report.py runs/table1-long --grid table1_long --to reports/table1-long [--replace]

TO must not exist unless --replace is given (then its runs/ and grids/ are replaced).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from vapo_lit.warmup import WARMUP_FILE as WARMUP

LOGS = ("metrics.csv", "config.yaml", "run_card.json", "attempts.jsonl", "summary.json", "samples.jsonl")


def warmup_record(run: Path) -> Path | None:
    """The WARMUP.json of the folder the run's policy was loaded from, if it has one."""
    card = json.loads((run / "run_card.json").read_text()) if (run / "run_card.json").is_file() else {}
    loaded = ((card.get("base_models") or {}).get("policy") or {}).get("loaded_from")
    record = Path(loaded) / WARMUP if loaded else None
    return record if record is not None and record.is_file() else None


def keep(out: Path, grid: str, to: Path, replace: bool = False) -> list[str]:
    """Copy the study; returns the run folders that had no log (left out)."""
    manifest = out / "grids" / f"{grid}.json"
    if not manifest.is_file():
        found = sorted(p.stem for p in (out / "grids").glob("*.json"))
        raise ValueError(f"no grid manifest {manifest}; grids in {out}: {', '.join(found) or '(none)'}")
    if to.exists() and not replace:
        raise ValueError(f"{to} exists; add --replace to replace its runs/ and grids/")
    cells = json.loads(manifest.read_text())["cells"]
    missing = [c["run_dir"] for c in cells if not (out / c["run_dir"] / "summary.json").is_file()]
    for sub in ("runs", "grids"):
        shutil.rmtree(to / sub, ignore_errors=True)
    (to / "grids").mkdir(parents=True)
    shutil.copy2(manifest, to / "grids" / manifest.name)
    for c in cells:
        if c["run_dir"] in missing:
            continue
        dest = to / c["run_dir"]
        dest.mkdir(parents=True)
        for name in LOGS:
            if (out / c["run_dir"] / name).is_file():
                shutil.copy2(out / c["run_dir"] / name, dest / name)
        record = warmup_record(out / c["run_dir"])
        if record is not None:
            shutil.copy2(record, dest / WARMUP)
    return missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the grid's output folder (vapo-ablate --out)")
    ap.add_argument("--grid", required=True, help="the grid's id (its manifest grids/<grid>.json)")
    ap.add_argument("--to", required=True, type=Path, help="the report folder to keep, e.g. reports/<name>")
    ap.add_argument("--replace", action="store_true", help="replace TO's runs/ and grids/ if it exists")
    ap.add_argument("--no-figures", action="store_true", help="write the text files only")
    args = ap.parse_args(argv)
    try:
        missing = keep(args.out, args.grid, args.to, args.replace)
    except ValueError as e:
        print(f"keep_report: error: {e}", file=sys.stderr)
        return 2
    for run in missing:
        print(f"keep_report: {args.out / run} has not finished (no summary.json); left out")
    from vapo_lit.cli.report import main as report

    return report(
        [
            str(args.to),
            "--grid",
            args.grid,
            "--to",
            str(args.to),
            "--wandb",
            "disabled",
            *(["--no-figures"] if args.no_figures else []),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
