"""Pinned (issue 47): the pretrained-critic cache key as the module computes it (its
`pretrain_key`, on a config and the switches the component callbacks set from it), and what the
grid's W&B run is started with (`log_grid_run`: its cell ids, its mode), each at the lowest level
that shows it: no model, no training, no W&B run.

    .venv/bin/python -m pytest tests/test_pinned_grid.py
"""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import pytest

from vapo_lit import pretrain
from vapo_lit.components import build_callbacks
from vapo_lit.config import COMPONENTS, RunConfig, Switches, merge
from vapo_lit.module import VapoModule
from vapo_lit.presets import PRESETS


# ----------------------------------------------------------------------------- the pretrained-critic key
class Keyed:
    """The module's own `pretrain_key` and effective `samples_per_prompt`, on a config and the
    components its callbacks attach (as their setup in train() does): what decides which cached
    critic a run loads, without building the models."""

    pretrain_key = VapoModule.pretrain_key
    pretrain_plan = VapoModule.pretrain_plan
    samples_per_prompt = VapoModule.samples_per_prompt

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.switches, self.components = Switches(), []
        for cb in build_callbacks(cfg.components, cfg.vapo):
            cb.attach(self)
        self.max_new_tokens, self.task = 20, SimpleNamespace(version="v1")


def entry(cfg: RunConfig, tmp_path) -> str:
    """The cache folder of the critic a run of `cfg` would pretrain or load."""
    return pretrain.entry_dir(Keyed(cfg).pretrain_key(), tmp_path).name


@pytest.fixture
def base(tmp_path) -> RunConfig:
    """Full VAPO (value pretraining and group sampling on) in the smoke preset."""
    return merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {"out_dir": str(tmp_path / "runs"), "wandb": "disabled", "components": list(COMPONENTS)},
    )


def target(base, min_ev, window) -> RunConfig:
    return merge(base, {"vapo": {"value_pretrain_min_ev": min_ev, "value_pretrain_ev_window": window}})


def test_the_key_changes_with_the_ev_window_when_min_ev_is_set(base, tmp_path):
    """With a target explained variance, the window its median is taken over decides when the phase
    stops: another window, another critic."""
    entries = {w: entry(target(base, 0.3, w), tmp_path) for w in (1, 3, 5)}
    assert len(set(entries.values())) == 3, entries
    assert Keyed(target(base, 0.3, 3)).switches.value_pretrain_ev_window == 3
    assert entry(target(base, 0.4, 3), tmp_path) != entries[3]  # and the target itself


def test_the_ev_window_does_not_change_the_key_without_min_ev(base, tmp_path):
    """Without a target the phase runs its value_pretrain_steps whatever the window: the same critic,
    the same cache entry (no needless recomputation)."""
    entries = {w: entry(target(base, None, w), tmp_path) for w in (1, 3, 7)}
    assert len(set(entries.values())) == 1, entries


def test_a_window_of_one_keeps_the_key_from_before_the_window_existed(base, tmp_path):
    """ev_window 1 (the default: the last iteration's explained variance, the rule before the window
    existed) leaves the key as it was then, so critics cached with a target before stay found."""
    key = Keyed(target(base, 0.3, 1)).pretrain_key()
    assert key["value_pretrain_min_ev"] == 0.3
    assert "value_pretrain_ev_window" not in key
    assert Keyed(target(base, 0.3, 2)).pretrain_key()["value_pretrain_ev_window"] == 2


def test_the_key_follows_the_effective_samples_per_prompt(base, tmp_path):
    """Sibling: the key holds the samples per prompt the phase samples with: vapo.samples_per_prompt
    with group_sampling on, 1 with it off (then vapo.samples_per_prompt changes nothing)."""
    off = [c for c in base.components if c != "group_sampling"]
    with_groups = {k: merge(base, {"vapo": {"samples_per_prompt": k}}) for k in (4, 8)}
    without = {k: merge(base, {"components": off, "vapo": {"samples_per_prompt": k}}) for k in (4, 8)}
    assert [Keyed(c).samples_per_prompt for c in (*with_groups.values(), *without.values())] == [4, 8, 1, 1]
    assert entry(with_groups[4], tmp_path) != entry(with_groups[8], tmp_path)
    assert entry(without[4], tmp_path) == entry(without[8], tmp_path)
    assert Keyed(without[8]).pretrain_key()["samples_per_prompt"] == 1


# ----------------------------------------------------------------------------- the grid's W&B run
def write_report_folder(folder, cells) -> None:
    """A report folder as log_grid_run reads it: seeds.csv (row, seed, run) and each run's
    run_card.json; `cells`: (row, seed, card or None for no card at all)."""
    folder.mkdir(parents=True)
    with open(folder / "seeds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "seed", "run", "final"])
        for row, seed, card in cells:
            run = f"runs/{row}-s{seed}"
            w.writerow([row, seed, run, 50.0])
            if card is not None:
                (folder / run).mkdir(parents=True)
                (folder / run / "run_card.json").write_text(json.dumps(card))
    (folder / "table.md").write_text("# table\n")


def wandb_card(run_id, mode="offline", project="proj", group="grp") -> dict:
    return {"run_dir": "x", "wandb": {"id": run_id, "project": project, "group": group, "mode": mode}}


@pytest.fixture
def started(monkeypatch):
    """log_grid_run's call to summary_run, recorded (and no run started: it returns None)."""
    import vapo_lit.wandb_runs as wandb_runs

    calls = []

    def record(folder, **kw):
        calls.append(kw)
        return None

    monkeypatch.setattr(wandb_runs, "summary_run", record)
    return calls


MIXED = [
    ("vapo", 0, wandb_card("a0")),
    ("vapo", 1, {"run_dir": "x"}),  # a run card without a W&B record
    ("vapo", 2, None),  # no run card
    ("vapo-no-clip_higher", 0, {"run_dir": "x", "wandb": None}),
    ("vapo-no-clip_higher", 1, wandb_card("b1")),
    ("vapo-no-clip_higher", 3, wandb_card("b3")),
]


def test_cell_run_ids_lists_only_the_cells_with_a_wandb_record(tmp_path, started):
    from vapo_lit.report.grid_run import log_grid_run

    folder = tmp_path / "reports" / "g"
    write_report_folder(folder, MIXED)
    assert log_grid_run(folder) is None  # (the recorder starts no run)
    (call,) = started
    assert call["config"]["cell_run_ids"] == ["a0", "b1", "b3"]
    assert call["config"]["rows"] == ["vapo", "vapo-no-clip_higher"]  # every row, logged or not
    assert (call["project"], call["group"], call["kind"]) == ("proj", "grp", "report")


def test_no_grid_run_without_a_cell_in_wandb(tmp_path, started):
    from vapo_lit.report.grid_run import log_grid_run

    folder = tmp_path / "reports" / "g"
    write_report_folder(
        folder, [cell for cell in MIXED if not (cell[2] or {}).get("wandb")]
    )  # 3 cells, no record
    assert log_grid_run(folder) is None and started == []
    other = tmp_path / "reports" / "h"
    write_report_folder(other, MIXED)
    assert log_grid_run(other, mode="disabled") is None and started == []


@pytest.mark.parametrize(
    "modes, asked, want",
    [
        (["offline", "offline"], "auto", "offline"),  # like its cells: all offline, so offline
        (["offline", "online"], "auto", "auto"),  # one was online: online if logged in (summary_run decides)
        (["online", "online"], "auto", "auto"),
        (["offline", "offline"], "online", "online"),  # an explicit mode is kept
        (["online", "offline"], "offline", "offline"),
    ],
)
def test_the_grid_runs_mode_follows_its_cells(tmp_path, started, modes, asked, want):
    """Sibling: mode auto is offline when none of the logged cells was online (a grid run online
    linking to runs not uploaded yet would mislead); a cell without a record does not count."""
    from vapo_lit.report.grid_run import log_grid_run

    folder = tmp_path / "reports" / "g"
    cells = [("vapo", i, wandb_card(f"c{i}", mode=m)) for i, m in enumerate(modes)] + [
        ("vapo", 9, {"run_dir": "x"})
    ]
    write_report_folder(folder, cells)
    log_grid_run(folder, mode=asked)
    (call,) = started
    assert call["mode"] == want
