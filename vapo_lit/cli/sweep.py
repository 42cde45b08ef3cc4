"""vapo-sweep: Optuna hyperparameter search over config paths, pruning on eval score, resumable.

    vapo-sweep vapo_alpha                                    # a shipped sweep by name: TPE, 30 trials
    vapo-sweep sweeps/vapo_alpha.yaml                        # or a sweep file (your own copy, say)
    vapo-sweep sweeps/vapo_alpha.yaml --n-trials 50          # continue the same study to 50
    vapo-sweep sweeps/vapo_alpha.yaml --storage postgresql://user@db/vapo   # one per machine
    vapo-sweep sweeps/vapo_alpha.yaml --preset smoke --model random --steps 4    # flags override the file
    optuna-dashboard sqlite:///runs/sweeps/sweeps.db         # browse (pip install optuna-dashboard)

Settings: preset (file's `preset:` or --preset) < file's `base:` < command-line config flags.
Trials: runs/sweeps/trials/<study>-t<n>/ (train() run folders). Rerun the command to continue.
Database password: VAPO_LIT_STORAGE_PASSWORD or --storage-password-file (kept out of `ps`).
Exit codes: 0 done, 1 runtime failure, 2 bad input (nothing was started), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vapo_lit.cli import errors
from vapo_lit.cli.args import add_config_flags


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vapo-sweep",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "sweep",
        help="a sweep file, or the name of a shipped sweep (./sweeps/NAME.yaml first; e.g. vapo_alpha)",
    )
    ap.add_argument("--preset", help="base settings (default: the file's preset, else default)")
    ap.add_argument(
        "--n-trials", type=int, help="COMPLETE+PRUNED trials to reach (default: the file's n_trials)"
    )
    ap.add_argument("--storage", help="Optuna RDB URL (default sqlite:///OUT/sweeps.db)")
    ap.add_argument(
        "--storage-password-file",
        type=Path,
        metavar="FILE",
        help="database password on the first line of FILE (or set VAPO_LIT_STORAGE_PASSWORD)",
    )
    ap.add_argument("--study", help="study name (default: the file's study)")
    ap.add_argument(
        "--out", type=Path, default=Path("runs/sweeps"), help="output folder (default runs/sweeps)"
    )
    ap.add_argument("--retries", type=int, default=2, help="retries of a trial whose worker died (default 2)")
    ap.add_argument("--heartbeat", type=int, default=10, help="heartbeat interval, seconds (default 10)")
    ap.add_argument(
        "--grace", type=int, default=60, help="seconds without heartbeat before a trial is retried"
    )
    add_config_flags(ap)
    return ap


def base_config(spec, args):
    """preset < the file's base < command-line flags; validated."""
    from vapo_lit.cli.args import parse_flat
    from vapo_lit.config import RunConfig, merge, validate
    from vapo_lit.presets import PRESETS, preset_task_options

    preset = args.preset or spec.preset
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is not valid; choose one of: {', '.join(PRESETS)}")
    cfg = merge(merge(RunConfig(), PRESETS[preset]), spec.base)
    flat = {k[4:]: v for k, v in vars(args).items() if k.startswith("set:") and v is not None}
    for taken in ("out_dir", "name"):
        if taken in flat:
            raise ValueError(f"--{taken} is set per trial by vapo-sweep; use --out")
    cfg = merge(cfg, parse_flat(flat))
    if "task_options" not in flat and "task_options" not in spec.base:
        cfg = merge(cfg, {"task_options": preset_task_options(preset, cfg.task)})
    return validate(cfg)


def check_space(spec, base) -> None:
    """Each end of every search range (and every categorical choice) must give a valid config:
    Optuna does not count failed trials, so a range that leaves the valid one would fail forever."""
    from vapo_lit.config import merge, nest, validate

    for name, dist in spec.space.items():
        values = dist["choices"] if dist["type"] == "categorical" else [dist["low"], dist["high"]]
        for value in values:
            try:
                validate(merge(base, nest({name: value})))
            except ValueError as e:
                raise ValueError(
                    f"{spec.study}: space {name}: the value {value!r} gives an invalid run ({e})"
                ) from None


class _NoTraceback:
    """Optuna logs every failed trial with its traceback; the message already names the error."""

    def filter(self, record) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


def checked_sweep(args):
    """(the sweep, its base config) from the parsed arguments, every input checked before anything
    runs (ValueError names what is wrong); the storage URL gets its password."""
    from vapo_lit.ablate.store import check_url
    from vapo_lit.ablate.sweep import load_sweep
    from vapo_lit.ablate.urls import with_password
    from vapo_lit.config import merge
    from vapo_lit.preflight import check_writable, preflight

    args.storage = with_password(args.storage, args.storage_password_file)
    spec = load_sweep(args.sweep)
    if args.study:
        spec.study = args.study
    base = base_config(spec, args)
    check_space(spec, base)
    if args.storage:
        check_url(args.storage, creates=args.out)
    if args.n_trials is not None and args.n_trials < 1:
        raise ValueError("--n-trials must be >= 1")
    if base.threads is None:
        base = merge(base, {"threads": 1})
    check_writable(args.out, "--out")
    preflight(merge(base, {"out_dir": str(args.out / "trials")}))  # model dirs, data, critic_init, options
    return spec, base


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from vapo_lit.ablate.store import mask_text
    from vapo_lit.ablate.sweep import run_sweep
    from vapo_lit.masking import scrub_argv

    scrub_argv()  # no database password in sys.argv from here on (W&B records it)
    try:
        spec, base = checked_sweep(args)
    except ValueError as e:
        print(f"vapo-sweep: error: {mask_text(e, args.storage)}", file=sys.stderr)
        return errors.BAD_INPUT
    import logging

    import optuna  # noqa: F401 - sets up Optuna's log handler, which gets the filter

    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(_NoTraceback())
    with errors.catch_signals():
        try:
            run_sweep(
                spec,
                base,
                args.out,
                args.storage,
                n_trials=args.n_trials,
                heartbeat_interval=args.heartbeat,
                grace_period=args.grace,
                retries=args.retries,
            )
        except ValueError as e:
            print(f"vapo-sweep: error: {mask_text(e, args.storage)}", file=sys.stderr)
            return errors.BAD_INPUT
        except (KeyboardInterrupt, SystemExit):
            print(
                "vapo-sweep: interrupted; rerun the same command to continue (the running trial resumes from its "
                "last checkpoint)",
                file=sys.stderr,
            )
            return errors.INTERRUPTED
        except Exception as e:  # noqa: BLE001 - one line and a stable code, never a traceback
            what = (
                "disk full"
                if errors.disk_full(e, args.out)
                else "storage error"
                if errors.is_storage_error(e)
                else type(e).__name__
            )
            print(
                f"vapo-sweep: error: {what}: {mask_text(errors.first_line(e), args.storage)}; fix it, then rerun "
                "the same command to continue",
                file=sys.stderr,
            )
            return errors.RUNTIME
    return 0


if __name__ == "__main__":
    sys.exit(main())
