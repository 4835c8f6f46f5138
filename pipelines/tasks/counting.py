"""Counting (as in CoPE, Golovneva et al. 2024): config checks, data module, and answer accuracy by
the number of operations -> counting.csv and metrics ``<m>_id``, ``<m>_ood``, ``<m>_<k>x`` for m in
answer_accuracy (exact_match is the same number: one scored token a sequence), in %.

Trained on ops in [task.min_ops, task.max_ops] operations (``x_k ++`` or ``pass``), tested at every
number of ops from 1 to ``eval_multiplier`` * max_ops. At most ``task.max_increments`` increments a
sequence, so longer tests add ``pass`` distractors, not larger counts (tape/data/counting.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from pipelines.errors import PipelineConfigError
from pipelines.models import check_position_range, model_config
from pipelines.tasks import register
from pipelines.tasks._by_size import evaluate_to_csv, tested_sizes
from pipelines.tasks.base import Task, WandbTable
from tape.data.counting import eval_set, sequence_length, training_batch, val_set, vocab_size
from tape.data.synthetic import as_batch
from tape.lightning.synthetic import SyntheticDataModule

COLUMNS = ("answer_accuracy",)
POSITIVE = ("variables", "max_increments", "min_ops", "max_ops", "batch_size", "val_sequences", "eval_sequences",
            "eval_batch_size", "eval_multiplier", "eval_every")


def eval_ops(t: DictConfig) -> list[int]:
    """The tested sizes: every ``eval_every``-th number of ops up to eval_multiplier * max_ops, and
    each k * max_ops."""
    return tested_sizes(int(t.max_ops), int(t.eval_multiplier), int(t.eval_every))


def prepare(cfg: DictConfig) -> None:
    """Fill ``task.vocab_size`` and ``task.seq_len`` (null) from variables, max_increments and max_ops."""
    t = cfg.task
    with open_dict(cfg):
        if t.get("vocab_size") is None:
            t.vocab_size = vocab_size(int(t.variables), int(t.max_increments))
        if t.get("seq_len") is None:
            t.seq_len = sequence_length(int(t.max_ops), int(t.max_increments))


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest test sequence, and the key that sets it."""
    return sequence_length(max(eval_ops(task_cfg)), int(task_cfg.max_increments)), "task.eval_multiplier"


def check_sizes(t: DictConfig) -> None:
    """Positive sizes, ordered training sizes and a pass probability that leaves something to count."""
    for key in POSITIVE:
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if int(t.min_ops) > int(t.max_ops):
        raise PipelineConfigError(f"task.min_ops={t.min_ops} must be <= task.max_ops={t.max_ops}")
    if not 0.0 <= float(t.pass_prob) < 1.0:
        raise PipelineConfigError(f"task.pass_prob={t.pass_prob} must be in [0, 1) (at 1 nothing is ever "
                                  "incremented)")


def validate(cfg: DictConfig) -> None:
    """Every impossible counting setting, before anything trains."""
    t = cfg.task
    check_sizes(t)
    if t.vocab_size is None or t.seq_len is None:
        raise PipelineConfigError("task.vocab_size / task.seq_len is null: pipelines.train fills them from "
                                  "task.variables, task.max_increments and task.max_ops; leave them null there")
    need_vocab = vocab_size(int(t.variables), int(t.max_increments))
    need_len = sequence_length(int(t.max_ops), int(t.max_increments))
    if int(t.vocab_size) < need_vocab:
        raise PipelineConfigError(f"task.vocab_size={t.vocab_size} is smaller than the counting vocabulary "
                                  f"(6 + task.variables + task.max_increments = {need_vocab}); leave it null")
    if int(t.seq_len) < need_len:
        raise PipelineConfigError(f"task.seq_len={t.seq_len} is shorter than a {t.max_ops}-operation training "
                                  f"example ({need_len} tokens); leave it null")
    mc = model_config(cfg)
    if mc.vocab_size < need_vocab:
        raise PipelineConfigError(f"model.vocab_size={mc.vocab_size} is smaller than the counting vocabulary "
                                  f"({need_vocab}); leave it at ${{task.vocab_size}}")
    check_position_range(mc, int(t.seq_len), "task.max_ops")
    check_position_range(mc, *positions_needed(t))


def generator_args(t: DictConfig) -> tuple[int, int, float]:
    """(variables, max_increments, pass_prob) as the generators take them."""
    return int(t.variables), int(t.max_increments), float(t.pass_prob)


def datamodule(cfg: DictConfig) -> SyntheticDataModule:
    t = cfg.task
    lo, hi, args = int(t.min_ops), int(t.max_ops), generator_args(t)
    return SyntheticDataModule(
        lambda rng, b: training_batch(rng, b, lo, hi, *args),
        lambda: as_batch(*val_set(int(cfg.seed), int(t.val_sequences), lo, hi, *args)),
        int(t.batch_size), int(cfg.seed), int(t.vocab_size))


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Answer accuracy (%) at every tested number of ops -> counting.csv + metrics."""
    t = task_cfg
    return evaluate_to_csv(
        model, eval_ops(t), lambda n: eval_set(int(t.eval_seed), n, int(t.eval_sequences), *generator_args(t)),
        int(t.eval_batch_size), "ops", COLUMNS, int(t.max_ops), int(t.eval_multiplier), out_dir / "counting.csv")


@register("counting")
class Counting(Task):
    """Counting: answer accuracy by number of operations."""

    wandb_tables = {"counting.csv": WandbTable("eval/counting")}
    prepare = staticmethod(prepare)
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
