"""The floors of vapo_lit hold: read from the source (every `import`, also those inside functions),
no module imports a module that imports it back, directly or through others, and no lower floor
imports the runner (`ablate/`), the command lines (`cli/`) or the reports (`report/`).

Importing `vapo_lit.a.b` from outside package `vapo_lit.a` runs `vapo_lit/a/__init__.py` too, so
it counts as importing `vapo_lit.a` as well (that is how `rollout.py` and `engines/` once formed a
cycle: rollout imported engines.fast_decode, engines/__init__ imported rollout).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vapo_lit"
UPPER = {
    "vapo_lit.cli": (),
    "vapo_lit.ablate": ("vapo_lit.cli", "vapo_lit.report"),
    "vapo_lit.report": ("vapo_lit.cli", "vapo_lit.ablate"),
}
"""The upper floors, each with the floors it may not import either (the report reads logs only)."""


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its source (packages included, see above)."""
    mods = modules(package)
    assert "vapo_lit" in mods, f"{package}: no vapo_lit package to read"

    def known(name: str) -> str:  # the module itself, or the package that defines the imported name
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(
                    f"{path}: relative import; write `from vapo_lit... import` (this test reads those)"
                )
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names if _inside(a.name, "vapo_lit")}
            elif isinstance(node, ast.ImportFrom) and _inside(node.module or "", "vapo_lit"):
                targets |= {known(f"{node.module}.{a.name}") for a in node.names}
        for t in list(targets):  # the packages above each target that `name` is not inside
            parts = t.split(".")
            targets |= {
                p for p in (".".join(parts[:i]) for i in range(2, len(parts))) if not _inside(name, p)
            }
        graph[name] = targets - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, targets in sorted(graph.items()):
        own = next((u for u in UPPER if _inside(name, u)), None)
        banned = UPPER[own] if own else tuple(UPPER)
        bad += [f"{name} imports {t}" for t in sorted(targets) if any(_inside(t, b) for b in banned)]
    return bad


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(import_graph())
    assert not found, "import cycles (each set imports itself back): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_no_lower_floor_imports_the_runner_the_cli_or_the_reports():
    bad = floor_violations(import_graph())
    assert not bad, "an import runs up a floor: " + "; ".join(bad)


def test_the_walk_sees_lazy_imports_and_package_imports(tmp_path):
    """The checks can fail: a lazy import inside a function closes a cycle through a package, and a
    lower module that imports ablate/ breaks a floor (loggers.py importing ablate.urls, as it would without
    vapo_lit/masking.py)."""
    pkg = tmp_path / "vapo_lit"
    for rel, text in {
        "__init__.py": "",
        "rollout.py": "def f():\n    from vapo_lit.engines.fast import g\n",
        "engines/__init__.py": "from vapo_lit.rollout import f\n",
        "engines/fast.py": "",
        "loggers.py": "import os\n\ndef w():\n    from vapo_lit.ablate.urls import scrub_argv\n",
        "ablate/__init__.py": "",
        "ablate/urls.py": "from vapo_lit.loggers import w\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    graph = import_graph(pkg)
    assert graph["vapo_lit.rollout"] == {"vapo_lit.engines", "vapo_lit.engines.fast"}
    assert sorted(cycles(graph)) == [
        ["vapo_lit.ablate.urls", "vapo_lit.loggers"],
        ["vapo_lit.engines", "vapo_lit.rollout"],
    ]
    assert floor_violations(graph) == [
        "vapo_lit.loggers imports vapo_lit.ablate",
        "vapo_lit.loggers imports vapo_lit.ablate.urls",
    ]
