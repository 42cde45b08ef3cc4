"""vapo-warmup: a short supervised warm-up of a chat model on a task's demonstrations, before RL.

    vapo-warmup --config tools/smollm2_tools.config.yaml --model runs/models/smollm2-135m-instruct \
        --out runs/models/smollm2-warm --warmup.steps 32

The task, its options and the response budget come from the same settings a run takes (--config,
--preset, --task, --task_options, --ppo.max_new_tokens), so the demonstrations are rendered as that
run's rollouts are. The result is a model folder (`save_pretrained`) with WARMUP.json; train on it
with `--model OUT`. Exit codes: 0 done, 1 runtime failure, 2 bad input (nothing was written).
"""

from __future__ import annotations

import argparse
import sys

from vapo_lit.cli import errors
from vapo_lit.cli.args import add_config_flags, add_selection_flags, config_from_args


def build_parser() -> argparse.ArgumentParser:
    from vapo_lit.warmup import WarmupSettings

    ap = argparse.ArgumentParser(
        prog="vapo-warmup",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="the warmed-up model's folder (must not exist)")
    defaults = WarmupSettings()
    for name, kind, text in (
        ("demonstrations", int, "distinct train problems demonstrated (never an eval problem)"),
        ("steps", int, "optimizer steps, batches drawn from the demonstrations in seeded epochs"),
        ("batch_size", int, "demonstrations per step"),
        ("lr", float, "AdamW learning rate (constant)"),
        ("grad_clip", float, "gradient-norm clip"),
        ("seed", int, "which problems, their order and the torch seed"),
    ):
        ap.add_argument(
            f"--warmup.{name}", dest=f"warmup_{name}", type=kind, default=getattr(defaults, name), help=text
        )
    add_selection_flags(ap)
    add_config_flags(ap)
    return ap


def main(argv=None) -> int:
    from vapo_lit.warmup import WarmupSettings, check_out, warm_up

    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        if cfg.model in ("builtin", "random"):
            raise ValueError(
                "--model: a warm-up fine-tunes a local chat model folder (builtin and random are not)"
            )
        settings = WarmupSettings(
            **{k[len("warmup_") :]: v for k, v in vars(args).items() if k.startswith("warmup_")}
        ).check()
        check_out(args.out)
    except ValueError as e:
        print(f"vapo-warmup: error: {e}", file=sys.stderr)
        return errors.BAD_INPUT
    from vapo_lit.progress_line import quiet_libraries

    quiet_libraries()  # no Lightning banners and tips between the warm-up's own lines
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    try:
        record = warm_up(cfg, settings, args.out)
    except ValueError as e:
        print(f"vapo-warmup: error: {e}", file=sys.stderr)
        return errors.BAD_INPUT
    loss = record["loss"]
    print(f"vapo-warmup: {args.out}: loss {loss[0]:.3f} -> {loss[-1]:.3f} over {len(loss)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
