"""Print a pip constraints file that pins every dependency in pyproject.toml to its lower bound
(`name>=X` becomes `name==X`), for `make test-lower`: the suite run there is what makes each lower
bound a tested one. Extras are stripped (constraints cannot carry them); a requirement without a
`>=` has no lower bound to pin and is skipped.

    python tools/lower_bounds.py [EXTRA ...] > constraints.txt   # [project.dependencies] + the extras
"""

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
REQ = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*>=\s*([^,;\s]+)")


def requirement_lists(text: str) -> dict[str, list[str]]:
    """The requirement arrays, by name: [project] `dependencies` and each optional extra. Read line by
    line (Python 3.10 has no tomllib), which holds for this file's layout: `name = [` opens an array,
    a `]` outside the quoted strings closes it."""
    lists: dict[str, list[str]] = {}
    section, current = "", None
    for raw in text.splitlines():
        line = raw.split("#")[0]
        if line.startswith("["):
            section = line.strip()
            continue
        opened = re.match(r"\s*([A-Za-z0-9_\-]+)\s*=\s*\[", line)
        if opened and (
            section == "[project.optional-dependencies]"
            or (section == "[project]" and opened.group(1) == "dependencies")
        ):
            current = lists.setdefault(opened.group(1), [])
            line = line[opened.end() :]
        if current is not None:
            current += re.findall(r'"([^"]+)"', line)
            if "]" in re.sub(r'"[^"]*"', "", line):
                current = None
    return lists


def lower_bounds(extras: list[str], text: str | None = None) -> dict[str, str]:
    """{package: lower bound} over [project.dependencies] and the named extras; where two lists bound
    the same package, the higher bound wins (the install needs both)."""
    lists = requirement_lists(PYPROJECT.read_text() if text is None else text)
    unknown = [e for e in extras if e not in lists or e == "dependencies"]
    if unknown:
        valid = sorted(k for k in lists if k != "dependencies")
        raise SystemExit(f"lower_bounds: unknown extra(s) {unknown}; valid: {valid}")
    bounds: dict[str, str] = {}
    for key in ["dependencies", *extras]:
        for req in lists[key]:
            m = REQ.match(req)
            if m:
                pkg, version = m.group(1).lower(), m.group(2)
                if pkg not in bounds or _key(version) > _key(bounds[pkg]):
                    bounds[pkg] = version
    return bounds


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


if __name__ == "__main__":
    for pkg, version in lower_bounds(sys.argv[1:]).items():
        print(f"{pkg}=={version}")
