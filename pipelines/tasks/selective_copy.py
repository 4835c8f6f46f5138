"""Selective copy (as in CoPE, Golovneva et al. 2024): config checks, data module, and answer
accuracy and exact match by sequence length -> selective_copy.csv and metrics ``<m>_id``,
``<m>_ood``, ``<m>_<k>x`` for m in answer_accuracy (per copied token), exact_match (per sequence), in %.

Trained on lengths in [task.min_length, task.max_length] slots holding ``task.num_items`` data
tokens (a sequence is length + items + 2 tokens), tested at every length from num_items to
``eval_multiplier`` * max_length with the same items: longer tests only add blanks. Copying the
i-th data token needs counting the non-blank tokens before it (tape/data/selective_copy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from pipelines.errors import PipelineConfigError
from pipelines.models import check_position_range, model_config
from pipelines.tasks import register
from pipelines.tasks._by_size import evaluate_to_csv, tested_sizes
from pipelines.tasks.base import Task, WandbTable
from tape.data.selective_copy import eval_set, sequence_length, training_batch, val_set, vocab_size
from tape.data.synthetic import as_batch
from tape.lightning.synthetic import SyntheticDataModule

COLUMNS = ("answer_accuracy", "exact_match")
POSITIVE = ("num_tokens", "num_items", "min_length", "max_length", "batch_size", "val_sequences", "eval_sequences",
            "eval_batch_size", "eval_multiplier", "eval_every")


def eval_lengths(t: DictConfig) -> list[int]:
    """The tested lengths: every ``eval_every``-th length from num_items up to eval_multiplier *
    max_length, and each k * max_length."""
    return tested_sizes(int(t.max_length), int(t.eval_multiplier), int(t.eval_every), smallest=int(t.num_items))


def prepare(cfg: DictConfig) -> None:
    """Fill ``task.vocab_size`` and ``task.seq_len`` (null) from num_tokens, max_length and num_items."""
    t = cfg.task
    with open_dict(cfg):
        if t.get("vocab_size") is None:
            t.vocab_size = vocab_size(int(t.num_tokens))
        if t.get("seq_len") is None:
            t.seq_len = sequence_length(int(t.max_length), int(t.num_items))


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest test sequence, and the key that sets it."""
    return sequence_length(max(eval_lengths(task_cfg)), int(task_cfg.num_items)), "task.eval_multiplier"


def check_sizes(t: DictConfig) -> None:
    """Positive sizes, and training lengths that can hold the items."""
    for key in POSITIVE:
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if int(t.min_length) > int(t.max_length):
        raise PipelineConfigError(f"task.min_length={t.min_length} must be <= task.max_length={t.max_length}")
    if int(t.min_length) < int(t.num_items):
        raise PipelineConfigError(f"task.min_length={t.min_length} slots cannot hold task.num_items={t.num_items} "
                                  "data tokens; raise task.min_length or lower task.num_items")


def validate(cfg: DictConfig) -> None:
    """Every impossible selective-copy setting, before anything trains."""
    t = cfg.task
    check_sizes(t)
    if t.vocab_size is None or t.seq_len is None:
        raise PipelineConfigError("task.vocab_size / task.seq_len is null: pipelines.train fills them from "
                                  "task.num_tokens, task.max_length and task.num_items; leave them null there")
    need_vocab, need_len = vocab_size(int(t.num_tokens)), sequence_length(int(t.max_length), int(t.num_items))
    if int(t.vocab_size) < need_vocab:
        raise PipelineConfigError(f"task.vocab_size={t.vocab_size} is smaller than the selective-copy vocabulary "
                                  f"(4 + task.num_tokens = {need_vocab}); leave it null")
    if int(t.seq_len) < need_len:
        raise PipelineConfigError(f"task.seq_len={t.seq_len} is shorter than a {t.max_length}-slot training "
                                  f"example ({need_len} tokens); leave it null")
    mc = model_config(cfg)
    if mc.vocab_size < need_vocab:
        raise PipelineConfigError(f"model.vocab_size={mc.vocab_size} is smaller than the selective-copy "
                                  f"vocabulary ({need_vocab}); leave it at ${{task.vocab_size}}")
    check_position_range(mc, int(t.seq_len), "task.max_length")
    check_position_range(mc, *positions_needed(t))


def datamodule(cfg: DictConfig) -> SyntheticDataModule:
    t = cfg.task
    lo, hi, items, tokens = int(t.min_length), int(t.max_length), int(t.num_items), int(t.num_tokens)
    return SyntheticDataModule(
        lambda rng, b: training_batch(rng, b, lo, hi, items, tokens),
        lambda: as_batch(*val_set(int(cfg.seed), int(t.val_sequences), lo, hi, items, tokens)),
        int(t.batch_size), int(cfg.seed), int(t.vocab_size))


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Answer accuracy and exact match (%) at every tested length -> selective_copy.csv + metrics."""
    t = task_cfg
    return evaluate_to_csv(
        model, eval_lengths(t),
        lambda n: eval_set(int(t.eval_seed), n, int(t.eval_sequences), int(t.num_items), int(t.num_tokens)),
        int(t.eval_batch_size), "length", COLUMNS, int(t.max_length), int(t.eval_multiplier),
        out_dir / "selective_copy.csv")


@register("selective_copy")
class SelectiveCopy(Task):
    """Selective copy: answer accuracy and exact match by sequence length."""

    wandb_tables = {"selective_copy.csv": WandbTable("eval/selective_copy")}
    prepare = staticmethod(prepare)
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
