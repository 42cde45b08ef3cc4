"""The samples.jsonl format's reader, for the run that appends to it (vapo_lit/samples.py) and the
report that shows from it (vapo_lit/report/transcripts.py); stdlib only, so a report never loads torch."""

from __future__ import annotations

import json
from pathlib import Path


def read_lines(path: Path) -> tuple[list[str], str | None]:
    """(the complete lines of a samples.jsonl, what was dropped): only the last line can be cut by a
    crash (lines are appended whole and in order); any other line that is not a JSON object with an
    iteration is a ValueError naming the file and line."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    dropped = f"a partial last line ({len(tail.encode())} bytes)" if tail else None
    for i, line in enumerate(lines, 1):
        try:
            ok = isinstance(json.loads(line).get("iteration"), int)
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(
                f"{path}, line {i}: not a sample (a JSON object with an integer iteration); the file was "
                "changed by hand or damaged (move it aside to start it over)"
            )
    return lines, dropped


def read_rows(path: Path) -> list[dict]:
    """The complete sample rows of a samples.jsonl (a crash-cut last line left out; a damaged line is
    read_lines' ValueError)."""
    return [json.loads(line) for line in read_lines(path)[0]]
