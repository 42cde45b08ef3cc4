"""The documentation stays true to the code: the generated reference pages (configuration, CLI, the
home page from README.md) are current, the README stays one screen of orientation, the algorithm's
specification lives in the repository, and the prose describes the software, not its history.
(`make docs` builds the site with `mkdocs build --strict`; CI runs it.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gen_docs  # noqa: E402

PROSE = [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# What narrates history: an issue number, a commit hash (hex with a letter and a digit), a dated or
# first-person account of how a result was obtained.
HISTORY = re.compile(
    r"\bissue[ -][0-9]+|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b|"
    r"\bI (did|had|ran|measured|changed|chose|then)\b|\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b|"
    r"\b[0-2][0-9]:[0-5][0-9] UTC\b"
)


@pytest.mark.parametrize("page", list(gen_docs.PAGES))
def test_generated_pages_are_current(page):
    want = gen_docs.PAGES[page]()
    path = ROOT / page
    assert path.is_file() and path.read_text() == want, (
        f"{page} is stale (the code or README.md changed); regenerate it with: {gen_docs.COMMAND}"
    )


def test_the_check_command_names_the_regeneration_command(tmp_path):
    """A stale page makes `gen_docs.py --check` fail and say how to regenerate it; nothing is written."""
    page = tmp_path / "docs" / "reference" / "cli.md"
    page.parent.mkdir(parents=True)
    page.write_text("old\n")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, 'tools'); import gen_docs; "
            f"gen_docs.ROOT = __import__('pathlib').Path({str(tmp_path)!r}); "
            "gen_docs.PAGES = {'docs/reference/cli.md': gen_docs.cli_page}; "
            "sys.exit(gen_docs.main(['--check']))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1, out.stderr
    assert "stale: docs/reference/cli.md; regenerate with: python tools/gen_docs.py" in out.stderr
    assert page.read_text() == "old\n"


def test_every_setting_and_flag_is_in_the_references():
    from vapo_lit.cli.train import build_parser
    from vapo_lit.config import walk_fields

    config = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert all(f"| `{path}` |" in config for path, _, _ in walk_fields())
    own = [
        a
        for a in build_parser()._actions
        if a.option_strings and not a.dest.startswith("set:") and a.dest != "help"
    ]
    assert own and all(f"`{a.option_strings[-1]}`" in cli for a in own)


def test_readme_is_short_and_the_spec_is_in_the_repository():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, (
        f"README.md has {len(lines)} lines; keep it under 200 (the rest belongs in docs/)"
    )
    assert (ROOT / "docs" / "algorithm.md").is_file()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    outside = [
        f
        for f in tracked
        if f.endswith((".py", ".md", ".yaml", ".yml", ".toml", ".cfg"))
        and (ROOT / f).is_file()
        and "../shared/" in (ROOT / f).read_text(errors="replace")
        and f != "tests/test_docs.py"
    ]
    assert not outside, f"these refer to ../shared/, outside the repository: {outside}"


def prose_lines(text: str):
    """(number, line) of the text outside code blocks: example output may show a hash-like run id."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            yield i, line


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_prose_describes_the_software_not_its_history(path):
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}"
        for i, line in prose_lines(path.read_text())
        if HISTORY.search(line)
    ]
    assert not hits, "history belongs in CHANGELOG.md:\n" + "\n".join(hits)


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path):
    """The README's Python example (configure, train, report), executed as written in a fresh folder:
    four smoke runs and the report with both rows."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    (tmp_path / "example.py").write_text(text[start : text.index("```", start)])
    out = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| VAPO (full) | 2 |" in out.stdout and "| ppo+token_level_loss+clip_higher | 2 |" in out.stdout
    assert (tmp_path / "runs" / "example" / "reports" / "runs" / "table.csv").is_file()
