"""Task registry: what ``task.name`` means to the pipelines (data, checks, evaluation).

A task module provides ``validate(cfg)`` (raise PipelineConfigError before any training),
``datamodule(cfg)`` (a LightningDataModule with ``vocab_size``) and
``evaluate(model, task_cfg, out_dir, title)`` (write artifacts into out_dir, return flat metrics);
optionally ``prepare(cfg)`` (complete the config in place before validation),
``initialize(model, cfg)`` (e.g. load pretrained weights into a fresh, not resumed, model),
``positions_needed(task_cfg)`` ((tokens, config key) evaluation needs, checked against the
model's trained position range by pipelines.evaluate) and ``adopt(task_cfg, source, out_dir)``
(fill null settings from the evaluated run, a pipelines.run_source.RunSource). ``passkey`` and
``perplexity`` are evaluation tasks only: pipelines.evaluate runs them on any finished run.
A task of several training stages (context extension) provides ``run(cfg)`` instead, and
``pipelines.train`` hands it the whole run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pipelines.errors import PipelineConfigError

TASKS = {
    "addition": "pipelines.tasks.addition",
    "context_extension": "pipelines.tasks.context_extension",
    "flipflop": "pipelines.tasks.flipflop",
    "passkey": "pipelines.tasks.passkey",
    "perplexity": "pipelines.tasks.perplexity",
    "pretrain": "pipelines.tasks.pretrain",
    "scrolls": "pipelines.tasks.scrolls",
    "word_problem": "pipelines.tasks.word_problem",
}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise PipelineConfigError(f"task.name={name!r} is not a known task; choose one of {sorted(TASKS)}")
    return importlib.import_module(TASKS[name])
