"""Task registry: what ``task.name`` means to the pipelines (data, checks, evaluation).

A task module provides ``validate(cfg)`` (raise PipelineConfigError before any training),
``datamodule(cfg)`` (a LightningDataModule with ``vocab_size``) and
``evaluate(model, task_cfg, out_dir, title)`` (write artifacts into out_dir, return flat metrics);
optionally ``prepare(cfg)`` (complete the config in place before validation) and
``initialize(model, cfg)`` (e.g. load pretrained weights into a fresh, not resumed, model).
A task of several training stages (context extension) provides ``run(cfg)`` instead, and
``pipelines.train`` hands it the whole run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pipelines.utils import PipelineConfigError

TASKS = {
    "addition": "pipelines.tasks.addition",
    "context_extension": "pipelines.tasks.context_extension",
    "pretrain": "pipelines.tasks.pretrain",
    "scrolls": "pipelines.tasks.scrolls",
}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise PipelineConfigError(f"task.name={name!r} is not a known task; choose one of {sorted(TASKS)}")
    return importlib.import_module(TASKS[name])
