"""MkDocs hook: the committed reports' figures (reports/<study>/*.png) are served beside their
results page (docs/results/<study>/index.md), so the tables included there link to them and the
pages show them, without copying the images into docs/."""
from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for png in sorted((ROOT / "reports").glob("*/*.png")):
        if (ROOT / "docs" / "results" / png.parent.name / "index.md").is_file():
            files.append(File.generated(config, f"results/{png.parent.name}/{png.name}", abs_src_path=str(png)))
    return files
