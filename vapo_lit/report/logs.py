"""Read what runs and the ablation runner wrote, strictly: metrics.csv, config.yaml, run_card.json,
attempts.jsonl and the grid manifest OUT/grids/<grid>.json. No network, no project code but config.

Anything malformed raises `LogError` with the file and line ("runs/x/metrics.csv line 7: ..."),
never a pandas traceback. One exception: a metrics.csv whose last line was cut (a run killed or a
disk filled while it wrote) is read without that line and the run is marked truncated, so the
report still shows it, flagged.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from vapo_lit.labels import run_label
from vapo_lit.protocol import RECORDED_BEFORE, parse_endpoint, parse_seeds

ATTEMPT_OUTCOMES = ("done", "failed", "interrupted", "lost")


class LogError(ValueError):
    """A log that cannot be read: the message names the file and the line."""


@dataclass
class RunLog:
    run_dir: Path
    row: str
    seed: int
    k: int
    steps: int
    components: list
    estimator: str
    metrics: pd.DataFrame
    card: dict = field(default_factory=dict)
    cut_last_line: bool = False
    attempts: dict = field(default_factory=dict)  # outcome -> count (attempts.jsonl "end" events)
    """read_attempts(): outcome -> count, 'attempts', and 'cpu_capabilities' and 'cpus' where recorded."""
    model: str = "builtin"
    """The config's policy: builtin, random (tests) or a model folder."""
    model_seed: int = 0
    """The config's seed of the built base policy and reward model (or of the critic's fresh value head)."""
    eval_problems: int | None = None
    """The config's eval_problems (None: every eval problem of the task)."""

    @property
    def cpu_capabilities(self) -> set:
        """The torch CPU capabilities (AVX2, AVX512, ...) this run computed on, as far as its attempts
        and its run card record them (empty: not recorded, or not a CPU run)."""
        hardware = self.card.get("hardware") or {}
        if hardware.get("accelerator") not in (None, "cpu"):
            return set()
        found = set(self.attempts.get("cpu_capabilities") or ())
        card = (self.card.get("software") or {}).get("torch_cpu_capability")
        return found | ({card} if card else set())

    @property
    def cpu_models(self) -> set:
        """The CPU models this run computed on, as far as its attempts and its run card record them."""
        found = set(self.attempts.get("cpus") or ())
        card = (self.card.get("hardware") or {}).get("cpu")
        return found | ({card} if card else set())

    @property
    def cpu_pin(self) -> str | None:
        """The instruction set the run was held to (vapo_lit/cpu_pin.py: torch, MKL and oneDNN, as
        its run card records it), None when it ran unpinned or its card does not say."""
        return (self.card.get("software") or {}).get("cpu_pin")

    @property
    def policy_sha256(self) -> str | None:
        """The SHA-256 of the built-in policy weights the run started from (run card), if recorded."""
        return ((self.card.get("base_models") or {}).get("policy") or {}).get("weights_sha256")

    @property
    def score_key(self) -> str:
        return f"eval/avg@{self.k}"

    @property
    def ppo_updates(self) -> int:
        col = self.metrics.get("train/ppo_update")
        return int(col.max()) if col is not None and col.notna().any() else 0

    @property
    def truncated(self) -> str:
        """Why this run is not a complete one ('' when it is)."""
        why = []
        if self.ppo_updates < self.steps:
            why.append(f"{self.ppo_updates} of {self.steps} PPO updates")
        if self.cut_last_line:
            why.append("last line of metrics.csv cut (left out)")
        return "; ".join(why)


def _float(text: str, path: Path, line: int, column: str) -> float:
    if text == "":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise LogError(f"{path} line {line}: column {column!r} holds {text[:40]!r}, not a number") from None


def read_metrics(path: Path) -> tuple[pd.DataFrame, bool]:
    """metrics.csv as a float frame, and whether its last line was cut (then left out).

    Refused (LogError): an empty file, a header without `step`, no data rows, a short or long row
    other than the last, a value that is not a number."""
    path = Path(path)
    raw = path.read_bytes()
    if not raw.strip():
        raise LogError(f"{path} line 1: empty file (no header, no rows)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise LogError(f"{path} line {line}: not UTF-8 text") from None
    lines = text.splitlines()
    header = next(csv.reader([lines[0]]))
    if "step" not in header:
        raise LogError(f"{path} line 1: header has no 'step' column (is this a vapo-lit metrics.csv?)")
    cut = not text.endswith("\n")
    records = []
    for i, fields in enumerate(csv.reader(lines[1:]), start=2):
        last = i == len(lines)
        if not fields and not last:
            raise LogError(f"{path} line {i}: empty line inside the log")
        if len(fields) != len(header):
            if last:
                cut = True
                break
            raise LogError(f"{path} line {i}: {len(fields)} fields, the header has {len(header)}")
        if last and cut:
            break  # a complete-looking last line without its newline may still be cut inside a number
        records.append([_float(v, path, i, c) for v, c in zip(fields, header)])
    if not records:
        raise LogError(f"{path} line 2: no complete data row (header only)")
    return pd.DataFrame(records, columns=header), cut


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise LogError(
            f"{path} line {line}: not valid YAML ({getattr(e, 'problem', None) or 'parse error'})"
        ) from None
    if not isinstance(data, dict):
        raise LogError(f"{path} line 1: expected a mapping of config fields")
    return data


def read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise LogError(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise LogError(f"{path} line 1: expected a JSON object")
    return data


def read_attempts(path: Path) -> dict:
    """attempts.jsonl -> {outcome: count} over its 'end' events (and 'attempts': start events; and
    'cpu_capabilities' and 'cpus': the torch CPU capabilities and the CPU models its start events name,
    where they do).
    A start that the next record starts over, with no end between, is an attempt whose worker died
    before anyone recorded its end: it counts as 'lost'. A start that is the last record is the
    attempt in progress (or one nobody has declared lost yet) and has no outcome.
    A 'reused' start and end (a grid that found the run finished) are no attempt and are skipped.
    A cut last line is ignored (the worker may have died writing it); any other bad line is refused."""
    counts = {"attempts": 0, **{o: 0 for o in ATTEMPT_OUTCOMES}}
    open_start = False
    if not Path(path).is_file():
        return counts
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise LogError(f"{path} line {i}: not valid JSON ({e.msg})") from None
        if rec.get("mode") == "reused":  # a grid found the run finished: nothing was computed
            continue
        if rec.get("event") == "start":
            counts["lost"] += open_start
            open_start = True
            counts["attempts"] += 1
            if rec.get("cpu_capability"):
                counts.setdefault("cpu_capabilities", set()).add(rec["cpu_capability"])
            if rec.get("cpu"):
                counts.setdefault("cpus", set()).add(rec["cpu"])
        elif rec.get("event") == "end":
            open_start = False
            if rec.get("outcome") in ATTEMPT_OUTCOMES:
                counts[rec["outcome"]] += 1
    return counts


def attempt_counts(a: dict) -> dict:
    """attempts.jsonl counts -> attempts, crashes (failed or lost), interrupted (Ctrl-C / SIGTERM)."""
    return {
        "attempts": a.get("attempts", 0),
        "crashes": a.get("failed", 0) + a.get("lost", 0),
        "interrupted": a.get("interrupted", 0),
    }


def label_of(cfg: dict) -> str:
    """A row label from a run's config when no grid manifest names it: `labels.run_label`."""
    return run_label(
        cfg.get("components") or [],
        cfg.get("advantage_estimator", "gae"),
        cfg.get("observations", "skip"),
        cfg.get("gae_values", "critic"),
    )


def load_run(run_dir: Path, row: str | None = None) -> RunLog:
    """One run folder. The row label is the manifest's when given, else run_label() of its config."""
    run_dir = Path(run_dir)
    cfg = read_yaml(run_dir / "config.yaml")
    card = read_json(run_dir / "run_card.json") if (run_dir / "run_card.json").is_file() else {}
    df, cut = read_metrics(run_dir / "metrics.csv")
    components = list(cfg.get("components") or [])
    estimator = cfg.get("advantage_estimator", "gae")
    return RunLog(
        run_dir,
        row or label_of(cfg),
        int(cfg.get("seed", 0)),
        int(cfg.get("eval_k", 8)),
        int(cfg.get("steps", 0)),
        components,
        estimator,
        df,
        card,
        cut,
        read_attempts(run_dir / "attempts.jsonl"),
        str(cfg.get("model", "builtin")),
        int(cfg.get("model_seed", 0)),
        cfg.get("eval_problems"),
    )


@dataclass
class Found:
    """What a report covers: (row, run folder) pairs with logs, rows in order (manifest's or None),
    per row the manifest's cells without logs (missing or failed) with their attempt counts, the
    row the grid declares as the deltas' reference (None: not declared) and its further contrasts
    ([row, against] pairs)."""

    runs: list
    rows: list | None = None
    missing: dict = field(default_factory=dict)  # row -> [(seed, attempts dict)]
    reference: str | None = None
    contrasts: list = field(default_factory=list)
    endpoint: str = RECORDED_BEFORE
    """The manifest's primary endpoint (vapo_lit/protocol.py; a manifest without one, or no manifest:
    the last eval)."""
    tuning_seeds: list | None = None
    """The manifest's tuning seeds (None: it records none, made before the protocol existed)."""


def find_runs(out: Path, grid_id: str | None = None) -> Found:
    """The grid manifest's cells (rows in its order), or, without a manifest, every folder under
    `out` (two levels) holding metrics.csv and config.yaml (rows labelled and ordered from configs)."""
    out = Path(out)
    manifest = out / "grids" / f"{grid_id}.json" if grid_id else None
    if manifest is not None and manifest.is_file():
        data = read_json(manifest)
        try:
            cells = [(c["row"], int(c["seed"]), out / c["run_dir"]) for c in data["cells"]]
            rows = list(data.get("rows") or dict.fromkeys(c[0] for c in cells))
        except (KeyError, TypeError, ValueError) as e:
            raise LogError(f"{manifest} line 1: a cell lacks row, seed or run_dir ({e})") from None
        contrasts = data.get("contrasts", [])
        reference = data.get("reference")
        if not (
            isinstance(contrasts, list)
            and all(
                isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) and x for x in c)
                for c in contrasts
            )
        ):
            raise LogError(
                f"{manifest} line 1: 'contrasts' must be a list of [row, against] label pairs, "
                f"got {contrasts!r}"
            )
        if reference is not None and not (isinstance(reference, str) and reference):
            raise LogError(f"{manifest} line 1: 'reference' must be a row label, got {reference!r}")
        try:
            endpoint = parse_endpoint(data.get("endpoint", RECORDED_BEFORE), "'endpoint'").name
            tuning = parse_seeds(data["tuning_seeds"], "'tuning_seeds'") if "tuning_seeds" in data else None
        except ValueError as e:
            raise LogError(f"{manifest} line 1: {e}") from None
        found = Found(
            [],
            rows,
            reference=reference,
            contrasts=[tuple(c) for c in contrasts],
            endpoint=endpoint,
            tuning_seeds=tuning,
        )
        for row, seed, d in cells:
            if (d / "metrics.csv").is_file():
                found.runs.append((row, d))
            else:
                found.missing.setdefault(row, []).append((seed, read_attempts(d / "attempts.jsonl")))
        return found
    runs = []
    for pattern in ("*/metrics.csv", "*/*/metrics.csv"):
        for m in sorted(out.glob(pattern)):
            if (
                (m.parent / "config.yaml").is_file()
                and ".partial" not in m.parts
                and "reports" not in m.parts
            ):
                runs.append((None, m.parent))
    return Found(runs)
