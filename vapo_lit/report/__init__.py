"""vapo-report: tables and figures from the runs' CSV logs only (no network).

    from vapo_lit.report import write_report
    print(write_report("runs/ablate"))                 # every grid in runs/ablate/grids/
    print(write_report("runs/ablate", grid_id="table1"))

Writes OUT/reports/<grid>/: table.md (table, W&B section, what the deltas do and do not support),
table.tex, table.csv (numbers), seeds.csv (one line per run), score.png, response_length.png,
entropy.png, explained_variance.png. A folder without grids/ is reported as one grid, 'runs'.
"""
from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pandas as pd

from vapo_lit.report.collect import find_runs, load_run, per_run
from vapo_lit.report.figures import plot_all
from vapo_lit.report.table import build_table, latex, markdown, orders_of, pretty

__all__ = ["write_report", "report_grid", "grids_in"]


def grids_in(out: Path) -> list[str]:
    return sorted(p.stem for p in (Path(out) / "grids").glob("*.json"))


def caveats(table: pd.DataFrame) -> str:
    """SPEC.md's 'what the results do not support', applied to this table."""
    n_min = int(table["n"].min()) if len(table) else 0
    single = [pretty(r) for r in table["row"] if r.startswith("vapo-no-") and "+" not in r]
    lines = ["## What these deltas do and do not support", "",
             "Supported: each Δ is the conditional effect of removing that component *from this full recipe*, on this "
             "task, model, preset and budget, with the stated seeds.", "",
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
        lines.append(f"- any difference at all: some rows have n={n_min} seed, so there is no estimate of seed "
                     "variance and no confidence interval; rerun with `--seeds 3` or more.")
    else:
        lines.append(f"- differences whose 95% CIs overlap (n={n_min}..{int(table['n'].max())} seeds; the CIs are "
                     "per row, not for the difference).")
    if single:
        lines.append(f"- a ranking of components: the single drops here ({', '.join(single)}) are each one "
                     "counterfactual around one recipe.")
    return "\n".join(lines)


def wandb_section(logs, grid_id: str) -> str:
    groups, offline, online = set(), [], []
    for log in logs:
        wb = log.card.get("wandb") or {}
        if wb:
            groups.add(wb.get("group") or grid_id)
            (offline if wb.get("mode") == "offline" else online).append(log)
        offline_dirs = sorted(glob.glob(str(log.run_dir / "wandb" / "offline-run-*")))
        if offline_dirs and log not in offline:
            offline.append(log)
    if not groups and not offline:
        return f"W&B: not logged (runs were made with wandb disabled); group would be `{grid_id}`."
    text = [f"W&B group: `{', '.join(sorted(groups)) or grid_id}` (filter the project's runs by this group; "
            "job_type = table row)."]
    dirs = [d for log in offline for d in sorted(glob.glob(str(log.run_dir / "wandb" / "offline-run-*")))]
    if dirs:
        text.append(f"{len(dirs)} offline run(s); upload them with:\n\n    wandb sync " + " ".join(dirs))
    return "\n".join(text)


def report_grid(out: Path, grid_id: str | None, last_n: int = 10) -> str:
    """Build one grid's report from its runs' logs; returns the Markdown text."""
    out = Path(out)
    name = grid_id or "runs"
    logs = [load_run(d, row) for row, d in find_runs(out, grid_id)]
    folder = out / "reports" / name
    folder.mkdir(parents=True, exist_ok=True)
    if not logs:
        text = f"# {name}\n\nNo finished logs yet under {out}."
        (folder / "table.md").write_text(text + "\n")
        return text
    seeds = pd.DataFrame([per_run(log, last_n) for log in logs])
    table = build_table(seeds, orders_of(logs))
    ks = sorted({log.k for log in logs})
    k = ks[0]
    seeds.to_csv(folder / "seeds.csv", index=False)
    table.to_csv(folder / "table.csv", index=False)
    (folder / "table.tex").write_text(latex(table, k, last_n) + "\n")
    plot_all(logs, list(table["row"]), folder, k)
    desc = ""
    manifest = out / "grids" / f"{grid_id}.json"
    if grid_id and manifest.is_file():
        desc = json.loads(manifest.read_text()).get("description", "")
    text = "\n\n".join([
        f"# Ablation `{name}`" + (f": {desc}" if desc else ""),
        f"eval avg@{k} in points (x100){' (k differs between runs: ' + str(ks) + ')' if len(ks) > 1 else ''}; "
        f"mean ± std over seeds, 95% CI from the t-distribution; Δ = row mean − full-recipe mean (points); "
        f"base = the initial policy's eval; entropy, response length and explained variance: final PPO iteration / "
        f"mean of the last {last_n}.",
        markdown(table, k, last_n),
        wandb_section(logs, name),
        caveats(table),
        "Figures: " + ", ".join(f"[{p}]({p}.png)" for p in ("score", "response_length", "entropy", "explained_variance")),
        f"Source: {len(logs)} run folder(s) under `{os.path.relpath(out)}`; per-run numbers in `seeds.csv`.",
    ])
    tmp = folder / ".table.md.tmp"
    tmp.write_text(text + "\n")
    os.replace(tmp, folder / "table.md")
    return text


def write_report(out, grid_id: str | None = None, last_n: int = 10) -> str:
    """Report `grid_id`, or every grid under OUT/grids/, or OUT as a plain folder of runs."""
    out = Path(out)
    ids = [grid_id] if grid_id else (grids_in(out) or [None])
    texts = []
    for gid in ids:
        text = report_grid(out, gid, last_n)
        texts.append(text + f"\n\n(written to {out / 'reports' / (gid or 'runs')}/)")
    return "\n\n".join(texts)
