"""Multi-query associative recall (Arora et al. 2023): config checks, data module, and answer
accuracy and exact match by the number of pairs -> mqar.csv and metrics ``<m>_id``, ``<m>_ood``,
``<m>_<k>x`` for m in answer_accuracy (per query), exact_match (per sequence), in %.

Trained on P in [task.min_pairs, task.max_pairs] key-value pairs (every key queried once, so a
sequence is 4P + 2 tokens), tested at every P from 1 to ``eval_multiplier`` * max_pairs. Finding
a value is content-based addressing: the control for position-based tasks such as parity."""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from pipelines.errors import PipelineConfigError
from pipelines.tasks import register
from pipelines.tasks._by_size import SizedTask, TestSet
from tape.data import mqar


@register("mqar")
class MQAR(SizedTask):
    """Multi-query associative recall: answer accuracy and exact match by number of pairs."""

    size_key, unit, min_key, max_key = "pairs", "pair", "min_pairs", "max_pairs"
    positive = ("num_keys", "num_values", "min_pairs", "max_pairs", "batch_size", "val_sequences",
                "eval_sequences", "eval_batch_size", "eval_multiplier", "eval_every")
    columns = ("answer_accuracy", "exact_match")
    vocabulary, vocab_formula = "MQAR vocabulary", "3 + task.num_keys + task.num_values"
    fills_from = "task.num_keys, task.num_values and task.max_pairs"

    def vocab_size(self, t: DictConfig) -> int:
        return mqar.vocab_size(int(t.num_keys), int(t.num_values))

    def sequence_length(self, t: DictConfig, size: int) -> int:
        return mqar.sequence_length(size)

    def check_task(self, t: DictConfig) -> None:
        longest = max(self.sizes(t))
        if int(t.num_keys) < longest:
            raise PipelineConfigError(f"task.num_keys={t.num_keys} cannot give the {longest} distinct keys of the "
                                      "largest test (eval_multiplier x max_pairs); raise it")

    def training_batch(self, t: DictConfig, rng: np.random.Generator, batch: int) -> dict[str, Any]:
        return mqar.training_batch(rng, batch, int(t.min_pairs), int(t.max_pairs), int(t.num_keys),
                                   int(t.num_values))

    def validation_set(self, t: DictConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return mqar.val_set(seed, int(t.val_sequences), int(t.min_pairs), int(t.max_pairs), int(t.num_keys),
                            int(t.num_values))

    def test_set(self, t: DictConfig) -> TestSet:
        return lambda p: mqar.eval_set(int(t.eval_seed), p, int(t.eval_sequences), int(t.num_keys),
                                       int(t.num_values))
