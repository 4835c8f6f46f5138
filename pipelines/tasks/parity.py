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

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from pipelines.errors import PipelineConfigError
from pipelines.models import check_position_range, model_config
from pipelines.tasks import register
from pipelines.tasks._by_size import evaluate_to_csv, tested_sizes
from pipelines.tasks.base import Task, WandbTable
from tape.data.parity import FORMATS, eval_set, sequence_length, training_batch, val_set, vocab_size
from tape.data.synthetic import as_batch
from tape.lightning.synthetic import SyntheticDataModule

COLUMNS = ("step_accuracy", "exact_match")
POSITIVE = ("min_bits", "max_bits", "batch_size", "val_sequences", "eval_sequences", "eval_batch_size",
            "eval_multiplier", "eval_every")


def eval_bits(t: DictConfig) -> list[int]:
    """The tested lengths: every ``eval_every``-th n up to eval_multiplier * L, and each k * L."""
    return tested_sizes(int(t.max_bits), int(t.eval_multiplier), int(t.eval_every))


def prepare(cfg: DictConfig) -> None:
    """Fill ``task.vocab_size`` and ``task.seq_len`` (null) from the format and max_bits."""
    t = cfg.task
    if t.scratchpad not in FORMATS:
        return  # validate names the key
    with open_dict(cfg):
        if t.get("vocab_size") is None:
            t.vocab_size = vocab_size(str(t.scratchpad), int(t.mnemonics))
        if t.get("seq_len") is None:
            t.seq_len = sequence_length(str(t.scratchpad), int(t.max_bits))


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest test sequence, and the key that sets it."""
    return sequence_length(str(task_cfg.scratchpad), max(eval_bits(task_cfg))), "task.eval_multiplier"


def validate(cfg: DictConfig) -> None:
    """Every impossible parity setting, before anything trains."""
    t = cfg.task
    if t.scratchpad not in FORMATS:
        raise PipelineConfigError(f"task.scratchpad={t.scratchpad!r}; choose one of {list(FORMATS)}")
    for key in POSITIVE:
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if int(t.min_bits) > int(t.max_bits):
        raise PipelineConfigError(f"task.min_bits={t.min_bits} must be <= task.max_bits={t.max_bits}")
    if not isinstance(t.score_copies, bool):
        raise PipelineConfigError(f"task.score_copies={t.score_copies!r} must be true or false")
    longest = max(eval_bits(t))
    if t.scratchpad == "mnemonics" and int(t.mnemonics) < longest:
        raise PipelineConfigError(f"task.mnemonics={t.mnemonics} anchors cannot label the {longest} bits of "
                                  f"the longest test string (eval_multiplier x max_bits); raise it")
    need_vocab = vocab_size(str(t.scratchpad), int(t.mnemonics))
    if t.vocab_size is None or t.seq_len is None:
        raise PipelineConfigError("task.vocab_size / task.seq_len is null: pipelines.train fills them from "
                                  "task.scratchpad and task.max_bits; leave them null there")
    if int(t.vocab_size) < need_vocab:
        raise PipelineConfigError(f"task.vocab_size={t.vocab_size} is smaller than the {t.scratchpad} "
                                  f"vocabulary ({need_vocab}); leave it null")
    if int(t.seq_len) < sequence_length(str(t.scratchpad), int(t.max_bits)):
        raise PipelineConfigError(f"task.seq_len={t.seq_len} is shorter than a {t.max_bits}-bit training "
                                  f"example ({sequence_length(str(t.scratchpad), int(t.max_bits))} tokens); "
                                  "leave it null")
    mc = model_config(cfg)
    if mc.vocab_size < need_vocab:
        raise PipelineConfigError(f"model.vocab_size={mc.vocab_size} is smaller than the {t.scratchpad} "
                                  f"vocabulary ({need_vocab}); leave it at ${{task.vocab_size}}")
    check_position_range(mc, int(t.seq_len), "task.max_bits")
    check_position_range(mc, *positions_needed(t))


def datamodule(cfg: DictConfig) -> SyntheticDataModule:
    t = cfg.task
    fmt, lo, hi, k, copies = str(t.scratchpad), int(t.min_bits), int(t.max_bits), int(t.mnemonics), bool(t.score_copies)
    return SyntheticDataModule(
        lambda rng, b: training_batch(rng, b, lo, hi, fmt, k, copies),
        lambda: as_batch(*val_set(int(cfg.seed), int(t.val_sequences), lo, hi, fmt, k), copies),
        int(t.batch_size), int(cfg.seed), int(t.vocab_size))


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Step accuracy and exact match (%) at every tested length -> parity.csv + metrics."""
    t = task_cfg
    fmt, k = str(t.scratchpad), int(t.mnemonics)
    return evaluate_to_csv(model, eval_bits(t), lambda n: eval_set(int(t.eval_seed), n, fmt, int(t.eval_sequences), k),
                           int(t.eval_batch_size), "bits", COLUMNS, int(t.max_bits), int(t.eval_multiplier),
                           out_dir / "parity.csv", bool(t.score_copies), scratchpad=fmt)


@register("parity")
class Parity(Task):
    """Parity with a scratchpad: step accuracy and exact match by string length."""

    wandb_tables = {"parity.csv": WandbTable("eval/parity")}
    prepare = staticmethod(prepare)
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
