"""Command-line flags generated from the config dataclasses, YAML files, presets, --drop/--only.

Precedence: defaults < --preset < --config FILE (YAML deltas) < individual flags < --only, then --add and --drop.
Every value is validated (type and range) before anything is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import yaml

from vapo_lit.config import (
    AUTO_SIZED,
    COMPONENTS,
    OPTIONAL_COMPONENTS,
    RunConfig,
    check_components,
    from_dict,
    merge,
    nest,
    ordered,
    to_dict,
    validate,
    walk_fields,
)
from vapo_lit.presets import PRESETS, preset_task_options


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per config field (`--steps`, `--ppo.actor_lr`, `--vapo.alpha`, ...)."""
    group = parser.add_argument_group(
        "settings (docs/reference/configuration.md; any field of the YAML config)"
    )
    for name, kind, f in walk_fields():
        doc = f.metadata.get("doc", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        group.add_argument(
            f"--{name}",
            dest=f"set:{name}",
            metavar=kind.__name__.upper() if kind in (int, float) else "V",
            default=None,
            help=f"{doc} (default: {default})",
        )


def add_selection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file of settings (deltas from the preset)")
    parser.add_argument(
        "--preset", default="default", help=f"base settings: {', '.join(PRESETS)} (default: default)"
    )
    parser.add_argument(
        "--drop",
        default="",
        help=f"components to switch off, comma-separated; valid: {', '.join(COMPONENTS)}",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="switch on only these components (comma-separated; 'none' for vanilla PPO); "
        f"optional ones, off unless named: {', '.join(OPTIONAL_COMPONENTS)}",
    )
    parser.add_argument(
        "--add",
        default="",
        help="switch these components on in addition (e.g. an optional one: "
        f"{', '.join(OPTIONAL_COMPONENTS)})",
    )


def parse_components(text: str | None, flag: str) -> list[str] | None:
    """'a,b' -> ['a', 'b'] ('none' -> []), validated; None when the flag was not given."""
    if text is None:
        return None
    names = [s.strip() for s in text.replace("=", ",").split(",") if s.strip()]
    if names == ["none"]:
        return []
    return check_components(names, flag)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Build and validate the RunConfig the flags describe (raises ValueError with what is valid)."""
    if args.preset not in PRESETS:
        raise ValueError(f"--preset {args.preset!r} is not valid; choose one of: {', '.join(PRESETS)}")
    cfg = merge(RunConfig(), PRESETS[args.preset])
    delta = {}
    if args.config is not None:
        if not args.config.is_file():
            raise ValueError(f"--config {args.config}: file not found")
        try:
            delta = yaml.safe_load(args.config.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"--config {args.config}: not valid YAML ({e})") from None
        cfg = merge(cfg, delta)
    flat = {}
    kinds = {name: kind for name, kind, _ in walk_fields()}
    for key, value in vars(args).items():
        if key.startswith("set:") and value is not None:
            name = key[4:]
            flat[name] = parse_value(value, kinds[name], name)
    cfg = merge(cfg, nest(flat))
    if "task_options" not in flat and "task_options" not in delta:
        cfg = merge(cfg, {"task_options": preset_task_options(args.preset, cfg.task)})
    drop = parse_components(args.drop or None, "--drop") or []
    only = parse_components(args.only, "--only")
    if only is not None and drop:
        raise ValueError("use either --only or --drop, not both")
    components = list(cfg.components) if only is None else only
    add = parse_components(getattr(args, "add", "") or None, "--add") or []
    components = [c for c in ordered([*components, *add]) if c not in drop]
    cfg = merge(cfg, {"components": components})
    return validate(cfg)


def dump(cfg: RunConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def load_run_config(run_dir: Path) -> RunConfig:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"{run_dir} is not a run folder (no config.yaml)")
    try:
        return validate(from_dict(yaml.safe_load(path.read_text())))
    except (yaml.YAMLError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(
            f"{path} is not a readable run config ({type(e).__name__}: {str(e).splitlines()[0]})"
        ) from None


def parse_value(text: str, kind, name: str):
    """A command-line string as the setting's type; ValueError saying what was expected."""
    if text.lower() in ("none", "null"):
        return None
    if name in AUTO_SIZED and text.lower() == "auto":
        return "auto"
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind is list:
            return [s.strip() for s in text.split(",") if s.strip()]
        if kind is dict:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError
            return value
        return text
    except (ValueError, json.JSONDecodeError):
        what = {
            bool: "true/false",
            int: "an integer",
            float: "a number",
            list: "a comma-separated list",
            dict: "a JSON object",
        }.get(kind, "a string")
        raise ValueError(f"--{name}={text!r} is not valid; expected {what}") from None


def parse_flat(flat_text: dict) -> dict:
    """{'ppo.actor_lr': '1e-5'} -> a nested, typed delta (unknown paths raise)."""
    kinds = {path: kind for path, kind, _ in walk_fields()}
    out = {}
    for path, text in flat_text.items():
        if path not in kinds:
            raise ValueError(f"unknown setting {path!r}; e.g. steps, ppo.actor_lr, vapo.alpha")
        out[path] = parse_value(text, kinds[path], path)
    return nest(out)
