"""Mutation testing of the wiring: plant one small bug at a time, run the tests that should notice,
and report the mutants no test killed.

    make mutate                                        # every target below (an hour or more on 2 cores)
    python tools/mutate.py vapo_lit/passes.py          # only these files
    python tools/mutate.py --list                      # print the mutants, run nothing
    python tools/mutate.py --sample 150 --seed 0       # a fixed random subset (a quick estimate)
    python tools/mutate.py --jobs 2 --timeout 240      # two mutants at a time; per-mutant limit (s)

Mutants are written into a scratch copy of `vapo_lit/` and `tests/` (under a temporary folder),
never into the working tree, and the copy's file is restored after every mutant (also on Ctrl-C,
which prints the results so far). Each mutant runs only the tests mapped to its file in `TARGETS`,
fastest first, stopping at the first failure (`pytest -x`); a mutant that fails a test, crashes an
import or runs past the timeout is killed. A process that has already imported torch, Lightning and
transformers forks one child per mutant, so a mutant costs its tests, not the imports.

Operators (on the AST, rewritten in place in the source so the other lines keep their numbers):
arithmetic and comparison swaps, a dropped right operand, and/or swaps and dropped operands,
removed `not`/unary minus, both branches of a conditional expression, `if` tests forced True/False,
numeric constants +-1 (floats also halved), True/False, paired string switches ('token'/'sample',
'terminal'/'bootstrap', ...), slice bounds +-1, a dropped keyword argument, two adjacent positional
arguments swapped, and a deleted call statement, augmented assignment, `continue` or `break`.
Not mutated: docstrings, error messages (raise/assert/f-strings), annotations, decorators.

Survivors judged equivalent (they cannot change behaviour) are listed in `tools/mutate_equivalent.txt`
with the reason; the score is killed / (mutants - equivalent).
"""

from __future__ import annotations

import argparse
import ast
import copy
import fnmatch
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGETS: dict[str, tuple[tuple[str, ...] | None, list[str]]] = {
    "vapo_lit/algos/advantage.py": (
        None,
        ["tests/test_gae.py", "tests/test_algos_paths.py", "tests/test_stages.py"],
    ),
    "vapo_lit/algos/losses.py": (
        None,
        ["tests/test_losses.py", "tests/test_algos_paths.py", "tests/test_updates.py"],
    ),
    "vapo_lit/algos/stats.py": (
        None,
        ["tests/test_losses.py", "tests/test_algos_paths.py", "tests/test_stages.py"],
    ),
    "vapo_lit/experience.py": (
        None,
        [
            "tests/test_stages.py",
            "tests/test_components.py",
            "tests/test_updates.py",
            "tests/test_module.py",
            "tests/test_golden.py",
        ],
    ),
    "vapo_lit/passes.py": (
        None,
        [
            "tests/test_stages.py",
            "tests/test_updates.py",
            "tests/test_engines.py",
            "tests/test_module.py",
            "tests/test_golden.py",
        ],
    ),
    "vapo_lit/module.py": (
        None,
        ["tests/test_components.py", "tests/test_updates.py", "tests/test_module.py", "tests/test_golden.py"],
    ),
    "vapo_lit/update_stats.py": (
        None,
        ["tests/test_updates.py", "tests/test_components.py", "tests/test_module.py", "tests/test_golden.py"],
    ),
    "vapo_lit/components/*.py": (
        None,
        ["tests/test_components.py", "tests/test_updates.py", "tests/test_module.py", "tests/test_golden.py"],
    ),
    "vapo_lit/ablate/store.py": (
        (
            "CellStore.claim",
            "CellStore._lowest_live",
            "CellStore.complete",
            "CellStore.fail",
            "CellStore.release",
            "CellStore.fail_stale",
            "CellStore._transition",
        ),
        ["tests/test_claim.py", "tests/test_ablate.py::test_store_claim_protocol_duplicates_and_stale_retry"],
    ),
}
"""Target files (globs) -> (the functions mutated there, None: all of it; the tests that should kill
its mutants, fastest first; a test file that does not exist yet is left out)."""
DESELECT = ("tests/test_module.py::test_run_card_and_wandb_offline_run_on_disk",)
"""Tests never run for a mutant: they check logging, not wiring, and the W&B offline file read back
by this one was seen to miss its run record when the CPU is heavily oversubscribed (a flaky kill
would count a mutant as caught)."""
EQUIVALENT = Path(__file__).with_name("mutate_equivalent.txt")
PREIMPORT = (
    "torch",
    "numpy",
    "lightning",
    "lightning.pytorch",
    "transformers",
    "safetensors",
    "optuna",
    "sqlalchemy",
    "yaml",
    "pandas",
    "matplotlib",
    "wandb",
    "hypothesis",
    "pytest",
)

SWAPS = {
    "token": "sample",
    "sample": "token",
    "terminal": "bootstrap",
    "bootstrap": "terminal",
    "gae": "grpo",
    "grpo": "gae",
    "targets": "mc",
    "mc": "targets",
    "position": "length",
    "length": "position",
}
BINOPS = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
CMPOPS = {
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.Lt: [ast.LtE, ast.Gt],
    ast.LtE: [ast.Lt, ast.GtE],
    ast.Gt: [ast.GtE, ast.Lt],
    ast.GtE: [ast.Gt, ast.LtE],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
}
PLAIN_CALLS = {
    "float",
    "int",
    "bool",
    "str",
    "len",
    "range",
    "isinstance",
    "getattr",
    "setattr",
    "hasattr",
    "print",
    "dict",
    "list",
    "tuple",
    "set",
    "zip",
    "sum",
    "max",
    "min",
    "sorted",
    "enumerate",
    "repr",
    "type",
    "super",
    "iter",
    "next",
    "any",
    "all",
    "abs",
    "round",
}


# ----------------------------------------------------------------------------- mutants
@dataclass
class Mutant:
    path: str  # relative to the repo root
    line: int
    where: str  # the enclosing function (qualified), or "<module>"
    what: str  # "`old` -> `new`"
    source: str  # the whole mutated file

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.where, self.what)


def _seg(node) -> tuple[int, int, int, int]:
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset


class _Planter(ast.NodeVisitor):
    """Collects (node span, replacement text, description) edits; the caller turns them into files."""

    def __init__(self, src: str, scope):
        self.src, self.scope = src, scope
        self.stack: list[str] = []
        self.edits: list[tuple[tuple[int, int, int, int], str, str, str]] = []

    # -- helpers
    def text(self, node) -> str:
        return ast.get_source_segment(self.src, node) or ast.unparse(node)

    def in_scope(self) -> bool:
        if self.scope is None:
            return True
        here = ".".join(self.stack)
        return any(here == s or here.startswith(s + ".") for s in self.scope)

    def add(self, node, new_text: str, what: str | None = None) -> None:
        if self.in_scope():
            old = self.text(node)
            desc = what or f"`{_short(old)}` -> `{_short(new_text)}`"
            self.edits.append((_seg(node), new_text, desc, ".".join(self.stack) or "<module>"))

    def replaced(self, node, **changes) -> str:
        new = copy.deepcopy(node)
        for k, v in changes.items():
            setattr(new, k, v)
        return "(" + ast.unparse(new) + ")"

    # -- scopes and skipped subtrees
    def _scoped(self, node):
        self.stack.append(node.name)
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body = body[1:]  # the docstring
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == "__repr__":
                self.stack.pop()
                return
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                self.visit(d)
        for stmt in body:
            self.visit(stmt)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Raise(self, node):
        pass

    def visit_Assert(self, node):
        pass

    def visit_JoinedStr(self, node):
        pass

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)

    def visit_Assign(self, node):
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        if any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets) and self.stack:
            self.add(node, "pass", f"delete `{_short(self.text(node))}`")
        self.generic_visit(node)

    # -- statements
    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call):
            f = node.value.func
            if not (isinstance(f, ast.Attribute) and f.attr in ("warn", "filterwarnings", "simplefilter")):
                self.add(node, "pass", f"delete `{_short(self.text(node))}`")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.add(node, "pass", f"delete `{_short(self.text(node))}`")
        if type(node.op) in BINOPS:
            new = copy.deepcopy(node)
            new.op = BINOPS[type(node.op)]()
            self.add(node, ast.unparse(new))
        self.generic_visit(node)

    def visit_Continue(self, node):
        self.add(node, "pass", "delete `continue`")

    def visit_Break(self, node):
        self.add(node, "pass", "delete `break`")

    def visit_If(self, node):
        for forced in ("True", "False"):
            self.add(node.test, forced, f"`if {_short(self.text(node.test))}` -> `if {forced}`")
        self.generic_visit(node)

    # -- expressions
    def visit_BinOp(self, node):
        op = type(node.op)
        if op in BINOPS:
            self.add(node, self.replaced(node, op=BINOPS[op]()))
        if op in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            self.add(node, "(" + self.text(node.left) + ")")
        self.generic_visit(node)

    def visit_Compare(self, node):
        for i, op in enumerate(node.ops):
            for alt in CMPOPS.get(type(op), []):
                ops = list(node.ops)
                ops[i] = alt()
                self.add(node, self.replaced(node, ops=ops))
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self.add(node, self.replaced(node, op=other))
        for i in range(len(node.values)):
            rest = node.values[:i] + node.values[i + 1 :]
            self.add(
                node, self.replaced(node, values=rest) if len(rest) > 1 else "(" + self.text(rest[0]) + ")"
            )
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, (ast.Not, ast.USub, ast.Invert)) and not isinstance(
            node.operand, ast.Constant
        ):
            self.add(node, "(" + self.text(node.operand) + ")")
        self.generic_visit(node)

    def visit_IfExp(self, node):
        self.add(node, "(" + self.text(node.body) + ")")
        self.add(node, "(" + self.text(node.orelse) + ")")
        self.generic_visit(node)

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            self.add(node, repr(not v))
        elif isinstance(v, int):
            for new in sorted({v + 1, v - 1, 0 if v != 0 else 1} - {v}):
                if new >= 0 or v < 0:
                    self.add(node, repr(new))
        elif isinstance(v, float):
            for new in sorted({v + 1.0, v / 2} - {v}):
                self.add(node, repr(new))
        elif isinstance(v, str) and v in SWAPS:
            self.add(node, repr(SWAPS[v]))

    def visit_Slice(self, node):
        for part in (node.lower, node.upper):
            if part is not None and not isinstance(part, (ast.Constant, ast.UnaryOp, ast.BinOp)):
                for d in ("+ 1", "- 1"):
                    self.add(part, f"({self.text(part)} {d})")
        self.generic_visit(node)

    def visit_Call(self, node):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in PLAIN_CALLS:
            for i, kw in enumerate(node.keywords):
                if kw.arg is not None:
                    self.add(
                        node,
                        self.replaced(node, keywords=node.keywords[:i] + node.keywords[i + 1 :]),
                        f"drop `{kw.arg}=` in `{_short(self.text(node))}`",
                    )
            args = node.args
            for i in range(len(args) - 1):
                if not any(isinstance(a, ast.Starred) for a in (args[i], args[i + 1])) and ast.dump(
                    args[i]
                ) != ast.dump(args[i + 1]):
                    swapped = args[:i] + [args[i + 1], args[i]] + args[i + 2 :]
                    self.add(
                        node,
                        self.replaced(node, args=swapped),
                        f"swap `{_short(self.text(args[i]))}`, `{_short(self.text(args[i + 1]))}` "
                        f"in `{_short(self.text(node))}`",
                    )
        self.generic_visit(node)


def _short(s: str, n: int = 70) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _apply(src: str, span, new_text: str) -> str:
    """Replace the (1-based line, utf-8 byte column) span of `src` with `new_text`."""
    data = src.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    l0, c0, l1, c1 = span
    a, b = starts[l0 - 1] + c0, starts[l1 - 1] + c1
    return (data[:a] + new_text.encode() + data[b:]).decode()


def mutants_of(path: str, scope) -> list[Mutant]:
    src = (ROOT / path).read_text()
    tree = ast.parse(src)
    planter = _Planter(src, scope)
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the module docstring
        planter.visit(stmt)
    original = ast.dump(tree)
    out, seen = [], set()
    for span, new_text, what, where in planter.edits:
        mutated = _apply(src, span, new_text)
        try:
            dumped = ast.dump(ast.parse(mutated))
        except SyntaxError:
            continue
        if dumped == original or dumped in seen:
            continue
        seen.add(dumped)
        out.append(Mutant(path, span[0], where, what, mutated))
    return out


def targets(selected: list[str]) -> list[tuple[str, tuple | None, list[str]]]:
    out = []
    for pattern, (scope, tests) in TARGETS.items():
        for p in sorted(ROOT.glob(pattern)):
            rel = str(p.relative_to(ROOT))
            if p.name == "__init__.py" and "components" not in rel:
                continue
            if selected and not any(fnmatch.fnmatch(rel, s) or rel == s for s in selected):
                continue
            out.append((rel, scope, [t for t in tests if (ROOT / t.split("::")[0]).is_file()]))
    return out


def load_equivalent() -> dict[tuple[str, str, str], str]:
    """tools/mutate_equivalent.txt: `path | function | mutation | reason` per line."""
    out = {}
    if EQUIVALENT.is_file():
        for line in EQUIVALENT.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                path, where, what, reason = (s.strip() for s in line.split(" | ", 3))
                out[(path, where, what)] = reason
    return out


# ----------------------------------------------------------------------------- running
class Scratch:
    """A copy of vapo_lit/ and tests/ in which one file at a time is mutated, then restored from the
    copy's own pristine bytes (edits to the working tree during a run change nothing here)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="vapo-mutate-"))
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
        for d in ("vapo_lit", "tests"):
            shutil.copytree(ROOT / d, self.dir / d, ignore=ignore)
        shutil.copy2(ROOT / "pyproject.toml", self.dir / "pyproject.toml")
        self.pristine: dict[str, tuple[bytes, int]] = {}

    def write(self, rel: str, text: str) -> None:
        p = self.dir / rel
        if rel not in self.pristine:
            self.pristine[rel] = (p.read_bytes(), p.stat().st_mtime_ns)
        p.write_text(text)
        t = time.time()
        os.utime(p, (t, t))

    def restore(self, rel: str) -> None:
        data, mtime = self.pristine[rel]
        p = self.dir / rel
        p.write_bytes(data)
        os.utime(p, ns=(mtime, mtime))  # the original mtime: its .pyc (if any) stays valid

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _child(scratch: Path, tests: list[str], log: Path) -> None:
    """In the forked child: run pytest on the scratch copy, exit with its status."""
    os.setpgid(0, 0)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(scratch)
    os.environ["PYTHONPATH"] = str(scratch)
    sys.path.insert(0, str(scratch))
    sys.dont_write_bytecode = True
    import pytest

    deselect = [a for t in DESELECT for a in ("--deselect", t)]
    rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *deselect, *tests])
    os._exit(int(rc))


class Runner:
    def __init__(self):
        self.running: dict[int, tuple] = {}  # pid -> (job, started, log, timeout)

    def start(self, job, scratch: Path, tests: list[str], log: Path, timeout: float = float("inf")) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _child(scratch, tests, log)
            finally:
                os._exit(99)
        self.running[pid] = (job, time.monotonic(), log, timeout)

    def wait_one(self):
        """(job, status, seconds) of a finished (or timed-out) child; status: killed/survived/timeout/error."""
        while True:
            for pid, (job, started, log, timeout) in list(self.running.items()):
                done, code = os.waitpid(pid, os.WNOHANG)
                elapsed = time.monotonic() - started
                if done:
                    del self.running[pid]
                    rc = os.waitstatus_to_exitcode(code)
                    status = {0: "survived", 5: "error"}.get(rc, "killed")
                    return job, status, elapsed, log
                if elapsed > timeout:
                    _kill_group(pid)
                    os.waitpid(pid, 0)
                    del self.running[pid]
                    return job, "timeout", elapsed, log
            time.sleep(0.05)

    def stop_all(self) -> None:
        for pid in list(self.running):
            _kill_group(pid)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.running.clear()


def _kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _preimport() -> None:
    import importlib
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_MODE", "disabled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PREIMPORT:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an optional library: the child imports it itself
                pass
        try:  # transformers' lazy modules: load the tiny test models' classes now
            from transformers import AutoModel, LlamaConfig, LlamaForCausalLM  # noqa: F401
        except Exception:  # noqa: BLE001
            pass
    import torch

    torch.set_num_threads(1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("files", nargs="*", help="only these target files (globs; default: every target)")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--sample", type=int, default=0, help="run a random subset of this many mutants")
    ap.add_argument("--seed", type=int, default=0, help="seed of --sample")
    ap.add_argument(
        "--jobs", type=int, default=1, help="mutants run at a time (each in its own scratch copy)"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 3 x the unmutated run of its tests + 30)",
    )
    ap.add_argument("--report", type=Path, default=None, help="also write the results here (TSV)")
    args = ap.parse_args(argv)

    plan = targets(args.files)
    if not plan:
        ap.error(f"no target matches {args.files}; targets: {', '.join(TARGETS)}")
    mutants: list[tuple[Mutant, list[str]]] = []
    for path, scope, tests in plan:
        if not tests:
            print(f"{path}: no mapped test file exists; skipped", file=sys.stderr)
            continue
        mutants += [(m, tests) for m in mutants_of(path, scope)]
    if args.sample and args.sample < len(mutants):
        mutants = random.Random(args.seed).sample(mutants, args.sample)
        mutants.sort(key=lambda mt: (mt[0].path, mt[0].line))
    if args.list:
        for m, tests in mutants:
            print(f"{m.path}:{m.line} [{m.where}] {m.what}")
        print(f"{len(mutants)} mutants")
        return 0
    equivalent = load_equivalent()

    _preimport()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill PID` stops as cleanly as Ctrl-C
    scratches = [Scratch() for _ in range(max(1, args.jobs))]
    runner = Runner()
    results: list[tuple[Mutant, str, float]] = []
    killed_by: dict[tuple, str] = {}
    busy: dict[int, str] = {}  # scratch index -> file mutated there

    def restore_all():
        for i, rel in list(busy.items()):
            scratches[i].restore(rel)
            busy.pop(i)

    interrupted = False
    t_start = time.monotonic()
    try:
        # the unmutated tests must pass; their time sets the per-mutant timeout
        baseline: dict[tuple[str, ...], float] = {}
        for tests in {tuple(t) for _, t in mutants}:
            runner.start(
                ("baseline", tests), scratches[0].dir, list(tests), scratches[0].dir / "baseline.log"
            )
            (_, tests_), status, secs, log = runner.wait_one()
            if status != "survived":
                text = log.read_text()
                errors = "\n".join(
                    line for line in text.splitlines() if line.startswith(("E ", "FAILED", "ERROR"))
                )
                print(f"the unmutated tests fail ({' '.join(tests)}); fix them first:\n{errors[-6000:]}")
                return 2
            baseline[tests] = secs
            print(f"baseline {secs:6.1f}s  {' '.join(tests)}", flush=True)
        queue = list(mutants)
        n = len(queue)
        while queue or runner.running:
            while queue and len(runner.running) < len(scratches):
                i = next(k for k in range(len(scratches)) if k not in busy)
                m, tests = queue.pop(0)
                scratches[i].write(m.path, m.source)
                busy[i] = m.path
                limit = args.timeout or 3 * baseline[tuple(tests)] + 30
                runner.start((m, i), scratches[i].dir, tests, scratches[i].dir / "mutant.log", limit)
            (m, i), status, secs, log = runner.wait_one()
            scratches[i].restore(m.path)
            busy.pop(i)
            if status == "survived" and m.key in equivalent:
                status = "equivalent"
            results.append((m, status, secs))
            killed_by[m.key] = _first_failure(log) if status == "killed" else ""
            mark = {"killed": ".", "timeout": "T", "survived": "S", "equivalent": "e", "error": "E"}[status]
            by = f"  <- {killed_by[m.key]}" if killed_by[m.key] else ""
            print(f"[{len(results):4d}/{n}] {mark} {secs:5.1f}s {m.path}:{m.line} {m.what}{by}", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the running mutant, restoring the scratch copy", flush=True)
    finally:
        runner.stop_all()
        restore_all()
        for s in scratches:
            s.remove()
    summarize(results, equivalent, time.monotonic() - t_start, interrupted, args.report, killed_by)
    return 130 if interrupted else 0


def _first_failure(log: Path) -> str:
    """The first failing test of a pytest log ('' when none is named, e.g. an import error)."""
    try:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(("FAILED ", "ERROR ")):
                return line.split(" ")[1]
    except OSError:
        pass
    return ""


def summarize(
    results, equivalent, seconds: float, interrupted: bool, report: Path | None, killed_by=None
) -> None:
    if not results:
        print("no mutant was run")
        return
    by_file: dict[str, dict[str, int]] = {}
    for m, status, _ in results:
        by_file.setdefault(m.path, {}).setdefault(status, 0)
        by_file[m.path][status] += 1
    print(
        f"\n{'file':40s} {'mutants':>7s} {'killed':>7s} {'timeout':>7s} {'equiv':>6s} {'surv':>5s} {'score':>6s}"
    )
    tot = {"n": 0, "killed": 0, "timeout": 0, "equivalent": 0, "survived": 0, "error": 0}
    for path, c in sorted(by_file.items()):
        k, t, e, s = c.get("killed", 0), c.get("timeout", 0), c.get("equivalent", 0), c.get("survived", 0)
        n = sum(c.values())
        for key, v in (
            ("n", n),
            ("killed", k),
            ("timeout", t),
            ("equivalent", e),
            ("survived", s),
            ("error", c.get("error", 0)),
        ):
            tot[key] += v
        print(f"{path:40s} {n:7d} {k:7d} {t:7d} {e:6d} {s:5d} {_score(k + t, n - e):>6s}")
    print(
        f"{'total':40s} {tot['n']:7d} {tot['killed']:7d} {tot['timeout']:7d} {tot['equivalent']:6d} "
        f"{tot['survived']:5d} {_score(tot['killed'] + tot['timeout'], tot['n'] - tot['equivalent']):>6s}"
    )
    if tot["error"]:
        print(f"{tot['error']} mutants collected no test (status 5): check the TARGETS mapping")
    survivors = [(m, st) for m, st, _ in results if st in ("survived", "error")]
    if survivors:
        print(f"\nsurvivors ({len(survivors)}):")
        for m, st in survivors:
            print(f"  {m.path}:{m.line} [{m.where}] {m.what}")
    print(
        f"\nmutation score {_score(tot['killed'] + tot['timeout'], tot['n'] - tot['equivalent'])} "
        f"(killed {tot['killed'] + tot['timeout']} of {tot['n'] - tot['equivalent']} non-equivalent mutants; "
        f"{tot['equivalent']} judged equivalent, see {EQUIVALENT.relative_to(ROOT)}) in {seconds / 60:.1f} min"
        + (" [interrupted]" if interrupted else "")
    )
    if report is not None:
        with open(report, "w") as f:
            f.write("path\tline\tfunction\tstatus\tseconds\tmutation\tkilled_by\n")
            for m, st, secs in results:
                f.write(
                    f"{m.path}\t{m.line}\t{m.where}\t{st}\t{secs:.1f}\t{m.what}\t{(killed_by or {}).get(m.key, '')}\n"
                )


def _score(killed: int, n: int) -> str:
    return f"{100 * killed / n:.1f}%" if n else "-"


if __name__ == "__main__":
    sys.exit(main())
