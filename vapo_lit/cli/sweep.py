"""vapo-sweep: Optuna hyperparameter search over config paths, pruning on eval score, resumable.

    vapo-sweep vapo_alpha                                    # a shipped sweep by name: TPE, 30 trials
    vapo-sweep sweeps/vapo_alpha.yaml                        # or a sweep file (your own copy, say)
    vapo-sweep sweeps/vapo_alpha.yaml --n-trials 50          # continue the same study to 50
    vapo-sweep sweeps/vapo_alpha.yaml --storage postgresql://user:pass@db/vapo   # one per machine
    vapo-sweep sweeps/vapo_alpha.yaml --preset smoke --model random --steps 4    # flags override the file
    optuna-dashboard sqlite:///runs/sweeps/sweeps.db         # browse (pip install optuna-dashboard)

Settings: preset (file's `preset:` or --preset) < file's `base:` < command-line config flags.
Trials: runs/sweeps/trials/<study>-t<n>/ (train() run folders). Rerun the command to continue.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vapo_lit.cli.args import add_config_flags


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vapo-sweep", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", help="a sweep file, or the name of a shipped sweep (./sweeps/NAME.yaml first; "
                                  "e.g. vapo_alpha)")
    ap.add_argument("--preset", help="base settings (default: the file's preset, else default)")
    ap.add_argument("--n-trials", type=int, help="COMPLETE+PRUNED trials to reach (default: the file's n_trials)")
    ap.add_argument("--storage", help="Optuna RDB URL (default sqlite:///OUT/sweeps.db)")
    ap.add_argument("--study", help="study name (default: the file's study)")
    ap.add_argument("--out", type=Path, default=Path("runs/sweeps"), help="output folder (default runs/sweeps)")
    ap.add_argument("--retries", type=int, default=2, help="retries of a trial whose worker died (default 2)")
    ap.add_argument("--heartbeat", type=int, default=10, help="heartbeat interval, seconds (default 10)")
    ap.add_argument("--grace", type=int, default=60, help="seconds without heartbeat before a trial is retried")
    add_config_flags(ap)
    return ap


def base_config(spec, args):
    """preset < the file's base < command-line flags; validated."""
    from vapo_lit.config import RunConfig, merge, parse_flat, validate
    from vapo_lit.presets import PRESETS

    preset = args.preset or spec.preset
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is not valid; choose one of: {', '.join(PRESETS)}")
    cfg = merge(merge(RunConfig(), PRESETS[preset]), spec.base)
    flat = {k[4:]: v for k, v in vars(args).items() if k.startswith("set:") and v is not None}
    for taken in ("out_dir", "name"):
        if taken in flat:
            raise ValueError(f"--{taken} is set per trial by vapo-sweep; use --out")
    return validate(merge(cfg, parse_flat(flat)))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from vapo_lit.ablate.store import check_url, mask_text
    from vapo_lit.ablate.sweep import load_sweep, run_sweep

    try:
        spec = load_sweep(args.sweep)
        if args.study:
            spec.study = args.study
        base = base_config(spec, args)
        if args.storage:
            check_url(args.storage)
        if args.n_trials is not None and args.n_trials < 1:
            raise ValueError("--n-trials must be >= 1")
        if base.threads is None:
            from vapo_lit.config import merge

            base = merge(base, {"threads": 1})
        run_sweep(spec, base, args.out, args.storage, n_trials=args.n_trials, heartbeat_interval=args.heartbeat,
                  grace_period=args.grace, retries=args.retries)
    except ValueError as e:
        print(f"vapo-sweep: error: {mask_text(e, args.storage)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
