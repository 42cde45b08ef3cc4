"""Grids: rows (a component set plus optional config deltas) x seeds = cells.

A grid comes from `--drop a[,b]` (full recipe + that drop) or from `ablations/NAME.yaml`:

    name: table1
    description: full VAPO, each single drop, vanilla PPO
    rows:                       # explicit rows, in any order (reports sort them the paper's way)
      - {}                      # the full recipe (all seven components)
      - drop: [value_pretraining]
      - only: []                # vanilla PPO
      - label: grpo
        only: [token_level_loss, clip_higher, group_sampling]
        set: {advantage_estimator: grpo}
    generate: [full, single_drops, pair_drops, vanilla]   # optional: rows generated for you
    model_seed: follow          # optional: each seed builds its own base policy and reward model
                                # (model_seed = seed); default shared: every seed uses one model_seed
    endpoint: mean-last-3       # optional: the primary endpoint, fixed before the grid runs
                                # (vapo_lit/protocol.py; default mean-last-3, or final)
    tuning_seeds: [0, 1, 2]     # optional: seeds the grid's settings were chosen on (default none)
    cpu_capability: avx2        # optional: torch, MKL and oneDNN held to one instruction set
                                # (vapo_lit/cpu_pin.py: default, avx2, avx512); default: unpinned

A cell = (row config, seed). Its identity is a hash of the fully resolved config minus the
bookkeeping fields in `BOOKKEEPING` (where it is written, W&B naming, threads, caches) and the
settings of `config.NEUTRAL` at their neutral values: two grids that need the same run share it, and
its run folder `<label>-s<seed>-<hash>` derives from it.
"""

from __future__ import annotations

import importlib.resources
import itertools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vapo_lit.cache import config_key
from vapo_lit.config import (
    COMPONENTS,
    RunConfig,
    check_components,
    merge,
    ordered,
    to_dict,
    validate,
    without_neutral,
)
from vapo_lit.labels import check_contrasts, run_label
from vapo_lit import cpu_pin
from vapo_lit.protocol import parse_endpoint, parse_seeds

BOOKKEEPING = (
    "out_dir",
    "name",
    "wandb",
    "wandb_project",
    "wandb_group",
    "wandb_job_type",
    "threads",
    "cache_dir",
    "checkpoint_every",
    "checkpoint_keep",
    "samples_per_iteration",
    "print_sample_every",
)
"""Config fields that do not change what a run computes; left out of a cell's identity."""

GENERATORS = ("full", "single_drops", "pair_drops", "vanilla")
MODEL_SEEDS = ("shared", "follow")
"""What a grid's seeds vary: `shared` (default), every cell's model_seed is the base config's, so a
seed varies the RL run only (prompt stream, sampling, mini-batch order) around one base policy and
reward model; `follow`, a cell's model_seed is its seed, so a seed varies the whole pipeline (the
built base policy, the reward model and RL) and the intervals over seeds include all three."""


@dataclass
class Row:
    label: str
    components: list
    delta: dict = field(default_factory=dict)

    def config(self, base: RunConfig) -> RunConfig:
        return merge(base, {**self.delta, "components": ordered(self.components)})


@dataclass
class Cell:
    row: str
    seed: int
    cfg: RunConfig  # fully resolved; out_dir/name point at the cell's run folder
    cell_id: str

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out_dir) / self.cfg.name


@dataclass
class Grid:
    grid_id: str
    rows: list
    description: str = ""
    model_seed: str = "shared"
    """One of MODEL_SEEDS."""
    reference: str | None = None
    """The row the report's deltas are taken against (None: the full recipe's row, 'vapo')."""
    contrasts: list = field(default_factory=list)
    """Further (row, against) pairs the report compares (report/contrasts.py)."""
    endpoint: str | None = None
    """The primary endpoint as the grid file names it (None: not named; protocol.DEFAULT_ENDPOINT)."""
    tuning_seeds: list | None = None
    """Seeds the grid's settings were chosen on (None: not named; none)."""
    cpu_capability: str | None = None
    """The instruction set every process is held to (vapo_lit/cpu_pin.py; None: not named; unpinned)."""


def _row_from_spec(spec: dict, where: str) -> Row:
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a row must be a mapping (keys: label, drop, only, set); got {spec!r}")
    bad = set(spec) - {"label", "drop", "only", "set"}
    if bad:
        raise ValueError(f"{where}: unknown row key(s) {sorted(bad)}; valid: label, drop, only, set")
    if "drop" in spec and "only" in spec:
        raise ValueError(f"{where}: use either drop or only, not both")
    for key in ("drop", "only"):
        check_components(spec.get(key) or [], where)
    if "only" in spec:
        comps = ordered(spec["only"] or [])
    else:
        comps = [c for c in COMPONENTS if c not in (spec.get("drop") or [])]
    delta = dict(spec.get("set") or {})
    if "components" in delta:
        raise ValueError(f"{where}: set the components with drop/only, not set.components")
    return Row(
        spec.get("label")
        or run_label(
            comps,
            delta.get("advantage_estimator", "gae"),
            delta.get("observations", "skip"),
            delta.get("gae_values", "critic"),
        ),
        comps,
        delta,
    )


def _generated(kind: str) -> list[dict]:
    if kind == "full":
        return [{}]
    if kind == "single_drops":
        return [{"drop": [c]} for c in COMPONENTS]
    if kind == "pair_drops":
        return [{"drop": list(p)} for p in itertools.combinations(COMPONENTS, 2)]
    if kind == "vanilla":
        return [{"only": []}]
    raise ValueError(f"unknown generator {kind!r}; valid: {', '.join(GENERATORS)}")


def grid_from_drop(drop: list[str]) -> Grid:
    """`--drop a,b`: the full recipe and the recipe without a and b (a joint drop)."""
    dropped = [c for c in COMPONENTS if c in drop]
    return Grid(
        "drop-" + "+".join(dropped),
        [_row_from_spec({}, "--drop"), _row_from_spec({"drop": dropped}, "--drop")],
        f"full VAPO vs VAPO without {' + '.join(dropped)}",
    )


def definition_dirs(kind: str) -> list[Path]:
    """Where named definitions of `kind` ("ablations" or "sweeps") are looked up, first match wins.

    ./<kind> in the current directory (a user's own or edited copies) comes first, then the shipped
    ones: `vapo_lit/<kind>` inside an installed wheel (pyproject.toml maps the repository's top-level
    folder there), else the top-level <kind>/ of the checkout the package is imported from (an
    editable install, or PYTHONPATH on a clone). Folders that do not exist are left out.
    """
    package = Path(str(importlib.resources.files("vapo_lit")))
    shipped = package / kind if (package / kind).is_dir() else package.parent / kind
    found: list[Path] = []
    for d in (Path.cwd() / kind, shipped):
        if d.is_dir() and all(not d.samefile(f) for f in found):
            found.append(d)
    return found


def grid_dirs() -> list[Path]:
    """Where `--grid NAME` looks: ./ablations, then the shipped grids (see `definition_dirs`)."""
    return definition_dirs("ablations")


def available_grids() -> list[str]:
    return sorted({p.stem for d in grid_dirs() for p in d.glob("*.yaml")})


def grid_file(name_or_path: str) -> Path:
    """The grid file: `name_or_path` itself when it is a YAML file, else `<name>.yaml` in the grid folders."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        found = [d / f"{name_or_path}.yaml" for d in grid_dirs() if (d / f"{name_or_path}.yaml").is_file()]
        if not found:
            raise ValueError(
                f"--grid {name_or_path!r}: no such grid; valid grids: {', '.join(available_grids()) or '(none)'}"
            )
        path = found[0]
    return path


def _read_spec(path: Path) -> dict:
    """A grid file's mapping, its keys checked."""
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: expected a mapping with 'rows' and/or 'generate'")
    bad = set(spec) - {
        "name",
        "description",
        "rows",
        "generate",
        "model_seed",
        "reference",
        "contrasts",
        "endpoint",
        "tuning_seeds",
        "cpu_capability",
    }
    if bad:
        raise ValueError(
            f"{path}: unknown key(s) {sorted(bad)}; valid: name, description, rows, generate, model_seed, "
            "reference, contrasts, endpoint, tuning_seeds, cpu_capability"
        )
    return spec


def load_grid(name_or_path: str) -> Grid:
    """A grid by name (a file in ablations/) or by path; unknown names list the valid ones."""
    path = grid_file(name_or_path)
    spec = _read_spec(path)
    model_seed = spec.get("model_seed", "shared")
    if model_seed not in MODEL_SEEDS:
        raise ValueError(
            f"{path}: model_seed: {model_seed!r} is not valid; choose one of: {', '.join(MODEL_SEEDS)} "
            "(a fixed model_seed for every cell: --model_seed N)"
        )
    specs = [s for kind in spec.get("generate") or [] for s in _generated(kind)] + list(
        spec.get("rows") or []
    )
    rows = [_row_from_spec(s, f"{path} row {i}") for i, s in enumerate(specs)]
    if not rows:
        raise ValueError(f"{path}: the grid has no rows")
    labels = [r.label for r in rows]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate row label(s) {dup}")
    reference = spec.get("reference")
    if reference is not None and reference not in labels:
        raise ValueError(f"{path}: reference: {reference!r} is not a row; rows: {', '.join(labels)}")
    pairs = spec.get("contrasts") or []
    if not isinstance(pairs, list):
        raise ValueError(f"{path}: contrasts: expected a list of [row, against] pairs; got {pairs!r}")
    contrasts = check_contrasts(pairs, labels, f"{path} contrasts")
    endpoint = spec.get("endpoint")
    if endpoint is not None:
        endpoint = parse_endpoint(endpoint, f"{path} endpoint").name
    tuning = parse_seeds(spec["tuning_seeds"], f"{path} tuning_seeds") if "tuning_seeds" in spec else None
    pin = spec.get("cpu_capability")
    if pin is not None:
        pin = cpu_pin.parse(pin, f"{path} cpu_capability:")
    return Grid(
        spec.get("name") or path.stem,
        rows,
        spec.get("description", ""),
        model_seed,
        reference,
        contrasts,
        endpoint,
        tuning,
        pin,
    )


def cell_identity(cfg: RunConfig) -> str:
    d = to_dict(cfg)
    for key in BOOKKEEPING:
        d.pop(key, None)
    return config_key(without_neutral(d))


def cells_of(grid: Grid, base: RunConfig, seeds: list[int], runs_dir: Path) -> list[Cell]:
    """Every (row, seed) cell, validated, with its identity and run folder (nothing is written).
    With grid.model_seed == "follow" a cell's model_seed is its seed (MODEL_SEEDS)."""
    if grid.model_seed not in MODEL_SEEDS:
        raise ValueError(
            f"grid {grid.grid_id!r}: model_seed={grid.model_seed!r} is not valid; choose one of: "
            f"{', '.join(MODEL_SEEDS)}"
        )
    cells = []
    for row in grid.rows:
        if grid.model_seed == "follow" and "model_seed" in row.delta:
            raise ValueError(
                f"row {row.label!r}: set.model_seed contradicts the grid's model_seed: follow "
                "(each seed builds its own models); drop one of them"
            )
        for seed in seeds:
            per_seed = {"model_seed": seed} if grid.model_seed == "follow" else {}
            cfg = merge(
                row.config(base),
                {"seed": seed, **per_seed, "wandb_group": grid.grid_id, "wandb_job_type": row.label},
            )
            try:
                validate(cfg)
            except ValueError as e:
                raise ValueError(f"row {row.label!r} seed {seed}: {e}") from None
            cid = cell_identity(cfg)
            cfg = merge(cfg, {"out_dir": str(runs_dir), "name": f"{row.label}-s{seed}-{cid[:10]}"})
            cells.append(Cell(row.label, seed, cfg, cid))
    return cells
