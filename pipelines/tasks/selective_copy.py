"""Selective copy (as in CoPE, Golovneva et al. 2024): config checks, data module, and answer
accuracy and exact match by sequence length -> selective_copy.csv and metrics ``<m>_id``,
``<m>_ood``, ``<m>_<k>x`` for m in answer_accuracy (per copied token), exact_match (per sequence), in %.

Trained on lengths in [task.min_length, task.max_length] slots holding ``task.num_items`` data
tokens (a sequence is length + items + 2 tokens), tested at every length from num_items to
``eval_multiplier`` * max_length with the same items: longer tests only add blanks. Copying the
i-th data token needs counting the non-blank tokens before it (tape/data/selective_copy.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from pipelines.errors import PipelineConfigError
from pipelines.tasks import register
from pipelines.tasks._by_size import SizedTask, TestSet, tested_sizes
from tape.data import selective_copy


@register("selective_copy")
class SelectiveCopy(SizedTask):
    """Selective copy: answer accuracy and exact match by sequence length."""

    size_key, unit, min_key, max_key = "length", "slot", "min_length", "max_length"
    positive = ("num_tokens", "num_items", "min_length", "max_length", "batch_size", "val_sequences",
                "eval_sequences", "eval_batch_size", "eval_multiplier", "eval_every")
    columns = ("answer_accuracy", "exact_match")
    vocabulary, vocab_formula = "selective-copy vocabulary", "4 + task.num_tokens"
    fills_from = "task.num_tokens, task.max_length and task.num_items"

    def vocab_size(self, t: DictConfig) -> int:
        return selective_copy.vocab_size(int(t.num_tokens))

    def sequence_length(self, t: DictConfig, size: int) -> int:
        return selective_copy.sequence_length(size, int(t.num_items))

    def sizes(self, t: DictConfig) -> list[int]:
        """Every ``eval_every``-th length from num_items (the fewest slots that hold the items)."""
        return tested_sizes(int(t.max_length), int(t.eval_multiplier), int(t.eval_every), smallest=int(t.num_items))

    def check_task(self, t: DictConfig) -> None:
        if int(t.min_length) < int(t.num_items):
            raise PipelineConfigError(f"task.min_length={t.min_length} slots cannot hold task.num_items="
                                      f"{t.num_items} data tokens; raise task.min_length or lower task.num_items")

    def training_batch(self, t: DictConfig, rng: np.random.Generator, batch: int) -> dict[str, Any]:
        return selective_copy.training_batch(rng, batch, int(t.min_length), int(t.max_length), int(t.num_items),
                                             int(t.num_tokens))

    def validation_set(self, t: DictConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return selective_copy.val_set(seed, int(t.val_sequences), int(t.min_length), int(t.max_length),
                                      int(t.num_items), int(t.num_tokens))

    def test_set(self, t: DictConfig) -> TestSet:
        return lambda n: selective_copy.eval_set(int(t.eval_seed), n, int(t.eval_sequences), int(t.num_items),
                                                 int(t.num_tokens))
