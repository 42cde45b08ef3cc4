"""The full recipe and vanilla PPO reproduce their recorded metric histories (tests/golden.py):
every non-`perf/` column of every row, to float tolerance. A refactor of the iteration must keep
these; a change of the algorithm on purpose re-records them (`python tests/golden.py --record`)."""
from __future__ import annotations

import csv
import math

import pytest
from golden import RUNS, comparable, path_of, run


@pytest.mark.parametrize("label", list(RUNS))
def test_metric_history_matches_the_recorded_one(tmp_path, label):
    with open(path_of(label), newline="") as f:
        want = [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
    got = comparable(run(tmp_path, label))
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w), (w["step"], sorted(set(g) ^ set(w)))
        for key, expected in w.items():
            a, b = float(g[key]), float(expected)
            if math.isnan(b):
                assert math.isnan(a), (w["step"], key, a)
            else:
                assert a == pytest.approx(b, rel=1e-6, abs=1e-9), (w["step"], key, a, b)
