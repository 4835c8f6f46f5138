"""Parity with a scratchpad (Ebrahimi et al. 2024): config checks, data module, and step accuracy
and exact match by string length -> parity.csv and metrics ``<m>_id``, ``<m>_ood``, ``<m>_<k>x``
for m in step_accuracy, exact_match (%; tape/data/parity.py has the formats).

Trained on n in [task.min_bits, task.max_bits] bits (L = max_bits), tested at every n from 1 to
``eval_multiplier`` * L. ``task.scratchpad`` picks the format: ``standard`` needs index lookup,
``interleaved`` and ``mnemonics`` are its controls. The vocabulary and the longest training
sequence depend on the format, so ``task.vocab_size`` and ``task.seq_len`` (null) are filled in
by :func:`prepare` before validation.

The exact match (every step and the answer right, teacher-forced) is the final-answer measure:
it holds exactly when greedy decoding writes the whole scratchpad and the answer right. The
answer token alone is not reported: teacher-forced, it copies p_n from two tokens back."""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from pipelines.errors import PipelineConfigError
from pipelines.tasks import register
from pipelines.tasks._by_size import SizedTask, TestSet
from tape.data import parity
from tape.data.parity import FORMATS


@register("parity")
class Parity(SizedTask):
    """Parity with a scratchpad: step accuracy and exact match by string length."""

    size_key, unit, min_key, max_key = "bits", "bit", "min_bits", "max_bits"
    positive = ("min_bits", "max_bits", "batch_size", "val_sequences", "eval_sequences", "eval_batch_size",
                "eval_multiplier", "eval_every")
    columns = ("step_accuracy", "exact_match")
    fills_from = "task.scratchpad and task.max_bits"

    def vocab_size(self, t: DictConfig) -> int:
        return parity.vocab_size(str(t.scratchpad), int(t.mnemonics))

    def sequence_length(self, t: DictConfig, size: int) -> int:
        return parity.sequence_length(str(t.scratchpad), size)

    def prepare(self, cfg: DictConfig) -> None:
        if cfg.task.scratchpad in FORMATS:  # else validate names the key
            super().prepare(cfg)

    def check_task(self, t: DictConfig) -> None:
        if not isinstance(t.score_copies, bool):
            raise PipelineConfigError(f"task.score_copies={t.score_copies!r} must be true or false")
        longest = max(self.sizes(t))
        if t.scratchpad == "mnemonics" and int(t.mnemonics) < longest:
            raise PipelineConfigError(f"task.mnemonics={t.mnemonics} anchors cannot label the {longest} bits of "
                                      f"the longest test string (eval_multiplier x max_bits); raise it")

    def validate(self, cfg: DictConfig) -> None:
        if cfg.task.scratchpad not in FORMATS:
            raise PipelineConfigError(f"task.scratchpad={cfg.task.scratchpad!r}; choose one of {list(FORMATS)}")
        super().validate(cfg)

    def vocabulary_name(self, t: DictConfig) -> str:
        return f"{t.scratchpad} vocabulary"

    def score_copies(self, t: DictConfig) -> bool:
        return bool(t.score_copies)

    def training_batch(self, t: DictConfig, rng: np.random.Generator, batch: int) -> dict[str, Any]:
        return parity.training_batch(rng, batch, int(t.min_bits), int(t.max_bits), str(t.scratchpad),
                                     int(t.mnemonics), bool(t.score_copies))

    def validation_set(self, t: DictConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return parity.val_set(seed, int(t.val_sequences), int(t.min_bits), int(t.max_bits), str(t.scratchpad),
                              int(t.mnemonics))

    def test_set(self, t: DictConfig) -> TestSet:
        return lambda n: parity.eval_set(int(t.eval_seed), n, str(t.scratchpad), int(t.eval_sequences),
                                         int(t.mnemonics))

    def csv_columns(self, t: DictConfig) -> dict[str, Any]:
        return {"scratchpad": str(t.scratchpad)}
