"""Registry of tasks: what ``task.name`` means to the pipelines: ``get(name)``, ``names()``,
``wandb_tables()``.

One module (or subpackage) per task, named as the task: it registers its ``Task`` subclass
(pipelines/tasks/base.py) with ``@register(name)``. ``get`` imports the module named as the task;
``names`` and ``wandb_tables`` import every module of this package first.
"""

from __future__ import annotations

from omegaconf import DictConfig

from pipelines.errors import PipelineConfigError
from pipelines.tasks.base import Task, WandbTable
from tape.registry import Registry

_TASKS: Registry[Task] = Registry(__name__, "task", instances=True)
register = _TASKS.register  # class decorator: make a Task available as ``task.name=<name>``


def get(name: str) -> Task:
    """The task registered as ``name``: pipelines.tasks.<name> is imported (a module named
    otherwise is found by importing them all)."""
    _TASKS.load(name)
    task = _TASKS.find(name)
    if task is None:
        raise PipelineConfigError(f"task.name={name!r} is not a known task; choose one of {names()}")
    return task


def names() -> list[str]:
    """Sorted names of every task."""
    _TASKS.import_all()
    return _TASKS.names()


def prepare_from_conf(cfg: DictConfig) -> bool:
    """Complete ``cfg`` in place as pipelines.train does (``task.prepare``: the vocabulary and
    length a task derives) where that needs nothing but the config; a task whose prepare adopts
    another run (``prepare_reads_runs``) is left as conf/ has it. True where prepare ran."""
    task = get(str(cfg.task.name))
    if task.prepare_reads_runs:
        return False
    task.prepare(cfg)
    return True


def wandb_tables() -> dict[str, WandbTable]:
    """Run-dir file -> its W&B table, over every task (a run may hold another task's files)."""
    _TASKS.import_all()
    return {file: table for task in _TASKS for file, table in task.wandb_tables.items()}


__all__ = ["Task", "WandbTable", "get", "names", "prepare_from_conf", "register", "wandb_tables"]
