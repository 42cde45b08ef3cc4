"""A saved W&B workspace for one grid (`vapo-report --wandb-workspace`), built with the
wandb-workspaces library (`pip install 'vapo-lit[workspace]'`).

    from vapo_lit.report.workspace import workspace_spec
    ws = workspace_spec(entity="me", project="vapo-lit", group="table1", k=8)
    ws.save()          # needs an online W&B account; prints the workspace URL

What it shows: the project's runs filtered to the grid's group and grouped by job_type (one line
per table row, the mean over seeds with its standard error); a section of diagnostic panels on
the `ppo/update` axis (eval score, training score, entropy, response length, explained variance,
value bias, clip fractions); a section for value pretraining on its own axis; and the grid run's
table, seeds and figures. The specification is built from the report folder (the cells' run
cards and config.yaml) without a network; only `save()` talks to W&B.
"""

from __future__ import annotations

from pathlib import Path

from vapo_lit.wandb_runs import PPO_AXIS, PRETRAIN_AXIS, PRETRAIN_PREFIX

PANELS = (
    ("eval score avg@{k}", ("eval/avg@{k}",)),
    ("training score", ("objective/score",)),
    ("policy entropy", ("policy/entropy",)),
    ("response length", ("rollout/response_length",)),
    ("explained variance (critic vs Monte-Carlo returns)", ("value/explained_variance",)),
    ("value calibration (V - return, mean)", ("value/bias",)),
    ("clip fractions", ("policy/clipfrac_low", "policy/clipfrac_high")),
)
"""(title, metrics) of the diagnostic panels, stepped on `ppo/update`."""
PRETRAIN_PANELS = (
    ("value pretraining: explained variance", ("value/explained_variance",)),
    ("value pretraining: value loss", ("value/loss",)),
)


def workspace_spec(
    entity: str, project: str, group: str, k: int, *, name: str | None = None, figures: tuple[str, ...] = ()
):
    """The wandb_workspaces.Workspace for `group` (nothing is sent until `.save()`)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def plot(title, metrics, x):
        return wr.LinePlot(
            title=title, x=x, y=list(metrics), groupby_aggfunc="mean", groupby_rangefunc="stderr"
        )

    rows = ws.Section(
        name=f"{group}: rows by PPO update",
        is_open=True,
        panels=[plot(t.format(k=k), [m.format(k=k) for m in ms], PPO_AXIS) for t, ms in PANELS],
    )
    pretrain = ws.Section(
        name=f"{group}: value pretraining",
        is_open=False,
        panels=[plot(t, [PRETRAIN_PREFIX + m for m in ms], PRETRAIN_AXIS) for t, ms in PRETRAIN_PANELS],
    )
    report = ws.Section(
        name=f"{group}: grid report (job_type report)",
        is_open=True,
        panels=[
            wr.WeavePanelSummaryTable(table_name="grid/table"),
            wr.WeavePanelSummaryTable(table_name="grid/seeds"),
            wr.WeavePanelSummaryTable(table_name="grid/caveats"),
            wr.WeavePanelSummaryTable(table_name="grid/cells"),
        ]
        + (
            [wr.MediaBrowser(title="figures", media_keys=[f"figures/{f}" for f in figures])]
            if figures
            else []
        ),
    )
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name or f"vapo-lit {group}",
        sections=[rows, report, pretrain],
        settings=ws.WorkspaceSettings(x_axis=PPO_AXIS, smoothing_type="none", max_runs=100),
        runset_settings=ws.RunsetSettings(
            filters=ws.And(ws.Metric("Group") == group), groupby=[ws.Metric("JobType")]
        ),
    )


def spec_of_folder(folder: Path, entity: str):
    """The workspace for the grid reported in FOLDER (project, group and k from the cells' records)."""
    import yaml

    from vapo_lit.report.grid_run import _common, cell_runs

    folder = Path(folder)
    cells = [c for c in cell_runs(folder) if c["id"]]
    if not cells:
        raise ValueError(
            f"{folder}: no cell of this grid was logged to W&B (their run cards have no wandb record)"
        )
    project = _common([c["project"] for c in cells], "vapo-lit")
    group = _common([c["group"] for c in cells], folder.name)
    cfg_path = folder / cells[0]["run"] / "config.yaml"
    k = int((yaml.safe_load(cfg_path.read_text()) or {}).get("eval_k", 8)) if cfg_path.is_file() else 8
    figures = tuple(p.stem for p in sorted(folder.glob("*.png")))
    return workspace_spec(entity, project, group, k, figures=figures)


def save_workspaces(out, grid_id: str | None = None, *, to=None, entity: str | None = None) -> list[str]:
    """Save the workspace of each reported grid to W&B (online); one line per workspace."""
    import wandb

    from vapo_lit.report.write import grids_in

    out = Path(out)
    entity = entity or wandb.Api().default_entity
    lines = []
    for gid in [grid_id] if grid_id else (grids_in(out) or [None]):
        folder = Path(to) if to is not None else out / "reports" / (gid or "runs")
        if (folder / "seeds.csv").is_file():
            ws = spec_of_folder(folder, entity).save()
            lines.append(f"W&B workspace for {gid or folder.name}: {ws.url}")
    return lines
