"""The report's "What the model wrote": episodes picked from the runs' samples.jsonl, by hand-made
samples whose choice can be checked by eye."""

from __future__ import annotations

import json

import pandas as pd

from report_synth import write_manifest, write_run
from vapo_lit.cli.report import main as report
from vapo_lit.report import transcripts


def sample(
    update, index, reward, *, phase="eval", response=None, calls=0, prompt="<user>What is 2+3?<assistant>"
):
    return {
        "iteration": update,
        "ppo_update": update,
        "phase": phase,
        "index": index,
        "prompt": prompt,
        "response": response if response is not None else f"u{update} i{index} r{reward}",
        "reward": reward,
        "verdict": {"reward": reward},
        "truncated": False,
        "response_tokens": 3,
        "observations": [],
        "tool_calls": [{"name": "calculator"}] * calls,
    }


def write_samples(run_dir, rows):
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_pick_takes_the_first_rewarded_and_unrewarded_episode_of_the_first_and_last_eval():
    rows = [
        sample(0, 1, 0.0),
        sample(0, 0, 0.0),
        sample(0, 2, 1.0),
        sample(3, 0, 1.0, phase="train"),
        sample(6, 0, 1.0),
        sample(6, 1, 1.0),
        sample(9, 3, 0.0),
        sample(9, 1, 1.0),
        sample(9, 2, 0.0),
    ]
    got = [(r["ppo_update"], r["index"]) for r in transcripts.pick(rows)]
    assert got == [(0, 2), (0, 0), (9, 1), (9, 2)]  # update 6 is neither first nor last; train rows never
    assert [(r["ppo_update"], r["index"]) for r in transcripts.pick([sample(0, 0, 0.0)])] == [(0, 0)]
    assert transcripts.pick([sample(0, 0, 1.0, phase="train")]) == []


def test_the_report_shows_the_lowest_seed_with_samples_and_leaves_the_rest_alone(tmp_path):
    out = tmp_path / "g"
    evals = {0: 0.25, 2: 0.5, 4: 0.75}
    cells = [
        (row, seed, write_run(out / "runs" / f"{row}-s{seed}", row, seed, evals, steps=4))
        for row in ("vapo", "vapo-no-clip_higher")
        for seed in range(2)
    ]
    write_manifest(out, "g", ["vapo", "vapo-no-clip_higher"], cells)
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    md = (out / "reports" / "g" / "table.md").read_text()
    assert "What the model wrote" not in md and not (out / "reports" / "g" / "transcripts.csv").exists()

    long = "x" * (transcripts.RESPONSE_CHARS + 5) + "~~~ fence"
    write_samples(
        out / "runs" / "vapo-s1", [sample(0, 0, 0.0, calls=1), sample(4, 0, 1.0, response=long, calls=2)]
    )
    write_samples(out / "runs" / "vapo-s0", [sample(0, 0, 1.0, response="seed zero")])
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    md = (out / "reports" / "g" / "table.md").read_text()
    section = md[md.index("## What the model wrote") :]
    assert "seed zero" in section and "u0 i0" not in section  # seed 0 is the lowest that kept samples
    assert "**VAPO (full)**, seed 0, eval at update 0: reward 1, 0 tool calls" in section
    frame = pd.read_csv(out / "reports" / "g" / "transcripts.csv")
    assert list(frame["row"]) == ["vapo"] and list(frame["seed"]) == [0]
    assert "**w/o clip_higher" not in section  # its runs kept no samples

    write_samples(out / "runs" / "vapo-s0", [])
    assert report([str(out), "--grid", "g", "--no-figures"]) == 0
    section = (out / "reports" / "g" / "table.md").read_text().split("## What the model wrote")[1]
    assert "reward 0, 1 tool call\n" in section and "eval at update 4: reward 1, 2 tool calls" in section
    assert "[... 14 more characters]" in section and "~~~~text" not in section  # cut before the fence
    assert section.count("~~~text") == 4  # prompt and response of each of the two episodes


def test_a_crash_cut_last_line_is_left_out_and_a_damaged_line_named(tmp_path):
    """A run still writing (or killed mid-write) leaves a partial last line: the report reads the
    complete rows, as the run itself does on resume; a damaged line elsewhere is refused by name."""
    import pytest

    rows = [sample(0, 0, 1.0), sample(0, 1, 0.0)]
    (tmp_path / "samples.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 1, "ph'
    )
    assert transcripts.read_samples(tmp_path) == rows
    (tmp_path / "samples.jsonl").write_text("not json\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(ValueError, match="samples.jsonl, line 1: not a sample"):
        transcripts.read_samples(tmp_path)
    assert transcripts.read_samples(tmp_path / "none") == []
