"""Counting (as in CoPE, Golovneva et al. 2024): config checks, data module, and answer accuracy by
the number of operations -> counting.csv and metrics ``<m>_id``, ``<m>_ood``, ``<m>_<k>x`` for m in
answer_accuracy (exact_match is the same number: one scored token a sequence), in %.

Trained on ops in [task.min_ops, task.max_ops] operations (``x_k ++`` or ``pass``), tested at every
number of ops from 1 to ``eval_multiplier`` * max_ops. At most ``task.max_increments`` increments a
sequence, so longer tests add ``pass`` distractors, not larger counts (tape/data/counting.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from pipelines.errors import PipelineConfigError
from pipelines.tasks import register
from pipelines.tasks._by_size import SizedTask, TestSet
from tape.data import counting


def generator_args(t: DictConfig) -> tuple[int, int, float]:
    """(variables, max_increments, pass_prob) as the generators take them."""
    return int(t.variables), int(t.max_increments), float(t.pass_prob)


@register("counting")
class Counting(SizedTask):
    """Counting: answer accuracy by number of operations."""

    size_key, unit, min_key, max_key = "ops", "operation", "min_ops", "max_ops"
    positive = ("variables", "max_increments", "min_ops", "max_ops", "batch_size", "val_sequences",
                "eval_sequences", "eval_batch_size", "eval_multiplier", "eval_every")
    columns = ("answer_accuracy",)
    vocabulary, vocab_formula = "counting vocabulary", "6 + task.variables + task.max_increments"
    fills_from = "task.variables, task.max_increments and task.max_ops"

    def vocab_size(self, t: DictConfig) -> int:
        return counting.vocab_size(int(t.variables), int(t.max_increments))

    def sequence_length(self, t: DictConfig, size: int) -> int:
        return counting.sequence_length(size, int(t.max_increments))

    def check_task(self, t: DictConfig) -> None:
        if not 0.0 <= float(t.pass_prob) < 1.0:
            raise PipelineConfigError(f"task.pass_prob={t.pass_prob} must be in [0, 1) (at 1 nothing is ever "
                                      "incremented)")

    def training_batch(self, t: DictConfig, rng: np.random.Generator, batch: int) -> dict[str, Any]:
        return counting.training_batch(rng, batch, int(t.min_ops), int(t.max_ops), *generator_args(t))

    def validation_set(self, t: DictConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return counting.val_set(seed, int(t.val_sequences), int(t.min_ops), int(t.max_ops), *generator_args(t))

    def test_set(self, t: DictConfig) -> TestSet:
        return lambda n: counting.eval_set(int(t.eval_seed), n, int(t.eval_sequences), *generator_args(t))
