"""MkDocs hooks for the results pages (docs/results/<study>/index.md), each of which ends with its
committed report (`--8<-- "reports/<study>/table.md"`):

* `on_files`: the report's figures (reports/<study>/*.png) are served beside the results page, so
  the page's own `![...](score.png)` and the report's links resolve, without copying the images
  into docs/;
* `on_page_markdown`: the report is inserted here instead of by pymdownx.snippets, so that it can
  be fitted into the page: its headings are demoted below the page heading that introduces it (a
  page keeps one H1: the report's own "# Ablation ..." title becomes a subsection), and the figures
  its "Figures:" line links to are shown inline, as a gallery below that line. The report's text
  is otherwise inserted as committed.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]

INCLUDE = re.compile(r'^--8<-- "(reports/([^/"]+)/table\.md)"[ \t]*$', re.M)
HEADING = re.compile(r"^(#{1,6})([ \t].*)$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")
FIGURES = re.compile(r"^Figures?: .*$")
FIGURE_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+\.png)\)")


def on_files(files, config):
    for png in sorted((ROOT / "reports").glob("*/*.png")):
        if (ROOT / "docs" / "results" / png.parent.name / "index.md").is_file():
            files.append(
                File.generated(config, f"results/{png.parent.name}/{png.name}", abs_src_path=str(png))
            )
    return files


def _outside_fences(lines):
    """(index, line) of the lines outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield i, line


def heading_level_before(markdown: str, pos: int) -> int:
    """The level of the last ATX heading before `pos` (0: none)."""
    level = 0
    for _, line in _outside_fences(markdown[:pos].splitlines()):
        m = HEADING.match(line)
        if m:
            level = len(m.group(1))
    return level


def figure_gallery(line: str) -> str:
    """The figures a report's "Figures: [name](name.png), ..." line links to, as inline images with
    their names as captions, each a link to the full-size file."""
    items = [
        f'<figure markdown="span">\n[![{name}]({src}){{ loading=lazy }}]({src})\n'
        f"<figcaption>{name}</figcaption>\n</figure>"
        for name, src in FIGURE_LINK.findall(line)
    ]
    if not items:
        return ""
    return '\n\n<div class="report-figures" markdown>\n\n' + "\n\n".join(items) + "\n\n</div>\n"


def fit_report(text: str, shift: int) -> str:
    """The report as it sits in a page: headings `shift` levels deeper (at most H6), the figures of
    its "Figures:" lines shown inline after them; code blocks untouched."""
    lines = text.splitlines()
    for i, line in _outside_fences(lines):
        m = HEADING.match(line)
        if m and shift:
            lines[i] = "#" * min(6, len(m.group(1)) + shift) + m.group(2)
        elif FIGURES.match(line):
            lines[i] = line + figure_gallery(line)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def on_page_markdown(markdown, page, config, files):
    if not page.file.src_uri.startswith("results/"):
        return markdown

    def include(m: re.Match) -> str:
        path = ROOT / m.group(1)
        if not path.is_file():  # left to pymdownx.snippets, which fails the strict build naming the file
            return m.group(0)
        return fit_report(path.read_text(), heading_level_before(markdown, m.start()))

    return INCLUDE.sub(include, markdown)
