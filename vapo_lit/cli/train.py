"""vapo-train: one training run (full VAPO recipe by default) on a task and model.

    vapo-train                                   # built-in task, default preset, all seven components
    vapo-train --drop value_pretraining --seed 1
    vapo-train --only none                       # vanilla PPO
    vapo-train --config my.yaml --ppo.actor_lr 1e-5 --print-config
    vapo-train --resume runs/vapo-s0             # continue a killed run from its last checkpoint
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vapo_lit.cli.args import add_config_flags, add_selection_flags, config_from_args, dump, load_run_config


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vapo-train", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection_flags(ap)
    ap.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    ap.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue the run in RUN_DIR from checkpoints/last.ckpt")
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
    from vapo_lit.train import train

    try:
        summary = train(cfg, resume=args.resume is not None)
    except (FileExistsError, FileNotFoundError) as e:
        print(f"vapo-train: error: {e}", file=sys.stderr)
        return 2
    last = summary["last_metrics"]
    keys = [k for k in last if k.startswith("eval/avg@") and k.count("/") == 1]
    print(json.dumps({"run_dir": summary["run_dir"], "ppo_updates": summary["ppo_updates"],
                      "best_eval": summary["best_eval"], "final_eval": {k: last[k] for k in keys},
                      "wall_seconds": round(summary["wall_seconds"], 1)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
