"""vapo-ablate: the full VAPO recipe against recipes with components removed, over seeds, then a table.

    vapo-ablate --drop=value_pretraining                  # full recipe vs without value pretraining
    vapo-ablate --drop decoupled_gae,length_adaptive_gae  # a joint drop
    vapo-ablate --grid table1 --seeds 3 --workers 2       # ablations/table1.yaml, two local processes
    vapo-ablate --grid table1 --storage postgresql://user@db/vapo --out /shared/abl   # on each machine
    vapo-ablate --drop clip_higher --preset smoke --steps 5  # any config flag goes to every cell
    vapo-ablate --grid table1 --seeds auto --max-seeds 10 --rows vanilla_ppo  # seeds until resolved
    vapo-ablate --grid table1 --seeds 5 --model_seed follow   # each seed builds its own base models

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
import time
from pathlib import Path

from vapo_lit.cli import errors
from vapo_lit.cli.args import add_config_flags, add_selection_flags, config_from_args, parse_components


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vapo-ablate",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_flags(ap)
    ap.add_argument("--grid", help="a grid in ablations/ (table1, pairwise, critic_free) or a YAML path")
    _add_seed_flags(ap)
    _add_run_flags(ap)
    add_config_flags(ap)
    _explain_model_seed(ap)
    return ap


def _add_seed_flags(ap: argparse.ArgumentParser) -> None:
    """The seeds of a grid: how many, --seeds auto's rule, the endpoint and the tuning seeds."""
    ap.add_argument(
        "--seeds",
        type=_seeds,
        default=3,
        help="seeds per row: --seed, --seed+1, ... (default 3: the fewest that give a paired 95%% CI "
        "worth reading); 'auto': add seeds until the rows of "
        "interest are resolved against the full recipe (see --max-seeds)",
    )
    ap.add_argument(
        "--max-seeds", type=int, default=10, help="--seeds auto: at most this many seeds per row (default 10)"
    )
    ap.add_argument(
        "--min-seeds", type=int, default=3, help="--seeds auto: seeds of the first round (default 3)"
    )
    ap.add_argument(
        "--rows",
        help="--seeds auto: the rows of interest, comma-separated labels (default: every row "
        "but the full recipe)",
    )
    ap.add_argument(
        "--auto-metric",
        choices=("final", "peak", "auc"),
        default="final",
        help="--seeds auto: the score whose paired delta must be resolved (default final: the grid's "
        "endpoint, see --endpoint)",
    )
    ap.add_argument(
        "--endpoint",
        help="the primary endpoint, fixed before the grid runs and recorded in its manifest: "
        "final (the last eval) or mean-last-K (the mean of the last K evals); default: "
        "the grid file's, else mean-last-3",
    )
    ap.add_argument(
        "--tuning-seeds",
        metavar="SEEDS",
        help="seeds the grid's settings were chosen on, e.g. 0-2 or 0,1,2 (recorded in the manifest; the "
        "report warns where a row's deltas rest on them); default: the grid file's, else none",
    )
    ap.add_argument(
        "--cpu-capability",
        metavar="ISA",
        help="hold torch, MKL and oneDNN to one instruction set in every process of the grid (default, "
        "avx2 or avx512), so its cells compute alike on any CPU that has it; recorded in the manifest "
        "and kept for the grid's life; default: the grid file's, else unpinned",
    )


def _add_run_flags(ap: argparse.ArgumentParser) -> None:
    """Where and how a grid runs: workers, devices, storage, output, retries and the report."""
    ap.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    ap.add_argument(
        "--devices-per-cell",
        type=int,
        metavar="K",
        help="run every cell on K devices (data parallel, --strategy ddp or fsdp); on GPUs local worker i "
        "gets GPUs i*K..(i+1)*K-1 of the visible ones (needs --workers x K GPUs)",
    )
    ap.add_argument(
        "--storage", help="Optuna RDB URL shared by all workers (default: sqlite:///OUT/ablate.db)"
    )
    ap.add_argument(
        "--storage-password-file",
        type=Path,
        metavar="FILE",
        help="database password on the first line of FILE (or set VAPO_LIT_STORAGE_PASSWORD)",
    )
    ap.add_argument(
        "--study", default="vapo-ablate", help="study name inside the storage (default vapo-ablate)"
    )
    ap.add_argument(
        "--out", type=Path, default=Path("runs/ablate"), help="output folder (default runs/ablate)"
    )
    ap.add_argument("--retries", type=int, default=2, help="retries of a crashed or dead cell (default 2)")
    ap.add_argument("--heartbeat", type=int, default=10, help="heartbeat interval, seconds (default 10)")
    ap.add_argument(
        "--grace", type=int, default=60, help="a cell without heartbeat for this long is retried (default 60)"
    )
    ap.add_argument(
        "--last-n", type=int, default=10, help="report: average the last N PPO iterations (default 10)"
    )
    ap.add_argument("--no-report", action="store_true", help="do not write the report at the end")


def _explain_model_seed(ap: argparse.ArgumentParser) -> None:
    """vapo-ablate's --model_seed also takes 'follow' (a grid setting, not a config value)."""
    for action in ap._actions:
        if action.dest == "set:model_seed":
            action.help = (
                "seed of the built-in base policy and reward model: an integer shared by every cell "
                "(default: the config's, 0), or 'follow': each cell's model_seed is its seed, so the "
                "seeds vary the whole pipeline (base policy, reward model and RL) and so do the "
                "report's intervals; a grid file may say `model_seed: follow`"
            )


def _seeds(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seeds or 'auto'") from None


def make_plans(args):
    """Validate the command line; returns n_seeds -> Plan (ValueError on anything wrong; nothing is written)."""
    from vapo_lit.ablate.grid import grid_from_drop, load_grid
    from vapo_lit.ablate.runner import plan
    from vapo_lit import cpu_pin
    from vapo_lit.protocol import parse_endpoint, parse_seeds

    if args.only is not None:
        raise ValueError("--only is not a vapo-ablate flag; use --drop or --grid")
    for flag, instead in (
        ("out_dir", "--out"),
        ("name", "--out"),
        ("components", "--drop or --grid"),
        ("wandb_group", "the grid's name"),
        ("wandb_job_type", "the row labels"),
    ):
        if getattr(args, f"set:{flag}") is not None:
            raise ValueError(f"--{flag} is set by vapo-ablate per cell; use {instead}")
    drop = parse_components(args.drop or None, "--drop")
    if (drop is None) == (args.grid is None):
        raise ValueError("give exactly one of --drop COMPONENT[,COMPONENT] or --grid NAME")
    if drop == []:
        raise ValueError("--drop needs at least one component")
    grid = grid_from_drop(drop) if drop else load_grid(args.grid)
    grid.model_seed = model_seed_mode(args, grid)
    if args.endpoint is not None:
        grid.endpoint = parse_endpoint(args.endpoint, "--endpoint").name
    if args.tuning_seeds is not None:
        grid.tuning_seeds = parse_seeds(args.tuning_seeds, "--tuning-seeds")
    if args.cpu_capability is not None:
        grid.cpu_capability = cpu_pin.parse(args.cpu_capability, "--cpu-capability")
    args.drop = ""
    base = config_from_args(args)

    def plan_for(n_seeds: int):
        return plan(
            grid,
            base,
            range(base.seed, base.seed + n_seeds),
            args.out,
            args.storage,
            workers=args.workers,
            retries=args.retries,
            heartbeat_interval=args.heartbeat,
            grace_period=args.grace,
            study=args.study,
            devices_per_cell=args.devices_per_cell,
        )

    return plan_for


def model_seed_mode(args, grid) -> str:
    """'follow' or 'shared' from --model_seed and the grid file; --model_seed follow is taken off the
    config flags (the config field is an integer). A fixed --model_seed N with a follow grid is refused."""
    given = getattr(args, "set:model_seed")
    if given is not None and given.strip().lower() == "follow":
        setattr(args, "set:model_seed", None)
        return "follow"
    if given is not None and grid.model_seed == "follow":
        raise ValueError(
            f"--model_seed {given}: grid {grid.grid_id!r} sets model_seed: follow (each seed builds its "
            "own base policy and reward model); drop --model_seed, or use a grid without it"
        )
    return grid.model_seed


def check_auto(args, plan_for) -> list[str]:
    """--seeds auto's flags, checked before any compute; returns the rows of interest."""
    from vapo_lit.ablate.auto import rows_of_interest

    if args.seeds != "auto":
        if args.rows is not None:
            raise ValueError("--rows is a --seeds auto flag")
        return []
    if not 2 <= args.min_seeds <= args.max_seeds:
        raise ValueError(
            f"--seeds auto needs 2 <= --min-seeds ({args.min_seeds}) <= --max-seeds ({args.max_seeds})"
        )
    rows = [r.strip() for r in (args.rows or "").split(",") if r.strip()]
    return rows_of_interest(plan_for(args.max_seeds), rows)  # every cell up to the cap validated


def reporter(args):
    """The report written after the grid (the runner calls it; it does not import the report)."""
    if args.no_report:
        return None

    def report(p) -> str:
        from vapo_lit.report import LogError, write_report
        from vapo_lit.report.grid_run import log_grid_runs

        since = time.time()
        try:
            kw = {"max_seeds": args.max_seeds} if args.seeds == "auto" else {}
            text = write_report(p.out, grid_id=p.grid.grid_id, last_n=args.last_n, **kw)
        except (
            LogError
        ) as e:  # no log at all (every cell failed) or a malformed one: say so, keep the exit code
            return f"[{p.grid.grid_id}] no report: {e}"
        settings = {"last_n": args.last_n, **kw}
        lines = log_grid_runs(
            p.out,
            p.grid.grid_id,
            since=since,
            mode=p.cells[0].cfg.wandb if p.cells else "auto",
            settings=settings,
        )
        return "\n".join([text, *(f"[{p.grid.grid_id}] {line}" for line in lines)])

    return report


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from vapo_lit.ablate.urls import with_password
    from vapo_lit.masking import mask_text, scrub_argv

    scrub_argv()  # no database password in sys.argv from here on (W&B records it)
    try:
        args.storage = with_password(args.storage, args.storage_password_file)
        plan_for = make_plans(args)
        rows = check_auto(args, plan_for)
        p = plan_for(args.min_seeds if args.seeds == "auto" else args.seeds)
        hold_to_pin(p.cpu_capability, reexec=argv is None)
    except ValueError as e:
        print(f"vapo-ablate: error: {mask_text(e, args.storage)}", file=sys.stderr)
        return errors.BAD_INPUT
    from vapo_lit.ablate.runner import run

    # SIGTERM like Ctrl-C: running cells are handed back, not left to time out
    with errors.catch_signals():
        try:
            if args.seeds == "auto":
                from vapo_lit.ablate.auto import run_auto

                return run_auto(
                    plan_for,
                    rows=rows,
                    min_seeds=args.min_seeds,
                    max_seeds=args.max_seeds,
                    metric=args.auto_metric,
                    workers=args.workers,
                    report=reporter(args),
                )
            return run(p, workers=args.workers, report=reporter(args))
        except ValueError as e:
            print(f"vapo-ablate: error: {mask_text(e, args.storage)}", file=sys.stderr)
            return errors.BAD_INPUT
        except (KeyboardInterrupt, SystemExit):
            print(
                "vapo-ablate: interrupted; rerun the same command to continue (finished cells are kept, running "
                "ones resume from their last checkpoint)",
                file=sys.stderr,
            )
            return errors.INTERRUPTED
        except Exception as e:  # noqa: BLE001 - one line and a stable code, never a traceback
            print(f"vapo-ablate: error: {mask_text(failure(e, p.out, p.url), p.url)}", file=sys.stderr)
            return errors.RUNTIME


def hold_to_pin(pin: str | None, *, reexec: bool) -> None:
    """A pinned grid runs in a process that loaded torch under the pin: the command restarts itself
    (same arguments, pin added to the environment) when the environment lacks it; ValueError when
    this CPU cannot honour it, or when the caller (`main(argv)` in-process) cannot be restarted."""
    import os

    from vapo_lit import cpu_pin

    if pin is None:
        return
    if not cpu_pin.in_effect(pin) and reexec:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **cpu_pin.env_for(pin)})
    cpu_pin.check(pin)


def failure(e: Exception, out: Path, url: str) -> str:
    """The one line for a fault that stopped the grid (the cells' own crashes are retried instead)."""
    from vapo_lit.masking import mask_text
    from vapo_lit.ablate.worker import WorkerStopped

    if isinstance(e, WorkerStopped):
        return str(e)
    if errors.disk_full(e, out):
        return (
            f"disk full ({errors.first_line(e)}; {errors.free_text(out)} under {out}); free some space, then "
            "rerun the same command to continue"
        )
    if errors.is_storage_error(e):
        return (
            f"storage error ({type(e).__name__}: {errors.first_line(e)}); check the database server, then rerun "
            "the same command to continue"
        )
    where = errors.save_traceback(out, e, mask=lambda text: mask_text(text, url))
    return f"{type(e).__name__}: {errors.first_line(e)}{where}; rerun the same command to continue"


if __name__ == "__main__":
    sys.exit(main())
