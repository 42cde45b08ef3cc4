"""A grid's confirmatory protocol, fixed before it runs and recorded in its manifest.

* The primary endpoint: the score each run is judged by, on which the report's paired deltas, Holm
  p-values and the comparison with the paper are computed. `final` is the last eval; `mean-last-K`
  the mean of the last K evals after training started (K >= 2), which averages K times as many eval
  samples and smooths the last eval's luck. New grids default to `mean-last-3`; a grid recorded
  before the protocol existed was reported on `final`, and keeps it.
* Tuning seeds: the seeds on which any of the grid's settings were chosen. A cell with such a seed is
  a tuning cell, the others are confirmation cells; the report warns when a row's deltas rest on
  tuning cells (settings picked on a seed flatter the row on that seed).

Only the standard library: the runner writes these, the report reads them back from the manifest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DEFAULT_ENDPOINT = "mean-last-3"
"""What a new grid is judged by unless its file or `--endpoint` says otherwise."""
RECORDED_BEFORE = "final"
"""The endpoint of a manifest that records none (grids run before the protocol): the last eval."""
TUNING, CONFIRMATION = "tuning", "confirmation"


@dataclass(frozen=True)
class Endpoint:
    """`last` = how many of the last evals after training started are averaged (1: `final`)."""

    last: int

    @property
    def name(self) -> str:
        """As written in grid files, on the command line and in the manifest."""
        return "final" if self.last == 1 else f"mean-last-{self.last}"

    @property
    def label(self) -> str:
        """The score's short name in table headers ('final', 'last-3')."""
        return "final" if self.last == 1 else f"last-{self.last}"

    @property
    def description(self) -> str:
        return "the last eval" if self.last == 1 else f"the mean of the last {self.last} evals"

    def score(self, trained: list[float]) -> float:
        """The endpoint of one run from its eval scores after training started, in order (NaN: none).
        A run with fewer evals (cut short) averages those it has; the report flags it as truncated."""
        tail = [s for s in trained if not math.isnan(s)][-self.last :]
        return sum(tail) / len(tail) if tail else math.nan


def parse_endpoint(text, where: str = "endpoint") -> Endpoint:
    """'final' or 'mean-last-K' (K >= 1; 'mean-last-1' is 'final')."""
    if isinstance(text, str):
        if text.strip() == "final":
            return Endpoint(1)
        m = re.fullmatch(r"mean-last-(\d+)", text.strip())
        if m and int(m.group(1)) >= 1:
            return Endpoint(int(m.group(1)))
    raise ValueError(
        f"{where}: {text!r} is not an endpoint; valid: final (the last eval) or mean-last-K (the mean of "
        f"the last K evals, K >= 2), e.g. {DEFAULT_ENDPOINT}"
    )


def parse_seeds(value, where: str = "tuning_seeds") -> list[int]:
    """A list of seeds (ints >= 0), or a comma-separated string of them and ranges ('0-2,5'); 'none' or
    an empty list: no tuning seeds."""
    if value is None:
        return []
    if isinstance(value, str):
        items = [] if value.strip().lower() in ("", "none") else value.split(",")
        out = []
        for item in items:
            lo, sep, hi = item.strip().partition("-")
            if not (lo.isdigit() and (not sep or hi.isdigit())) or (sep and int(hi) < int(lo)):
                raise ValueError(
                    f"{where}: {item.strip()!r} is not a seed or a range; give seeds >= 0 like 0,1,2 or "
                    "0-2 (or none)"
                )
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
        return sorted(set(out))
    if isinstance(value, list) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value
    ):
        return sorted(set(value))
    raise ValueError(
        f"{where}: {value!r} is not a list of seeds; give seeds >= 0 like [0, 1, 2] (or [] for none)"
    )


def role(seed: int, tuning_seeds: list[int]) -> str:
    return TUNING if seed in tuning_seeds else CONFIRMATION
