"""vapo-train: one training run (full VAPO recipe by default) on a task and model.

    vapo-train                                   # built-in task, default preset, all seven components
    vapo-train --drop value_pretraining --seed 1
    vapo-train --only none                       # vanilla PPO
    vapo-train --config my.yaml --ppo.actor_lr 1e-5 --print-config
    vapo-train --resume runs/vapo-s0             # continue a killed run from its last checkpoint

Exit codes: 0 done, 1 runtime failure (disk full, a crash; the run folder keeps what was done),
2 bad input (nothing was started), 130 interrupted (the message gives the --resume command).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from vapo_lit import status
from vapo_lit.cli import errors
from vapo_lit.cli.args import add_config_flags, add_selection_flags, config_from_args, dump, load_run_config


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vapo-train",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_flags(ap)
    ap.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    ap.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from checkpoints/last.ckpt",
    )
    add_config_flags(ap)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.resume is not None:
            cfg = load_run_config(args.resume)
            cfg.out_dir, cfg.name = str(args.resume.parent), args.resume.name
        else:
            cfg = config_from_args(args)
    except ValueError as e:
        print(f"vapo-train: error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump(cfg), end="")
        return 0
    with status.announcing():  # before the imports below, which take seconds
        status.say(
            f"vapo-train: {'resuming' if args.resume is not None else 'starting'} ({what_runs(cfg)}); "
            "loading torch and Lightning"
        )
    from vapo_lit import progress_line
    from vapo_lit.checkpoints import check_checkpoint
    from vapo_lit.train import run_dir_of, train

    run_dir = run_dir_of(cfg)
    try:
        if args.resume is not None and (run_dir / "checkpoints" / "last.ckpt").is_file():
            check_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    except ValueError as e:
        print(f"vapo-train: error: {e}", file=sys.stderr)
        return errors.BAD_INPUT
    progress_line.quiet_libraries()
    with errors.catch_signals() as sig, progress_line.enabled():
        try:
            summary = train(cfg, resume=args.resume is not None)
        except BaseException as e:  # noqa: BLE001 - every way out gets one line and a stable code
            code, text = failure(e, sig, run_dir)
            print(f"vapo-train: {text}", file=sys.stderr)
            return end_process(code, together=False)
    last = summary["last_metrics"]
    keys = [k for k in last if k.startswith("eval/avg@") and k.count("/") == 1]
    print(
        json.dumps(
            {
                "run_dir": summary["run_dir"],
                "ppo_updates": summary["ppo_updates"],
                "best_eval": summary["best_eval"],
                "final_eval": {k: last[k] for k in keys},
                "wall_seconds": round(summary["wall_seconds"], 1),
                **({"wandb": w} if (w := wandb_line(Path(summary["run_dir"]))) else {}),
            },
            indent=1,
        )
    )
    return end_process(0, together=True)


def what_runs(cfg) -> str:
    """'task chain, policy builtin, critic auto, engine hf, 100 PPO updates': the first status line's summary."""
    critic = "none (grpo)" if cfg.advantage_estimator == "grpo" else cfg.critic_init
    return (
        f"task {cfg.task}, policy {cfg.model}, critic {critic}, engine {cfg.rollout_engine}, "
        f"{cfg.steps} PPO update{'s' if cfg.steps != 1 else ''}"
    )


def end_process(code: int, *, together: bool) -> int:
    """`code`; in a process of a multi-process run the process ends here instead, with `code`, after
    the process group's teardown (`together`: after a barrier, when every rank finished) and without
    the interpreter's, during which gloo's threads can abort a finished process ("terminate called
    without an active exception", exit -6)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return code
    try:
        if together:
            dist.barrier()
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def wandb_line(run_dir: Path) -> str | None:
    """Where the run's W&B record is (W&B's own lines are silenced): the `wandb sync` command for an
    offline run, project/id for an online one; None without one."""
    card = run_dir / "run_card.json"
    wb = (json.loads(card.read_text()).get("wandb") or {}) if card.is_file() else {}
    if not wb.get("id"):
        return None
    if wb.get("mode") == "offline":
        found = sorted((run_dir / "wandb").glob(f"offline-run-*-{wb['id']}"))
        return f"offline run; upload with: wandb sync {shlex.quote(str(found[-1]))}" if found else None
    return f"{wb.get('project')}/{wb['id']} (group {wb.get('group')})"


def failure(e: BaseException, sig: errors.Signals, run_dir: Path) -> tuple[int, str]:
    """(exit code, message) for whatever ended train()."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    resume = f"vapo-train --resume {shlex.quote(str(run_dir))}"
    then = (
        f"continue with: {resume}"
        if ckpt.is_file()
        else f"no checkpoint was written yet, so nothing to resume: remove {run_dir} and run the same command again"
    )
    if isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and sig.hit):
        return errors.INTERRUPTED, f"interrupted ({sig.hit or 'SIGINT'}); {then}"
    if isinstance(e, SystemExit):
        raise e
    if isinstance(e, (ValueError, FileExistsError, FileNotFoundError)):
        return errors.BAD_INPUT, f"error: {errors.first_line(e)}"
    if errors.disk_full(e, run_dir):
        return errors.RUNTIME, (
            f"error: disk full ({errors.first_line(e)}; {errors.free_text(run_dir)} under "
            f"{run_dir.parent}); free some space, then {then}"
        )
    if isinstance(e, (PermissionError, NotADirectoryError, IsADirectoryError)):
        return errors.BAD_INPUT, (
            f"error: cannot write the run folder {run_dir} ({errors.first_line(e)}); "
            "choose an --out_dir you may write in"
        )
    where = errors.save_traceback(run_dir if run_dir.is_dir() else None, e)
    return errors.RUNTIME, f"error: {type(e).__name__}: {errors.first_line(e)}{where}; {then} once fixed"


if __name__ == "__main__":
    sys.exit(main())
