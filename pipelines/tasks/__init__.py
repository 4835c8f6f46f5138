"""Registry of tasks: what ``task.name`` means to the pipelines: ``get(name)``, ``names()``,
``wandb_tables()``.

One module (or subpackage) per task, named as the task: it registers its ``Task`` subclass
(pipelines/tasks/base.py) with ``@register(name)``. ``get`` imports the module named as the task;
``names`` and ``wandb_tables`` import every module of this package first.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, TypeVar

from pipelines.errors import PipelineConfigError
from pipelines.tasks.base import Task, WandbTable

_REGISTRY: dict[str, Task] = {}
T = TypeVar("T", bound=type[Task])
_NOT_TASKS = {"base"}


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make a Task available as ``task.name=<name>``."""

    def deco(cls: T) -> T:
        if name in _REGISTRY:
            raise ValueError(f"task {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls()
        return cls

    return deco


def get(name: str) -> Task:
    """The task registered as ``name``: pipelines.tasks.<name> is imported (a module named
    otherwise is found by importing them all)."""
    if name not in _REGISTRY:
        if name in _task_modules():
            importlib.import_module(f"{__name__}.{name}")
        else:
            _import_tasks()
    if name not in _REGISTRY:
        raise PipelineConfigError(f"task.name={name!r} is not a known task; choose one of {names()}")
    return _REGISTRY[name]


def names() -> list[str]:
    """Sorted names of every task."""
    _import_tasks()
    return sorted(_REGISTRY)


def wandb_tables() -> dict[str, WandbTable]:
    """Run-dir file -> its W&B table, over every task (a run may hold another task's files)."""
    _import_tasks()
    return {file: table for task in _REGISTRY.values() for file, table in task.wandb_tables.items()}


def _task_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules(__path__)
            if m.name not in _NOT_TASKS and not m.name.startswith("_")]


def _import_tasks() -> None:
    """Import every module of this package (each registers itself)."""
    for name in _task_modules():
        importlib.import_module(f"{__name__}.{name}")


__all__ = ["Task", "WandbTable", "get", "names", "register", "wandb_tables"]
