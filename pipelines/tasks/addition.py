"""The addition task (tape-spec D.1): config checks, data module, grid evaluation + heatmap."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from pipelines.config_checks import require_int
from pipelines.errors import PipelineConfigError
from pipelines.models import check_model_vocab, check_position_range, model_config
from pipelines.result_files import Row
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable

if TYPE_CHECKING:  # torch-based; imported where used, after the cheap config checks
    from tape.lightning import AdditionDataModule


def validate(cfg: DictConfig) -> None:
    """Every impossible addition setting, before anything trains."""
    t = cfg.task
    ints = ("max_digits", "batch_size", "val_examples")
    require_int(cfg, *(f"task.{key}" for key in (*ints, "seq_len")))
    for key in ints:
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    check(t)  # the evaluation's settings (after training it ran into eval_batch_size=0)
    from tape.data.addition import VOCAB_SIZE, max_sequence_length

    need = max_sequence_length(t.max_digits)  # checked first: it names the value most likely wrong
    if t.seq_len < need:
        raise PipelineConfigError(
            f"task.max_digits={t.max_digits} needs {need}-token training examples (3 * task.max_digits "
            f"+ 4) but task.seq_len={t.seq_len}; lower task.max_digits or set task.seq_len>={need}"
        )
    if t.eval_max_digits < t.max_digits:
        raise PipelineConfigError(
            f"task.max_digits={t.max_digits} is above task.eval_max_digits={t.eval_max_digits}: the "
            "test grid must cover the training lengths (the paper uses 2 * max_digits); lower "
            "task.max_digits or raise task.eval_max_digits"
        )
    mc = model_config(cfg)
    check_model_vocab(mc, VOCAB_SIZE, "addition vocabulary")
    check_position_range(mc, *positions_needed(t))
    check_abacus_range(mc, int(t.max_digits), "task.max_digits", training=True)
    check_abacus_range(mc, int(t.eval_max_digits), "task.eval_max_digits", training=False)


def check_abacus_range(mc: Any, max_digits: int, key: str, training: bool) -> None:
    """Refuse digit runs (an answer has up to max_digits + 1 digits, plus the random offset in
    training) that need Abacus indices beyond model.abacus_max_index."""
    if not getattr(mc, "abacus", False):
        return
    need = max_digits + 1 + (mc.abacus_max_offset if training else 0)
    if need > mc.abacus_max_index:
        offset = f" + model.abacus_max_offset={mc.abacus_max_offset}" if training else ""
        raise PipelineConfigError(
            f"{key}={max_digits} gives answers of {max_digits + 1} digits{offset}: Abacus index "
            f"{need} > model.abacus_max_index={mc.abacus_max_index}; set "
            f"model.abacus_max_index>={need} (or shorten {key})"
        )


def check(task_cfg: DictConfig) -> None:
    """The evaluation's settings (pipelines.evaluate may change them), before anything is written."""
    keys = ("eval_max_digits", "examples_per_cell", "eval_batch_size", "eval_seed")
    require_int(task_cfg, *keys, prefix="task.")
    for key in keys:
        value = task_cfg[key]
        if value < (0 if key == "eval_seed" else 1):
            raise PipelineConfigError(f"task.{key}={value} must be >= {0 if key == 'eval_seed' else 1}")


def check_model(mc: Any, task_cfg: DictConfig) -> None:
    """The test grid fits the model's Abacus table (re-evaluated beyond it, the run's eval
    directory was claimed first)."""
    check_abacus_range(mc, int(task_cfg.eval_max_digits), "task.eval_max_digits", training=False)


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest test sum, and the key that sets it."""
    from tape.data.addition import max_sequence_length

    return max_sequence_length(int(task_cfg.eval_max_digits)), "task.eval_max_digits"


def datamodule(cfg: DictConfig) -> AdditionDataModule:
    from tape.lightning import AdditionDataModule

    t = cfg.task
    return AdditionDataModule(
        max_digits=t.max_digits, batch_size=t.batch_size, val_examples=t.val_examples, seed=cfg.seed
    )


def grid_rows(rows: list[Row], cfg: DictConfig) -> list[Row]:
    """Addition grid cells with their accuracy in %."""
    return [{**r, "accuracy": 100.0 * r["correct"] / r["n"]} for r in rows]


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Grid of [1..eval_max_digits]^2 -> grid.csv, heatmap.png and the summary metrics."""
    from tape.metrics.arithmetic import evaluate_grid, summarize, write_grid_csv
    from tape.report.heatmap import plot_heatmap

    mc = getattr(model, "cfg", None)  # our DecoderLM: refuse a grid its Abacus table cannot index
    check_abacus_range(mc, int(task_cfg.eval_max_digits), "task.eval_max_digits", training=False)
    t0 = time.perf_counter()
    cells = evaluate_grid(
        model, task_cfg.eval_max_digits, task_cfg.examples_per_cell, task_cfg.eval_seed,
        batch_size=task_cfg.eval_batch_size,
    )
    metrics = summarize(cells, task_cfg.max_digits)  # OOD exact match and OOD digit accuracy
    write_grid_csv(cells, out_dir / "grid.csv")
    plot_heatmap(cells, task_cfg.max_digits, f"{title}: mean {metrics['mean_accuracy']:.2f}%",
                 out_dir / "heatmap.png")
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("addition")
class Addition(Task):
    """Integer addition: train on sums up to task.max_digits, test the whole digit grid."""

    wandb_tables = {"grid.csv": WandbTable("eval/grid", prepare=grid_rows)}
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    check = staticmethod(check)
    check_model = staticmethod(check_model)
    positions_needed = staticmethod(positions_needed)
