"""Build one report folder from the logs (see the package docstring for what it holds).

    from vapo_lit.report import write_report
    print(write_report("runs/ablate", grid_id="table1"))

Writes OUT/reports/<grid>/ (or `to`): table.md (the tables, the notes under them, the W&B
section, what the deltas do and do not support), table.tex, table.csv (one line per row),
seeds.csv (one line per run), calibration.csv (value bias by position) and the figures listed in
`figures.NAMES`. A folder without grids/ is reported as one grid, 'runs'. Rows and labels come
from the grid manifest (OUT/grids/<grid>.json) when there is one, else from each run's config
(`labels.run_label`, `labels.row_order`).

The text files depend only on the logs: no absolute paths (run folders are relative to the
report folder), no timestamps, fixed float formats, so regenerating from the same CSVs gives the
same bytes. Bad logs raise `LogError` naming the file and line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from vapo_lit.config import COMPONENTS
from vapo_lit.labels import check_contrasts, row_order, run_label
from vapo_lit.protocol import parse_endpoint
from vapo_lit.report import render
from vapo_lit.report.collect import CALIBRATION_UPDATES, bias_buckets, calibration, efficiency, per_run
from vapo_lit.report import contrasts as contrast
from vapo_lit.report import critic as critic_quality
from vapo_lit.report.credit import CREDIT_TEXT, credit_frame
from vapo_lit.report.figures import MECHANISM_FIGURES, NAMES as FIGURES, plot_all
from vapo_lit.report.logs import LogError, find_runs, load_run, read_json
from vapo_lit.report.mechanisms import BY_LENGTH_TEXT, MECHANISMS_TEXT, markdown_tables, mechanism_frames
from vapo_lit.report.table import build_table, pretty
from vapo_lit.report.transcripts import PROMPT_TAIL, transcript_frame
from vapo_lit.report.transcripts import TEXT as TRANSCRIPTS_TEXT, markdown as transcripts_markdown

__all__ = ["write_report", "report_grid", "grids_in", "LogError", "REFERENCE"]

REFERENCE = run_label(COMPONENTS)
"""The row every delta is taken against by default: the full recipe."""
THRESHOLD_FRACTION = 0.9
"""Default sample-efficiency threshold: this fraction of the reference row's mean peak score,
rounded down to a whole point (fixed for the whole table)."""
FLOAT = "%.10g"


def grids_in(out: Path) -> list[str]:
    return sorted(p.stem for p in (Path(out) / "grids").glob("*.json"))


def caveats(table: pd.DataFrame, reference: str | None = "vapo") -> str:
    """docs/algorithm.md's 'what the results do not support', applied to this table and its
    reference row (the full recipe: each Δ is a removal; another row: a difference from it)."""
    n_min = int(table["n"].min()) if len(table) else 0
    single = [pretty(r) for r in table["row"] if r.startswith("vapo-no-") and "+" not in r]
    if reference == "vapo":
        what = "each Δ is the conditional effect of removing that component *from this full recipe*"
    elif reference:
        what = f"each Δ is the paired difference of a row from {pretty(reference)}"
    else:
        what = "each row's scores (there is no reference row, so no Δ)"
    lines = [
        "## What these deltas do and do not support",
        "",
        f"Supported: {what}, on this task, model, preset and budget, with the stated seeds.",
        "",
        "Not supported by this table:",
        "- that the full recipe's score is due to any single component: components interact, and single-drop "
        "deltas are not independent effects (they need not add up; test interactions with a joint-drop or the "
        "`pairwise` grid);",
        "- that alpha, the value-pretraining steps or other settings used here transfer to other models, "
        "tasks or response lengths;",
        "- that critic-based PPO always beats critic-free GRPO (one task, one budget);",
        "- that longer responses mean more correct ones (length and score are logged side by side, not causally "
        "linked);",
        "- that the positive-example NLL is safe with a noisy verifier (this task's verifier is exact).",
    ]
    if n_min < 2:
        lines.append(
            f"- any difference at all for rows with n={n_min}: no estimate of seed variance, no confidence "
            "interval; rerun with `--seeds 3` or more (or `vapo-ablate --seeds auto`)."
        )
    else:
        lines.append(
            "- differences whose paired 95% interval contains zero, or that do not survive the Holm "
            "adjustment when several rows are read together."
        )
    if single:
        lines.append(
            f"- a ranking of components: the single drops here ({', '.join(single)}) are each one "
            "counterfactual around one recipe."
        )
    return "\n".join(lines)


def seed_scope_note(logs) -> str:
    """What a seed varies in these runs, hence what the intervals over seeds include: read from each
    run's config (seed, model, model_seed). model_seed builds the built-in base policy and reward
    model; with a policy from a model folder it seeds only a critic's fresh value head."""
    built = all(log.model in ("builtin", "random") for log in logs)
    model_seeds = sorted({log.model_seed for log in logs})
    rl = "the RL run (prompt stream, sampling, mini-batch order)"
    follows = len({log.seed for log in logs}) > 1 and all(log.model_seed == log.seed for log in logs)
    if follows and built:
        return (
            "Seeds: each seed builds its own base policy and reward model (model_seed = seed, `--model_seed "
            f"follow`), so the intervals include the variance of the whole pipeline: the built models and {rl}."
        )
    if follows:
        return (
            "Seeds: the policy is the same model folder in every run; a critic's fresh value head follows the seed "
            f"(model_seed = seed), so the intervals include the variance of {rl} and of that initialisation, not "
            "that of the base policy."
        )
    if len(model_seeds) == 1 and built:
        return (
            f"Seeds: every run starts from the same base policy and reward model (model_seed {model_seeds[0]}); "
            f"a seed varies {rl} only, so the intervals include the seed variance of RL, not that of building the "
            "models (`vapo-ablate --model_seed follow` varies both)."
        )
    if len(model_seeds) == 1:
        return (
            f"Seeds: every run starts from the same policy (a model folder) and critic initialisation (model_seed "
            f"{model_seeds[0]}); a seed varies {rl} only, so the intervals include the seed variance of RL, not "
            "that of the base model."
        )
    return (
        f"Seeds: model_seed differs between runs ({', '.join(map(str, model_seeds))}) without following the seed: "
        "runs of one seed may start from different models, so a paired Δ mixes both sources of variance."
    )


def wandb_section(logs, grid_id: str, folder: Path) -> str:
    """From the run cards only (so it is the same wherever the logs were copied)."""
    groups, offline = set(), []
    for log in logs:
        wb = log.card.get("wandb") or {}
        if wb:
            groups.add(wb.get("group") or grid_id)
            if wb.get("mode") == "offline":
                offline.append(log)
    if not groups:
        return f"W&B: not logged (runs were made with wandb disabled); group would be `{grid_id}`."
    text = [
        f"W&B group: `{', '.join(sorted(groups))}` (filter the project's runs by this group; job_type = table row)."
    ]
    if offline:
        globs = sorted(
            os.path.relpath(log.run_dir / "wandb", folder).replace(os.sep, "/") + "/offline-run-*"
            for log in offline
        )
        text.append(
            f"{len(offline)} offline run(s); upload them from this folder with:\n\n    wandb sync "
            + " ".join(globs)
        )
    return "\n".join(text)


def _order(found, logs) -> list[str]:
    labels = list(dict.fromkeys(log.row for log in logs))
    if found.rows is not None:
        return list(found.rows) + [r for r in labels if r not in found.rows]
    keys = {log.row: row_order(log.components, log.estimator, log.row) for log in logs}
    return sorted(labels, key=lambda r: keys[r])


def _threshold(seeds: pd.DataFrame, reference: str | None, threshold) -> float:
    if threshold not in (None, "auto"):
        return float(threshold)
    ref = seeds[seeds["row"] == reference]["peak"].dropna() if reference else pd.Series(dtype=float)
    base = ref.mean() if len(ref) else seeds.groupby("row")["peak"].mean().max()
    return float(math.floor(THRESHOLD_FRACTION * base)) if base == base else float("nan")


def _budget(seeds: pd.DataFrame, col: str) -> float:
    """The cheapest complete run's total (every run spent at least this much unless truncated)."""
    complete = seeds[(seeds["truncated"] == "") & (seeds[col] > 0)][col]
    pool = complete if len(complete) else seeds[seeds[col] > 0][col]
    return float(pool.min()) if len(pool) else float("nan")


def _calibration_frame(logs, order) -> tuple[pd.DataFrame, dict]:
    per_row, vp, records = {}, {}, []
    buckets = bias_buckets(logs)
    for row in order:
        runs = [log for log in logs if log.row == row]
        if not runs:
            continue
        vp[row] = "value_pretraining" in runs[0].components
        cals = [calibration(log, buckets=buckets) for log in runs]
        per_row[row] = {}
        for phase in ("early", "late"):
            for b in buckets:
                vals = [c[(phase, b)] for c in cals if c[(phase, b)] == c[(phase, b)]]
                mean = sum(vals) / len(vals) if vals else float("nan")
                per_row[row][(phase, b)] = mean
                records.append(
                    {
                        "row": row,
                        "value_pretraining": int(vp[row]),
                        "phase": phase,
                        "bucket": b,
                        "bias_mean": mean,
                        "runs": len(vals),
                    }
                )
    return pd.DataFrame(
        records, columns=["row", "value_pretraining", "phase", "bucket", "bias_mean", "runs"]
    ), {"bias": per_row, "vp": vp, "buckets": buckets}


def _write(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "w", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class GridReport:
    """What one grid's report shows, computed from the logs (nothing written yet)."""

    name: str
    folder: Path
    """Where it is written; run folders are given relative to it."""
    description: str
    logs: list
    order: list[str]
    """The rows with a log, in table order."""
    no_log_rows: list[str]
    missing: dict
    seeds: pd.DataFrame
    table: pd.DataFrame
    calibration: pd.DataFrame
    cal_plot: dict
    ks: list[int]
    budgets: dict
    ctx: render.Context
    threshold_given: bool
    credit: pd.DataFrame | None = None
    """Multi-turn credit diagnostics per row (report/credit.py); None for single-turn grids."""
    mechanisms: tuple | None = None
    """(per row, per row and length bucket) length mechanisms (report/mechanisms.py); None for runs
    logged without them."""
    critic: pd.DataFrame | None = None
    """The critic's quality per row (report/critic.py); None when no row has a critic."""
    contrasts: pd.DataFrame | None = None
    """Further paired comparisons (report/contrasts.py); None when none is asked for."""
    contrasts_left_out: str = ""
    """The note naming declared contrasts without logs yet (empty: none)."""
    recorded: bool = True
    """Whether the manifest records the endpoint (fixed before the grid ran)."""
    tuning_seeds: list | None = None
    """The manifest's tuning seeds (None: not recorded)."""
    transcripts: pd.DataFrame | None = None
    """Episodes shown from the runs' samples (report/transcripts.py); None when no run kept any."""


def report_grid(
    out: Path,
    grid_id: str | None,
    last_n: int = 10,
    *,
    to: Path | None = None,
    reference: str | None = None,
    threshold="auto",
    max_seeds: int = 20,
    figures: bool = True,
    contrasts=(),
) -> str:
    """Build one grid's report from its runs' logs; returns the Markdown text. `contrasts`: (row,
    against) pairs compared besides the grid's own.
    Raises LogError for a malformed log or when there is no run log at all."""
    out = Path(out)
    rep = compute(
        out,
        grid_id,
        _folder(out, grid_id, to),
        last_n,
        reference=reference,
        threshold=threshold,
        max_seeds=max_seeds,
        contrasts=contrasts,
    )
    return _write_grid(rep, figures)


def _folder(out: Path, grid_id: str | None, to) -> Path:
    return Path(to) if to is not None else out / "reports" / (grid_id or "runs")


def _write_grid(rep: GridReport, figures: bool) -> str:
    rep.folder.mkdir(parents=True, exist_ok=True)  # only now: every input has been read and checked
    write_files(rep, figures=figures)
    text = render_markdown(rep)
    _write(rep.folder / "table.md", text + "\n")
    return text


def compute(
    out: Path,
    grid_id: str | None,
    folder: Path,
    last_n: int,
    *,
    reference: str | None,
    threshold,
    max_seeds: int,
    contrasts=(),
) -> GridReport:
    """Every number of the report: per-run (seeds), per-row (table) and the calibration frame."""
    found = find_runs(out, grid_id)
    if not found.runs:
        cells = sum(len(v) for v in found.missing.values())
        where = (
            f"grid {grid_id!r} ({cells} cells in {out / 'grids' / f'{grid_id}.json'}, none with a metrics.csv)"
            if grid_id
            else "no folder with metrics.csv and config.yaml"
        )
        raise LogError(f"{out}: no run logs to report: {where}")
    logs = [load_run(d, row) for row, d in found.runs]
    order, no_log_rows, reference, pairs = _rows(found, logs, reference, contrasts)
    endpoint = parse_endpoint(found.endpoint)
    seeds, thr, budgets = _seed_frame(logs, order, last_n, folder, endpoint, reference, threshold)
    ks = sorted({log.k for log in logs})
    ctx = render.Context(
        ks[0], last_n, thr, reference, budgets["tokens"], budgets["seconds"], max_seeds, endpoint
    )
    manifest = out / "grids" / f"{grid_id}.json"
    recorded = read_json(manifest) if grid_id and manifest.is_file() else {}
    desc = recorded.get("description", "")
    return GridReport(
        grid_id or "runs",
        folder,
        desc,
        logs,
        order,
        no_log_rows,
        found.missing,
        seeds,
        build_table(seeds, order, reference, found.missing, max_seeds),
        *_calibration_frame(logs, order),
        ks,
        budgets,
        ctx,
        threshold not in (None, "auto"),
        credit_frame(logs, order, last_n),
        mechanism_frames(logs, order, last_n),
        critic_quality.critic_frame(logs, order, last_n),
        contrast.contrast_frame(seeds, pairs),
        contrast.left_out_note(found.contrasts, pairs),
        "endpoint" in recorded,
        found.tuning_seeds,
        transcript_frame(logs, order),
    )


def _rows(found, logs: list, reference: str | None, contrasts) -> tuple[list, list, str | None, list]:
    """(the rows with logs in order, the rows without, the deltas' reference row or None, the
    contrasts checked: the grid's declared ones whose rows have logs, and the command's)."""
    order = _order(found, logs)
    with_logs = {log.row for log in logs}
    no_log_rows = [
        r for r in order if r not in with_logs
    ]  # every cell failed or not run yet: named, not tabled
    order = [r for r in order if r in with_logs]
    given, reference = reference, reference or found.reference or REFERENCE
    if reference not in order:
        if given not in (None, REFERENCE):
            raise ValueError(f"--reference {given!r}: no such row; rows: {', '.join(order)}")
        reference = None  # the grid's declared row or the full recipe has no logs (yet): no deltas
    declared = [c for c in found.contrasts if all(x in order for x in c)]  # rows without logs yet: left out
    # one check of both: a --contrast repeating a declared pair merges, a reversed one is the same test (an error)
    pairs = check_contrasts(
        declared + [tuple(c) for c in contrasts if tuple(c) not in declared], order, "--contrast"
    )
    return order, no_log_rows, reference, pairs


def _seed_frame(logs: list, order: list, last_n: int, folder: Path, endpoint, reference, threshold):
    """(one line per run with its scores and compute-matched efficiency, in row order; the threshold;
    the token and time budgets)."""
    position = {r: i for i, r in enumerate(order)}
    seeds = pd.DataFrame([per_run(log, last_n, folder, endpoint) for log in logs])
    thr = _threshold(seeds, reference, threshold)
    budgets = {"tokens": _budget(seeds, "cumulative_tokens"), "seconds": _budget(seeds, "cumulative_seconds")}
    eff = pd.DataFrame([efficiency(log, thr, budgets["tokens"], budgets["seconds"]) for log in logs])
    seeds = pd.concat([seeds, eff], axis=1)
    seeds["_o"] = seeds["row"].map(position)
    seeds = seeds.sort_values(["_o", "seed", "run"], kind="stable").drop(columns="_o").reset_index(drop=True)
    return seeds, thr, budgets


def write_files(rep: GridReport, figures: bool = True) -> None:
    """seeds.csv, table.csv, calibration.csv, table.tex and (with `figures`) the figures."""
    frames = [("seeds", rep.seeds), ("table", rep.table), ("calibration", rep.calibration)]
    frames += [("credit", rep.credit)] if rep.credit is not None else []
    frames += list(zip(("mechanisms", "by_length"), rep.mechanisms)) if rep.mechanisms is not None else []
    frames += [("critic", rep.critic)] if rep.critic is not None else []
    frames += [("transcripts", rep.transcripts)] if rep.transcripts is not None else []
    if rep.contrasts is not None:
        frames.append(("contrasts", rep.contrasts))
    else:
        (rep.folder / "contrasts.csv").unlink(missing_ok=True)  # a rerun's report has none now
    for name, frame in frames:
        frame.to_csv(rep.folder / f"{name}.csv", index=False, float_format=FLOAT, lineterminator="\n")
    _write(rep.folder / "table.tex", render.latex_all(rep.table, rep.ctx) + "\n")
    if figures:
        plot_all(
            rep.logs,
            rep.order,
            rep.folder,
            rep.ctx.k,
            rep.budgets,
            rep.cal_plot,
            mechanisms=rep.mechanisms is not None,
        )
        if rep.critic is not None:
            critic_quality.plot(rep.logs, rep.order, rep.folder / "critic_quality.png")


def render_markdown(rep: GridReport) -> str:
    """table.md: the four tables, the notes under them, the W&B section and the caveats."""
    reference = rep.ctx.reference
    ref_name = pretty(reference) if reference else "(none: no full-recipe row; no deltas)"
    sections = _main_sections(rep, ref_name) + _compute_sections(rep)
    extra, figures = _study_sections(rep)
    sections += extra
    files = ["value bias by position in `calibration.csv`"]
    files += ["the critic's quality in `critic.csv`"] if rep.critic is not None else []
    files += ["further contrasts in `contrasts.csv`"] if rep.contrasts is not None else []
    files += ["multi-turn credit in `credit.csv`"] if rep.credit is not None else []
    files += (
        ["length mechanisms in `mechanisms.csv` and `by_length.csv`"] if rep.mechanisms is not None else []
    )
    files += ["the episodes shown in `transcripts.csv`"] if rep.transcripts is not None else []
    sections += [
        wandb_section(rep.logs, rep.name, rep.folder),
        caveats(rep.table, reference),
        "Figures: " + ", ".join(f"[{p}]({p}.png)" for p in figures) + "; " + "; ".join(files) + ".",
        f"Source: {len(rep.logs)} run folder(s); per-run numbers in `seeds.csv` (run folders relative to this "
        f"folder).",
    ]
    return "\n\n".join(sections)


def _main_sections(rep: GridReport, ref_name: str) -> list[str]:
    """The title, the main table and its notes, the paired deltas and the further contrasts."""
    table, ctx, seeds = rep.table, rep.ctx, rep.seeds
    reference = ctx.reference
    sections = [
        f"# Ablation `{rep.name}`" + (f": {rep.description}" if rep.description else ""),
        _intro(rep, ref_name),
        protocol_note(rep),
        render.markdown(*render.rows("main", table, ctx)),
    ]
    final = f"Δ {ctx.endpoint.label}"
    notes = [
        render.zero_spread_note(table, ctx, {"final": final}) if reference else "",
        render.holm_note(table, ctx) if reference else "",
        render.paper_note(table, ctx),
        render.seeds_note(table, ctx) if reference else "",
        render.pairing_note(table, ctx, rep.missing),
        render.no_log_note(rep.no_log_rows, rep.missing),
        render.truncation_note(seeds),
        seed_scope_note(rep.logs),
    ]
    sections += [n for n in notes if n]
    if reference and len(rep.order) > 1:
        flat = render.zero_spread_note(table, ctx, {"final": final, "peak": "Δ peak", "auc": "Δ AUC"})
        sections += [
            f"## Paired deltas against {ref_name}",
            PAIRED_TEXT.format(ref=ref_name),
            render.markdown(*render.rows("paired", table, ctx)),
            *([flat] if flat else []),
            render.holm_note(table, ctx, "auc", "Δ AUC")
            + " "
            + render.seeds_note(table, ctx, "auc", "Δ AUC"),
        ]
    if rep.contrasts is not None:
        sections += [
            "## Further contrasts",
            contrast.TEXT,
            contrast.markdown_table(rep.contrasts, ctx.endpoint.label),
        ]
    return sections + ([rep.contrasts_left_out] if rep.contrasts_left_out else [])


def _compute_sections(rep: GridReport) -> list[str]:
    """The compute-matched comparison and the diagnostics."""
    table, ctx, seeds = rep.table, rep.ctx, rep.seeds
    sources = sorted(set(seeds["cost_source"]))
    cost = "; ".join(_source_text(s, int((seeds["cost_source"] == s).sum())) for s in sources)
    return [
        "## Compute-matched comparison",
        COMPUTE_TEXT.format(
            tokens=render.tokens(rep.budgets["tokens"]),
            time=render.duration(rep.budgets["seconds"]),
            cost=cost,
        ),
        render.markdown(*render.rows("compute", table, ctx)),
        "## Diagnostics",
        DIAGNOSTICS_TEXT.format(n=ctx.last_n),
        render.markdown(*render.rows("diagnostics", table, ctx)),
    ]


def _study_sections(rep: GridReport) -> tuple[list[str], tuple]:
    """The sections a grid has only when its runs logged what they need (critic quality, multi-turn
    credit, what the model wrote, long and short responses), and the figures the report lists."""
    n, sections, figures = rep.ctx.last_n, [], FIGURES
    if rep.critic is not None:
        sections += [
            "## Critic quality",
            critic_quality.CRITIC_TEXT.format(early=CALIBRATION_UPDATES, n=n),
            critic_quality.markdown_table(rep.critic),
        ]
    if rep.credit is not None:
        sections += ["## Multi-turn credit", CREDIT_TEXT.format(n=n), _credit_markdown(rep.credit)]
    if rep.transcripts is not None:
        sections += [
            "## What the model wrote",
            TRANSCRIPTS_TEXT.format(tail=PROMPT_TAIL),
            transcripts_markdown(rep.transcripts, pretty),
        ]
    if rep.mechanisms is not None:
        mech, by_length = rep.mechanisms
        tables = markdown_tables(mech, by_length)
        sections += [
            "## Long and short responses",
            MECHANISMS_TEXT.format(early=CALIBRATION_UPDATES, n=n),
            tables[0],
            BY_LENGTH_TEXT.format(early=CALIBRATION_UPDATES, n=n),
            *tables[1:],
        ]
        figures = FIGURES + MECHANISM_FIGURES
    figures += ("critic_quality",) if rep.critic is not None else ()
    return sections, figures


def protocol_note(rep: GridReport) -> str:
    """The grid's endpoint, the measurement error of one run's endpoint against the deltas reported,
    and which rows rest on tuning seeds (vapo_lit/protocol.py)."""
    ctx, seeds, table = rep.ctx, rep.seeds, rep.table
    end = ctx.endpoint
    fixed = (
        "fixed in the grid's manifest before it ran"
        if rep.recorded
        else "the manifest records no endpoint chosen before the grid ran"
    )
    parts = [
        f"Endpoint: **{end.description}** after training started (`{end.name}`; {fixed}); the columns "
        f"'{end.label}' and every Δ {end.label} hold it."
    ]
    sizes = sorted({log.eval_problems * log.k for log in rep.logs if log.eval_problems})
    ref = seeds[seeds["row"] == ctx.reference]["final"].dropna() if ctx.reference else seeds["final"].dropna()
    if len(sizes) == 1 and all(log.eval_problems for log in rep.logs) and len(ref):
        n, p = sizes[0], float(ref.mean()) / 100.0
        se = 100.0 * math.sqrt(max(p * (1.0 - p), 0.0) / (n * end.last))
        text = (
            f"One eval scores {n} responses; at the {'reference' if ctx.reference else 'mean'} score "
            f"({render.num(100.0 * p)}) the binomial standard error of one run's endpoint is "
            f"±{render.num(se)} points"
        )
        deltas = table[table["row"] != ctx.reference]["delta_final"].dropna().abs() if ctx.reference else []
        if len(deltas) and se > 0:
            median = float(deltas.median())
            text += f", against a median |Δ {end.label}| of {render.num(median)} points ({median / se:.1f} x)"
        parts.append(text + ".")
    else:
        parts.append(
            "The eval's size is not in every run's config (eval_problems unset), so no standard error is "
            "given."
        )
    tuning = rep.tuning_seeds
    if tuning is None:
        parts.append(
            "Tuning seeds: not recorded, so whether a row's settings were chosen on its own seeds is unknown."
        )
    elif not tuning:
        parts.append("Tuning seeds: none declared; every cell is a confirmation cell.")
    else:
        on = {
            row: sorted(int(s) for s in g["seed"] if int(s) in tuning)
            for row, g in seeds.groupby("row", sort=False)
        }
        flagged = [f"{pretty(row)} ({', '.join(map(str, on[row]))})" for row in rep.order if on.get(row)]
        listed = ", ".join(map(str, tuning))
        parts.append(
            f"Tuning seeds: {listed} (settings were chosen on them)."
            + (
                f" ⚠ Rows whose numbers include tuning seeds, which flatter the settings chosen on them: "
                f"{'; '.join(flagged)}. Read their deltas as exploratory; confirmatory claims need confirmation seeds only."
                if flagged
                else " No row includes them: every delta rests on confirmation seeds."
            )
        )
    parts += pin_note(rep.logs) + same_start_warnings(rep.logs)
    return " ".join(parts)


def _runs_per(logs, values) -> dict:
    """value -> the names of the runs whose `values(log)` include it (a run counts under each)."""
    out: dict = {}
    for log in logs:
        for value in values(log):
            out.setdefault(value, set()).add(log.run_dir.name)
    return out


def pin_note(logs) -> list[str]:
    """The sentence naming the instruction set every run was held to (vapo_lit/cpu_pin.py, as the
    run cards record it) and the CPU models they ran on (as the attempts and run cards record them);
    nothing when a run ran unpinned or the runs name different pins."""
    pins = {log.cpu_pin for log in logs}
    if len(pins) != 1 or None in pins:
        return []
    held = f"Every run was held to one instruction set ({pins.pop()}: torch's, MKL's and oneDNN's kernels)"
    on = _runs_per(logs, lambda log: log.cpu_models or ("not recorded",))
    if len(on) == 1:
        (model,) = on
        where = "whichever CPU ran it" if model == "not recorded" else f"on one CPU model ({model})"
        return [f"{held}, {where}."]
    listed = "; ".join(f"{model} {len(runs)}" for model, runs in sorted(on.items()))
    return [
        f"{held}; the CPU models they computed on (runs per model: {listed}; a resumed run counts under "
        "each it ran on): a pin holds the instruction set, not every last bit, so runs on different "
        "models can differ in the last bits of their float32 results (part of each Δ can be the "
        "machine's), and their wall times measure different machines."
    ]


def same_start_warnings(logs) -> list[str]:
    """⚠ lines when a grid's runs did not compute alike: runs on CPUs of different instruction sets
    (float32 results, the built-in models' builds among them, differ in their last bits), or runs of
    one model_seed started from different built-in policy weights (their rows do not pair on one base
    policy). Nothing when the logs show neither, or do not record it."""
    out = []
    runs_on = _runs_per(logs, lambda log: log.cpu_capabilities)
    if len(runs_on) > 1:
        listed = ", ".join(f"{cap} {len(runs)}" for cap, runs in sorted(runs_on.items()))
        out.append(
            f"⚠ The runs computed on CPUs whose torch kernels differ (runs per instruction set: {listed}; a "
            "resumed run counts under each it ran on): their float32 results differ in the last bits, so "
            "part of each Δ is the machine's; pin `ATEN_CPU_CAPABILITY` on every worker, or rerun on one "
            "kind of CPU."
        )
    starts: dict = {}
    for log in logs:
        if log.policy_sha256:
            starts.setdefault(log.model_seed, set()).add(log.policy_sha256)
    split = sorted(seed for seed, digests in starts.items() if len(digests) > 1)
    if split:
        out.append(
            f"⚠ Runs of the same model_seed started from different built-in policy weights (model_seed "
            f"{', '.join(map(str, split))}): they were built apart (another cache or machine), so their "
            "rows do not pair on one base policy; give every worker one `--cache_dir` on shared storage."
        )
    return out


def _credit_markdown(credit: pd.DataFrame) -> str:
    head = [
        "row",
        "runs",
        "tool calls",
        "V bias before obs",
        "V bias after obs",
        "A turn 1",
        "A turn 2",
        "A turn 3",
        "A turn 4+",
    ]
    body = [
        [
            pretty(r["row"]),
            str(int(r["runs"])),
            render.num(r["tool_calls"], 2),
            *(
                render.num(r[c], 3, signed=True)
                for c in (
                    "bias_before_obs",
                    "bias_after_obs",
                    "adv_turn1",
                    "adv_turn2",
                    "adv_turn3",
                    "adv_turn4plus",
                )
            ),
        ]
        for _, r in credit.iterrows()
    ]
    return render.markdown(head, body)


def _intro(rep: GridReport, ref_name: str) -> str:
    ks, k, ctx = rep.ks, rep.ctx.k, rep.ctx
    return (
        f"eval avg@{k} in points (x100){' (k differs between runs: ' + str(ks) + ')' if len(ks) > 1 else ''}; "
        f"mean ± std over seeds. Δ = paired difference to {ref_name}: the per-seed difference row − reference "
        f"over the seeds both have, its mean and 95% t-interval; Holm p = paired t-test p-value adjusted for "
        f"comparing every row with the same reference. Sample efficiency: PPO updates until the eval first "
        f"reaches {render.threshold(ctx)} points ("
        + (
            "`--threshold`"
            if rep.threshold_given
            else f"{int(THRESHOLD_FRACTION * 100)}% of the reference's mean peak, rounded down"
        )
        + "; mean over the runs "
        f"that reached it) and AUC = area under the eval curve from update 0 to the last eval divided by that "
        f"range (the mean score over training). Strict = `eval/strict_avg@{k}` (the whole chain right) at the "
        f"final eval."
    )


PAIRED_TEXT = (
    "Per-seed differences to {ref} (points; updates for 'updates to'), mean and 95% t-interval, "
    "Holm-adjusted p per column; the last column is the unpaired comparison of the row means (Welch), for "
    "contrast: it ignores what a seed shares across rows."
)
COMPUTE_TEXT = (
    "The score each run had reached (its last eval) once it had generated as many response tokens, or spent "
    "as much wall time (training and eval), as the cheapest complete run: {tokens} tokens, {time}. Cost "
    "source: {cost}. Equal steps favour rows whose steps cost more (the critic's forward and backward "
    "passes); this table asks what each row achieves for the same compute."
)
DIAGNOSTICS_TEXT = (
    "Final PPO iteration / last {n} (mean; EV: median, robust to a single batch with no correct "
    "response) over PPO iterations, then the mean over seeds. EV vs MC = explained variance of the "
    "critic against Monte-Carlo returns (comparable across rows); EV vs targets = against the critic's "
    "own training targets (flatters a critic when lambda < 1). Wall time and tokens/s from the logs; "
    "peak memory = the largest `perf/peak_memory_mb` logged; attempts / crashes from `attempts.jsonl` "
    "(failed or lost attempts, cells without a log included)."
)


def _source_text(source: str, n: int) -> str:
    if source == "logged":
        return f"`perf/cumulative_seconds` and `perf/cumulative_tokens` as logged ({n} run(s))"
    if source == "reconstructed":
        return (
            f"reconstructed as cumulative sums of `perf/total_seconds` and of `rollout/response_length` x "
            f"`rollout/prompts` x `rollout/samples_per_prompt` ({n} run(s) logged before the cumulative columns)"
        )
    return f"{source} ({n} run(s))"


def write_report(
    out,
    grid_id: str | None = None,
    last_n: int = 10,
    *,
    to=None,
    reference: str | None = None,
    threshold="auto",
    max_seeds: int = 20,
    figures: bool = True,
    contrasts=(),
) -> str:
    """Report `grid_id`, or every grid under OUT/grids/ (grids without any log yet are skipped),
    or OUT as a plain folder of runs. Raises LogError when nothing at all can be reported."""
    out = Path(out)
    ids = [grid_id] if grid_id else (grids_in(out) or [None])
    reps, empty = [], []
    for gid in ids:  # every grid computed (its logs read, its arguments checked) before any file is written
        try:
            reps.append(
                compute(
                    out,
                    gid,
                    _folder(out, gid, to),
                    last_n,
                    reference=reference,
                    threshold=threshold,
                    max_seeds=max_seeds,
                    contrasts=contrasts,
                )
            )
        except LogError as e:
            if len(ids) > 1 and "no run logs to report" in str(e):
                empty.append(str(gid))
                continue
            raise
    if not reps:
        raise LogError(f"{out}: no run logs to report in any grid ({', '.join(empty)})")
    texts = [_write_grid(rep, figures) + f"\n\n(written to {rep.folder}/)" for rep in reps]
    if empty:
        texts.append(f"(no run logs yet for grid(s): {', '.join(empty)})")
    return "\n\n".join(texts)
