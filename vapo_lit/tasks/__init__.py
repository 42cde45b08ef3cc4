"""Task registry: `get_task(name, **options)`; `TASKS` maps a name to its factory.

A name is a registered task (`chain`, `longchain`, `math`, `math_tools`, `toolchain`, or one a user's module
registered with `@register`) or an import path to a user's task or environment class:
`package.module:Class` (imported as Python imports it, the working directory first) or
`path/to/file.py:Class`. The class is called with the task options as keywords.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import sys
import typing
from pathlib import Path
from typing import Callable

from vapo_lit.tasks.base import Problem, Task, Verdict

TASKS: dict[str, Callable[..., Task]] = {}


def register(name: str):
    """Class decorator: make a task available as `get_task(name)`."""

    def wrap(factory):
        TASKS[name] = factory
        return factory

    return wrap


def get_task(name: str, **options) -> Task:
    return task_factory(name)(**options)


def task_factory(name: str) -> Callable[..., Task]:
    """The factory of task `name` (a registered name or `module:Class`); ValueError in one line
    saying what is wrong and what is valid."""
    _load_builtin_tasks()
    if name in TASKS:
        return TASKS[name]
    if ":" not in name:
        raise ValueError(
            f"task={name!r} is not a task; valid tasks: {', '.join(sorted(TASKS))}, "
            f"or a class of your own as package.module:Class or path/to/file.py:Class"
        )
    module_name, _, attr = name.rpartition(":")
    module = _import_task_module(name, module_name)
    factory = getattr(module, attr, None) if attr else None
    if not callable(factory):
        classes = _public_classes(module)
        raise ValueError(
            f"task={name!r}: {module_name} has no class {attr!r}"
            + (f"; it defines: {', '.join(classes)}" if classes else "")
        )
    TASKS[name] = factory  # later lookups (other passes, option checks) find it without importing again
    return factory


def option_names(name: str) -> list[str] | None:
    """The keyword options task `name` accepts (its constructor's, or the fields of the config
    dataclass it takes with `**options`); None when it takes any keyword."""
    factory = task_factory(name)
    inits = (
        [c.__init__ for c in factory.__mro__ if "__init__" in vars(c)]
        if inspect.isclass(factory)
        else [factory]
    )
    names: list[str] = []
    for init in inits:  # a subclass that passes **options up takes its base class's options too
        params = inspect.signature(init).parameters
        names += [
            n
            for n, p in params.items()
            if n not in ("self", "config", *names) and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return names
        hint = typing.get_type_hints(init).get("config") if "config" in params else None
        configs = [a for a in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(a)]
        if configs:
            return names + [f.name for c in configs for f in dataclasses.fields(c)]
    return None


def _import_task_module(name: str, module_name: str):
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"task={name!r}: file {module_name} not found")
        # the same module name in every process that loads this file (pickled classes refer to it)
        key = f"vapo_lit_user_task_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"
        if key in sys.modules:
            return sys.modules[key]
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(module)
        except Exception:
            del sys.modules[key]
            raise
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` does: a module next to the user is found
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ValueError(
                f"task={name!r}: no module named {module_name!r} (run from the folder that holds it, "
                f"add it to PYTHONPATH, or give a file as path/to/file.py:Class)"
            ) from None
        raise


def _public_classes(module) -> list[str]:
    return sorted(
        k
        for k, v in vars(module).items()
        if isinstance(v, type) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__
    )


def task_names() -> list[str]:
    _load_builtin_tasks()
    return sorted(TASKS)


def _load_builtin_tasks() -> None:
    # Imported lazily so that `vapo_lit.tasks` stays cheap to import.
    import importlib

    for mod in (
        "vapo_lit.tasks.chain",
        "vapo_lit.tasks.longchain",
        "vapo_lit.tasks.math",
        "vapo_lit.tasks.math_tools",
        "vapo_lit.tasks.toolchain",
    ):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # a task module not written yet
            if e.name != mod:
                raise


__all__ = [
    "Problem",
    "Task",
    "Verdict",
    "TASKS",
    "register",
    "get_task",
    "option_names",
    "task_factory",
    "task_names",
]
