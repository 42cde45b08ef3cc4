"""Task registry: `get_task(name, **options)`; `TASKS` maps a name to its factory."""
from __future__ import annotations

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
    _load_builtin_tasks()
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**options)


def task_names() -> list[str]:
    _load_builtin_tasks()
    return sorted(TASKS)


def _load_builtin_tasks() -> None:
    # Imported lazily so that `vapo_lit.tasks` stays cheap to import.
    import importlib

    for mod in ("vapo_lit.tasks.chain", "vapo_lit.tasks.longchain", "vapo_lit.tasks.math", "vapo_lit.tasks.toolchain"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # a task module not written yet
            if e.name != mod:
                raise


__all__ = ["Problem", "Task", "Verdict", "TASKS", "register", "get_task", "task_names"]
