"""vapo-report: Table-1-style tables and Figure-2-style plots from run folders' logs (no network).

    vapo-report runs/ablate                 # every grid of a vapo-ablate output folder
    vapo-report runs/ablate --grid table1   # one grid
    vapo-report runs/                       # any folder of run folders (rows from their configs)
    vapo-report runs/ablate --grid table1 --threshold 80 --to reports/table1   # fixed threshold, own folder
    vapo-report runs/ablate --grid table1 --wandb-workspace --wandb-entity ME  # + a saved W&B workspace

Writes OUT_DIR/reports/<grid>/table.{md,tex,csv}, seeds.csv, calibration.csv and the figures;
prints the Markdown. When the cells were logged to W&B, the report is logged too, as the grid's
run (job_type report, in the grid's group; offline when the cells were offline; a rerun
updates the same run): see vapo_lit/report/grid_run.py. Exit 2 (one line on stderr) for a bad argument, a malformed or empty log
(the file and line named) or a folder without any run log.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _threshold(text: str):
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give points in [0, 100] or 'auto'") from None
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text!r}: give points in [0, 100] or 'auto'")
    return value


def contrast_pair(spec: str) -> tuple[str, str]:
    """--contrast ROW:AGAINST as a pair (the labels are checked against the grid's rows later)."""
    row, sep, against = spec.partition(":")
    if not sep or not row or not against or row == against:
        raise ValueError(f"--contrast {spec!r}: expected ROW:AGAINST, two different row labels")
    return row, against


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vapo-report",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("out_dir", type=Path, help="a vapo-ablate output folder or a folder of run folders")
    ap.add_argument("--grid", help="only this grid (a name in OUT_DIR/grids/)")
    ap.add_argument("--last-n", type=int, default=10, help="average the last N PPO iterations (default 10)")
    ap.add_argument(
        "--threshold",
        type=_threshold,
        default="auto",
        help="sample efficiency: PPO updates until the eval reaches this score, in points; "
        "auto (default) = 90%% of the full recipe's mean peak, rounded down",
    )
    ap.add_argument(
        "--reference",
        default=None,
        help="the row the deltas are taken against (default: the grid's `reference:`, else the full "
        "recipe, 'vapo')",
    )
    ap.add_argument(
        "--contrast",
        action="append",
        default=[],
        metavar="ROW:AGAINST",
        help="also compare these two rows, paired by seed (repeatable; besides the grid's `contrasts:`)",
    )
    ap.add_argument(
        "--max-seeds",
        type=int,
        default=20,
        help="seeds-needed estimates above this are reported as not reachable (default 20)",
    )
    ap.add_argument("--no-figures", action="store_true", help="tables only (the PNGs take most of the time)")
    ap.add_argument(
        "--to",
        type=Path,
        help="write the report into this folder (one grid only; default OUT_DIR/reports/<grid>)",
    )
    ap.add_argument(
        "--wandb",
        choices=("auto", "online", "offline", "disabled"),
        default="auto",
        help="the grid run: auto (default) = like the cells (offline when they were logged offline; "
        "online when they were online and you are logged in); none when no cell was logged to W&B",
    )
    ap.add_argument(
        "--wandb-workspace",
        action="store_true",
        help="also save a W&B workspace for the grid's group: rows grouped by job_type, the diagnostic "
        "panels on the ppo/update axis (needs an online W&B account and the 'workspace' extra)",
    )
    ap.add_argument(
        "--wandb-entity", help="--wandb-workspace: the W&B entity (default: the account's default entity)"
    )
    return ap


def workspace_error(args) -> str | None:
    """Why --wandb-workspace cannot run here (checked before anything is computed)."""
    if not args.wandb_workspace:
        return "--wandb-entity is a --wandb-workspace flag" if args.wandb_entity else None
    from vapo_lit.wandb_runs import wandb_mode

    if args.wandb in ("offline", "disabled") or wandb_mode(args.wandb) != "online":
        return (
            "--wandb-workspace saves the workspace to W&B and needs an online account: run `wandb login` "
            "(or set WANDB_API_KEY) and leave --wandb at auto or online"
        )
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        return "--wandb-workspace needs the wandb-workspaces library: pip install 'vapo-lit[workspace]'"
    return None


def argument_error(args) -> str | None:
    """What is wrong with the parsed arguments (None when nothing); parses the --contrast pairs."""
    if not args.out_dir.is_dir():
        return f"{args.out_dir} is not a folder"
    if args.last_n < 1:
        return "--last-n must be >= 1"
    if args.max_seeds < 2:
        return "--max-seeds must be >= 2"
    try:
        args.contrast = [contrast_pair(c) for c in args.contrast]
    except ValueError as e:
        return str(e)
    return workspace_error(args)


def grid_error(args, grids: list[str]) -> str | None:
    """What is wrong with --grid, --to and --contrast given the grids in the folder (None when nothing)."""
    if args.grid and args.grid not in grids:
        return f"no grid {args.grid!r} in {args.out_dir}/grids; available: {', '.join(grids) or '(none)'}"
    if args.to is not None and not args.grid and len(grids) > 1:
        return f"--to takes one grid; add --grid (one of {', '.join(grids)})"
    if args.contrast and not args.grid and len(grids) > 1:
        return f"--contrast names rows of one grid; add --grid (one of {', '.join(grids)})"
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    err = argument_error(args)
    if not err:
        from vapo_lit.report import grids_in

        err = grid_error(args, grids_in(args.out_dir))
    if err:
        print(f"vapo-report: error: {err}", file=sys.stderr)
        return 2
    import time

    from vapo_lit.report import write_report

    since = time.time()
    try:
        print(
            write_report(
                args.out_dir,
                grid_id=args.grid,
                last_n=args.last_n,
                to=args.to,
                reference=args.reference,
                threshold=args.threshold,
                max_seeds=args.max_seeds,
                figures=not args.no_figures,
                contrasts=args.contrast,
            )
        )
    except ValueError as e:  # LogError included: a malformed or empty log, named by file and line
        print(f"vapo-report: error: {e}", file=sys.stderr)
        return 2
    log_to_wandb(args, since)
    return 0


def log_to_wandb(args, since: float) -> None:
    """The report's W&B runs (vapo_lit.report.grid_run) and, when asked, the saved workspaces."""
    from vapo_lit.report.grid_run import log_grid_runs

    settings = {
        "last_n": args.last_n,
        "threshold": args.threshold,
        "reference": args.reference or "default",
        "max_seeds": args.max_seeds,
        "contrasts": [":".join(c) for c in args.contrast],
    }
    for line in log_grid_runs(
        args.out_dir, args.grid, to=args.to, since=since, mode=args.wandb, settings=settings
    ):
        print(line)
    if args.wandb_workspace:
        from vapo_lit.report.workspace import save_workspaces

        for line in save_workspaces(args.out_dir, args.grid, to=args.to, entity=args.wandb_entity):
            print(line)


if __name__ == "__main__":
    sys.exit(main())
