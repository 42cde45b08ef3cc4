"""vapo-report: Table-1-style tables and Figure-2-style plots from run folders' CSV logs (no network).

    vapo-report runs/ablate                 # every grid of a vapo-ablate output folder
    vapo-report runs/ablate --grid table1   # one grid
    vapo-report runs/                       # any folder of run folders (rows from their configs)

Writes OUT_DIR/reports/<grid>/table.{md,tex,csv}, seeds.csv and four PNGs; prints the Markdown.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vapo-report", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path, help="a vapo-ablate output folder or a folder of run folders")
    ap.add_argument("--grid", help="only this grid (a name in OUT_DIR/grids/)")
    ap.add_argument("--last-n", type=int, default=10, help="average the last N PPO iterations (default 10)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.out_dir.is_dir():
        print(f"vapo-report: error: {args.out_dir} is not a folder", file=sys.stderr)
        return 2
    if args.last_n < 1:
        print("vapo-report: error: --last-n must be >= 1", file=sys.stderr)
        return 2
    from vapo_lit.report import grids_in, write_report

    if args.grid and args.grid not in grids_in(args.out_dir):
        print(f"vapo-report: error: no grid {args.grid!r} in {args.out_dir}/grids; available: "
              f"{', '.join(grids_in(args.out_dir)) or '(none)'}", file=sys.stderr)
        return 2
    print(write_report(args.out_dir, grid_id=args.grid, last_n=args.last_n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
