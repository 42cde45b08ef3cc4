"""The documentation renders as written: formulas reach MathJax intact (never turned into emphasis by
Markdown), every built page has one H1, the results pages show their report's figures inline and
every image they show exists in the built site, and wide tables can scroll.

Two levels: the formula pages rendered with the `markdown` library and the Markdown extensions of
mkdocs.yml (fast), and one `mkdocs build` of the whole site into a temporary folder (module
fixture) for what only the site shows (the hooks, the generated pages, the API pages)."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# The pages written in LaTeX notation ($...$ inline, $$...$$ display).
MATH_PAGES = ["algorithm.md", "guides/critic.md", "guides/scaling-out.md"]
# ASCII formula notation that the LaTeX pages must not fall back to, outside code and math.
ASCII_MATH = re.compile(r"\b(gamma|lambda|alpha|delta|eps|mu)(_\w+)?\b|\b\w+\*\w+\b|\^\(|\bV\*")
# Inside emphasis, what only a formula has: an operator, a bracket or a Greek letter's name.
FORMULA_IN_EM = re.compile(r"[=()/^+<>\\]|\b(gamma|lambda|alpha|eps|ratio|delta)\b")


def mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use tags such as !!python/name or !ENV; their values do not matter here.
    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def render(page: str) -> str:
    """docs/<page> as HTML, with mkdocs.yml's markdown_extensions and their settings."""
    import markdown

    names, configs = [], {}
    for ext in mkdocs_config()["markdown_extensions"]:
        name, config = next(iter(ext.items())) if isinstance(ext, dict) else (ext, None)
        names.append(name)
        if config:
            configs[name] = dict(config)
    if "pymdownx.snippets" in configs:  # its base_path is relative to the repository root
        configs["pymdownx.snippets"]["base_path"] = [
            str(ROOT / p) for p in configs["pymdownx.snippets"]["base_path"]
        ]
    return markdown.Markdown(extensions=names, extension_configs=configs).convert((DOCS / page).read_text())


def without_code(text: str) -> str:
    """The Markdown source without fenced code blocks and inline code spans."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def source_formulas(text: str) -> tuple[list[str], list[str]]:
    """(inline, display) formulas of a Markdown source, whitespace collapsed."""
    text = without_code(text)
    display = re.findall(r"\$\$(.+?)\$\$", text, flags=re.S)
    text = re.sub(r"\$\$.+?\$\$", "", text, flags=re.S)
    inline = re.findall(r"\$(?!\s)((?:[^$\n]|\n(?![ \t]*\n))+?)(?<!\s)\$", text)
    return [squash(f) for f in inline], [squash(f) for f in display]


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def rendered_formulas(page_html: str) -> tuple[list[str], list[str]]:
    """(inline, display) formulas as arithmatex left them for MathJax: \\( ... \\) in a span, \\[ ... \\]
    in a div, unescaped."""
    inline = re.findall(r'<span class="arithmatex">\\\((.*?)\\\)</span>', page_html, flags=re.S)
    display = re.findall(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', page_html, flags=re.S)
    return [squash(html.unescape(f)) for f in inline], [squash(html.unescape(f)) for f in display]


def emphasis(page_html: str) -> list[str]:
    return [
        html.unescape(re.sub(r"<[^>]+>", "", m)) for m in re.findall(r"<em>(.*?)</em>", page_html, flags=re.S)
    ]


@pytest.mark.parametrize("page", MATH_PAGES)
def test_every_formula_reaches_mathjax_intact(page):
    """Each $...$ and $$...$$ of the source comes out as one arithmatex element holding exactly its
    TeX (so no * or _ of a formula became emphasis), and no emphasis on the page holds a formula."""
    inline, display = source_formulas((DOCS / page).read_text())
    assert inline, f"{page} has no $...$ formula"
    out = render(page)
    got_inline, got_display = rendered_formulas(out)
    assert sorted(got_inline) == sorted(inline)
    assert sorted(got_display) == sorted(display)
    bad = [e for e in emphasis(out) if FORMULA_IN_EM.search(e)]
    assert not bad, f"{page}: formulas turned into emphasis: {bad}"
    # A display formula inside a list item must not end the list or swallow the next item.
    items = [
        line
        for line in without_code((DOCS / page).read_text()).splitlines()
        if re.match(r"[ \t]*[-*] ", line)
    ]
    assert out.count("<li>") == len(items), (
        f"{page}: {len(items)} list items in the source, {out.count('<li>')} rendered"
    )


@pytest.mark.parametrize("page", MATH_PAGES)
def test_formula_pages_use_one_notation(page):
    """Outside code and math, no ASCII formula (gamma*lambda, lambda_policy, V*) and no Unicode
    math operator: the pages write formulas in LaTeX only."""
    text = without_code((DOCS / page).read_text())
    text = re.sub(r"\$\$.+?\$\$|\$[^$]+\$", "", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets (results/critic-alpha/...)
    hits = [
        line.strip() for line in text.splitlines() if ASCII_MATH.search(line) or re.search(r"[²∑∏√≤≥≠]", line)
    ]
    assert not hits, f"{page}: formulas outside LaTeX notation:\n" + "\n".join(hits)


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_included_report_is_demoted_below_the_page_heading_and_shows_its_figures():
    hooks = load_hooks()
    report = (
        "# Ablation `x`\n\ntext\n\n## Paired deltas\n\n```text\n# not a heading\n```\n\n"
        "Figures: [score](score.png), [entropy](entropy.png); value bias in `calibration.csv`.\n"
    )
    page = "# Study\n\n## The committed report\n\n"
    assert hooks.heading_level_before(page, len(page)) == 2
    out = hooks.fit_report(report, 2)
    assert out.startswith("### Ablation `x`\n") and "\n#### Paired deltas\n" in out
    assert "\n# not a heading\n" in out  # code blocks stay as they are
    assert "[![score](score.png){ loading=lazy }](score.png)" in out
    assert "[![entropy](entropy.png){ loading=lazy }](entropy.png)" in out
    assert hooks.fit_report("###### deep\n", 2) == "###### deep\n"


# ---------------------------------------------------------------------------------------------------
# The built site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    # --no-strict so that the other tests can look at a site that a warning would fail; the first
    # test below asserts there is none.
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--no-strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stderr


def pages(site_dir: Path):
    return sorted(p for p in site_dir.rglob("*.html") if p.name != "404.html")


def test_the_site_builds_without_warnings(site):
    """What `mkdocs build --strict` (make docs, CI) would fail on: a broken link or image, a missing
    snippet, a page left out of the navigation."""
    _, log = site
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)


def test_every_page_has_one_h1(site):
    site_dir, _ = site
    counts = {
        str(p.relative_to(site_dir)): len(re.findall(r"<h1[\s>]", p.read_text())) for p in pages(site_dir)
    }
    assert len(counts) > 20
    assert {k: v for k, v in counts.items() if v != 1} == {}


def test_results_pages_show_their_report_figures_and_every_image_exists(site):
    site_dir, _ = site
    studies = sorted(p.parent.name for p in (DOCS / "results").glob("*/index.md"))
    assert studies
    for study in studies:
        page = site_dir / "results" / study / "index.html"
        shown = re.findall(r'<img[^>]*\bsrc="([^"]+)"', page.read_text())
        figures_line = next(
            (
                line
                for line in (ROOT / "reports" / study / "table.md").read_text().splitlines()
                if line.startswith("Figures:")
            ),
            "",
        )
        listed = re.findall(r"\]\(([^)]+\.png)\)", figures_line)
        assert listed, f"reports/{study}/table.md has no Figures: line"
        missing = [f for f in listed if f not in shown]
        assert not missing, f"results/{study}: figures linked but not shown inline: {missing}"
        unresolved = [src for src in shown if not (page.parent / src).resolve().is_file()]
        assert not unresolved, f"results/{study}: images that are not in the built site: {unresolved}"


def test_no_formula_turns_into_emphasis_anywhere(site):
    """Generated pages (CLI, configuration) and API pages included: an ASCII formula with two
    asterisks (i*K..(i+1)*K-1) must not become <em>."""
    site_dir, _ = site
    bad = {
        str(p.relative_to(site_dir)): hits
        for p in pages(site_dir)
        if (hits := [e for e in emphasis(p.read_text()) if FORMULA_IN_EM.search(e)])
    }
    assert bad == {}


def test_the_formula_pages_load_mathjax(site):
    site_dir, _ = site
    page = (site_dir / "algorithm" / "index.html").read_text()
    scripts = re.findall(r'<script src="([^"]+)"', page)
    config = [s for s in scripts if s.endswith("javascripts/mathjax.js")]
    assert config and (site_dir / "algorithm" / config[0]).resolve().is_file()
    assert any("mathjax" in s and s.endswith(".js") and s != config[0] for s in scripts)
    assert scripts.index(config[0]) < next(i for i, s in enumerate(scripts) if "mathjax@" in s)
    assert 'class="arithmatex"' in page


def test_wide_tables_scroll_inside_their_box():
    """Material wraps each table in .md-typeset__scrollwrap (overflow-x: auto); the site's own CSS
    must not cut a table off (overflow hidden or clip) or let it spill (visible) instead."""
    css = (DOCS / "stylesheets" / "extra.css").read_text()
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        if re.search(r"\btable\b|scrollwrap|__table", selector):
            assert not re.search(r"overflow(-x)?\s*:\s*(hidden|clip|visible)", body), selector.strip()
            assert not re.search(r"white-space\s*:\s*nowrap", body) or "code" in selector, selector.strip()
    assert re.search(r"\.md-typeset__scrollwrap\s*\{[^}]*overflow-x\s*:\s*auto", css)
