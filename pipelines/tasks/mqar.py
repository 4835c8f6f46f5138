"""Multi-query associative recall (Arora et al. 2023): config checks, data module, and answer
accuracy and exact match by the number of pairs -> mqar.csv and metrics ``<m>_id``, ``<m>_ood``,
``<m>_<k>x`` for m in answer_accuracy (per query), exact_match (per sequence), in %.

Trained on P in [task.min_pairs, task.max_pairs] key-value pairs (every key queried once, so a
sequence is 4P + 2 tokens), tested at every P from 1 to ``eval_multiplier`` * max_pairs. Finding
a value is content-based addressing: the control for position-based tasks such as parity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from pipelines.errors import PipelineConfigError
from pipelines.models import check_position_range, model_config
from pipelines.tasks import register
from pipelines.tasks._by_size import evaluate_to_csv, tested_sizes
from pipelines.tasks.base import Task, WandbTable
from tape.data.mqar import eval_set, sequence_length, training_batch, val_set, vocab_size
from tape.data.synthetic import as_batch
from tape.lightning.synthetic import SyntheticDataModule

COLUMNS = ("answer_accuracy", "exact_match")
POSITIVE = ("num_keys", "num_values", "min_pairs", "max_pairs", "batch_size", "val_sequences", "eval_sequences",
            "eval_batch_size", "eval_multiplier", "eval_every")


def eval_pairs(t: DictConfig) -> list[int]:
    """The tested sizes: every ``eval_every``-th P up to eval_multiplier * max_pairs, and each
    k * max_pairs."""
    return tested_sizes(int(t.max_pairs), int(t.eval_multiplier), int(t.eval_every))


def prepare(cfg: DictConfig) -> None:
    """Fill ``task.vocab_size`` and ``task.seq_len`` (null) from num_keys, num_values and max_pairs."""
    t = cfg.task
    with open_dict(cfg):
        if t.get("vocab_size") is None:
            t.vocab_size = vocab_size(int(t.num_keys), int(t.num_values))
        if t.get("seq_len") is None:
            t.seq_len = sequence_length(int(t.max_pairs))


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest test sequence, and the key that sets it."""
    return sequence_length(max(eval_pairs(task_cfg))), "task.eval_multiplier"


def validate(cfg: DictConfig) -> None:
    """Every impossible MQAR setting, before anything trains."""
    t = cfg.task
    for key in POSITIVE:
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if int(t.min_pairs) > int(t.max_pairs):
        raise PipelineConfigError(f"task.min_pairs={t.min_pairs} must be <= task.max_pairs={t.max_pairs}")
    longest = max(eval_pairs(t))
    if int(t.num_keys) < longest:
        raise PipelineConfigError(f"task.num_keys={t.num_keys} cannot give the {longest} distinct keys of the largest "
                                  "test (eval_multiplier x max_pairs); raise it")
    if t.vocab_size is None or t.seq_len is None:
        raise PipelineConfigError("task.vocab_size / task.seq_len is null: pipelines.train fills them from "
                                  "task.num_keys, task.num_values and task.max_pairs; leave them null there")
    need_vocab = vocab_size(int(t.num_keys), int(t.num_values))
    if int(t.vocab_size) < need_vocab:
        raise PipelineConfigError(f"task.vocab_size={t.vocab_size} is smaller than the MQAR vocabulary "
                                  f"(3 + task.num_keys + task.num_values = {need_vocab}); leave it null")
    if int(t.seq_len) < sequence_length(int(t.max_pairs)):
        raise PipelineConfigError(f"task.seq_len={t.seq_len} is shorter than a {t.max_pairs}-pair training "
                                  f"example ({sequence_length(int(t.max_pairs))} tokens); leave it null")
    mc = model_config(cfg)
    if mc.vocab_size < need_vocab:
        raise PipelineConfigError(f"model.vocab_size={mc.vocab_size} is smaller than the MQAR vocabulary "
                                  f"({need_vocab}); leave it at ${{task.vocab_size}}")
    check_position_range(mc, int(t.seq_len), "task.max_pairs")
    check_position_range(mc, *positions_needed(t))


def datamodule(cfg: DictConfig) -> SyntheticDataModule:
    t = cfg.task
    lo, hi, keys, values = int(t.min_pairs), int(t.max_pairs), int(t.num_keys), int(t.num_values)
    return SyntheticDataModule(
        lambda rng, b: training_batch(rng, b, lo, hi, keys, values),
        lambda: as_batch(*val_set(int(cfg.seed), int(t.val_sequences), lo, hi, keys, values)),
        int(t.batch_size), int(cfg.seed), int(t.vocab_size))


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Answer accuracy and exact match (%) at every tested size -> mqar.csv + metrics."""
    t = task_cfg
    return evaluate_to_csv(
        model, eval_pairs(t),
        lambda p: eval_set(int(t.eval_seed), p, int(t.eval_sequences), int(t.num_keys), int(t.num_values)),
        int(t.eval_batch_size), "pairs", COLUMNS, int(t.max_pairs), int(t.eval_multiplier), out_dir / "mqar.csv")


@register("mqar")
class MQAR(Task):
    """Multi-query associative recall: answer accuracy and exact match by number of pairs."""

    wandb_tables = {"mqar.csv": WandbTable("eval/mqar")}
    prepare = staticmethod(prepare)
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
