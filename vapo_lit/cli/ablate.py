"""vapo-ablate: the full VAPO recipe against recipes with components removed, over seeds, then a table.

    vapo-ablate --drop=value_pretraining                  # full recipe vs without value pretraining
    vapo-ablate --drop decoupled_gae,length_adaptive_gae  # a joint drop
    vapo-ablate --grid table1 --seeds 3 --workers 2       # ablations/table1.yaml, two local processes
    vapo-ablate --grid table1 --storage postgresql://user@db/vapo --out /shared/abl   # on each machine
    vapo-ablate --drop clip_higher --preset smoke --steps 5  # any config flag goes to every cell

Rerunning the same command resumes: finished cells are reused, a killed cell continues from its
last checkpoint (after --grace seconds without heartbeat), failed cells get a fresh set of retries.
Results: OUT/runs/ (run folders), OUT/reports/<grid>/ (table.md/.tex/.csv, figures).
Database password: VAPO_LIT_STORAGE_PASSWORD or --storage-password-file (kept out of `ps`).
Exit codes: 0 done, 1 runtime failure (failed cells, disk full, storage error), 2 bad input
(nothing was started), 130 interrupted (rerun the same command to continue).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vapo_lit.cli import errors
from vapo_lit.cli.args import add_config_flags, add_selection_flags, config_from_args, parse_components


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vapo-ablate", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection_flags(ap)
    ap.add_argument("--grid", help="a grid in ablations/ (table1, pairwise, critic_free) or a YAML path")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per row: --seed, --seed+1, ... (default 1)")
    ap.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    ap.add_argument("--storage", help="Optuna RDB URL shared by all workers (default: sqlite:///OUT/ablate.db)")
    ap.add_argument("--storage-password-file", type=Path, metavar="FILE",
                    help="database password on the first line of FILE (or set VAPO_LIT_STORAGE_PASSWORD)")
    ap.add_argument("--study", default="vapo-ablate", help="study name inside the storage (default vapo-ablate)")
    ap.add_argument("--out", type=Path, default=Path("runs/ablate"), help="output folder (default runs/ablate)")
    ap.add_argument("--retries", type=int, default=2, help="retries of a crashed or dead cell (default 2)")
    ap.add_argument("--heartbeat", type=int, default=10, help="heartbeat interval, seconds (default 10)")
    ap.add_argument("--grace", type=int, default=60, help="a cell without heartbeat for this long is retried (default 60)")
    ap.add_argument("--last-n", type=int, default=10, help="report: average the last N PPO iterations (default 10)")
    ap.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    add_config_flags(ap)
    return ap


def make_plan(args):
    """Validate the command line into a Plan (ValueError on anything wrong; nothing is written)."""
    from vapo_lit.ablate.grid import grid_from_drop, load_grid
    from vapo_lit.ablate.runner import plan

    if args.only is not None:
        raise ValueError("--only is not a vapo-ablate flag; use --drop or --grid")
    for flag, instead in (("out_dir", "--out"), ("name", "--out"), ("components", "--drop or --grid"),
                          ("wandb_group", "the grid's name"), ("wandb_job_type", "the row labels")):
        if getattr(args, f"set:{flag}") is not None:
            raise ValueError(f"--{flag} is set by vapo-ablate per cell; use {instead}")
    drop = parse_components(args.drop or None, "--drop")
    if (drop is None) == (args.grid is None):
        raise ValueError("give exactly one of --drop COMPONENT[,COMPONENT] or --grid NAME")
    if drop == []:
        raise ValueError("--drop needs at least one component")
    grid = grid_from_drop(drop) if drop else load_grid(args.grid)
    args.drop = ""
    base = config_from_args(args)
    return plan(grid, base, range(base.seed, base.seed + args.seeds), args.out, args.storage, workers=args.workers,
                retries=args.retries, heartbeat_interval=args.heartbeat, grace_period=args.grace, study=args.study)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from vapo_lit.ablate.urls import mask_text, scrub_argv, with_password

    scrub_argv()  # no database password in sys.argv from here on (W&B records it)
    try:
        args.storage = with_password(args.storage, args.storage_password_file)
        p = make_plan(args)
    except ValueError as e:
        print(f"vapo-ablate: error: {mask_text(e, args.storage)}", file=sys.stderr)
        return errors.BAD_INPUT
    from vapo_lit.ablate.runner import run

    # SIGTERM like Ctrl-C: running cells are handed back, not left to time out
    with errors.catch_signals():
        try:
            return run(p, workers=args.workers, report=not args.no_report, last_n=args.last_n)
        except ValueError as e:
            print(f"vapo-ablate: error: {mask_text(e, args.storage)}", file=sys.stderr)
            return errors.BAD_INPUT
        except (KeyboardInterrupt, SystemExit):
            print("vapo-ablate: interrupted; rerun the same command to continue (finished cells are kept, running "
                  "ones resume from their last checkpoint)", file=sys.stderr)
            return errors.INTERRUPTED
        except Exception as e:  # noqa: BLE001 - one line and a stable code, never a traceback
            print(f"vapo-ablate: error: {mask_text(failure(e, p.out, p.url), p.url)}", file=sys.stderr)
            return errors.RUNTIME


def failure(e: Exception, out: Path, url: str) -> str:
    """The one line for a fault that stopped the grid (the cells' own crashes are retried instead)."""
    from vapo_lit.ablate.urls import mask_text
    from vapo_lit.ablate.worker import WorkerStopped

    if isinstance(e, WorkerStopped):
        return str(e)
    if errors.disk_full(e, out):
        return (f"disk full ({errors.first_line(e)}; {errors.free_text(out)} under {out}); free some space, then "
                "rerun the same command to continue")
    if errors.is_storage_error(e):
        return (f"storage error ({type(e).__name__}: {errors.first_line(e)}); check the database server, then rerun "
                "the same command to continue")
    where = errors.save_traceback(out, e, mask=lambda text: mask_text(text, url))
    return f"{type(e).__name__}: {errors.first_line(e)}{where}; rerun the same command to continue"


if __name__ == "__main__":
    sys.exit(main())
