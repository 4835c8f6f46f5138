"""The variable-length synthetic tasks (parity: bits, MQAR: pairs, selective copy: slots,
counting: operations): :class:`SizedTask` (their config checks, data module and evaluation, once),
the tested sizes, teacher-forced scoring of fixed test sets, one CSV row per size, and the summary
metrics.

Not a task (the registry skips modules whose name starts with ``_``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np
from omegaconf import DictConfig, open_dict

from pipelines.errors import PipelineConfigError
from pipelines.models import check_model_vocab, check_position_range, model_config
from pipelines.result_files import write_csv
from pipelines.tasks.base import Task, WandbTable
from tape.data.synthetic import ANSWER, STEP, as_batch, scored_roles, teacher_forced_hits

if TYPE_CHECKING:
    from tape.lightning.synthetic import SyntheticDataModule

TestSet = Callable[[int], tuple[np.ndarray, np.ndarray]]  # size -> (tokens, roles), each (B, T)


def tested_sizes(trained_max: int, multiplier: int, every: int, smallest: int = 1) -> list[int]:
    """Every ``every``-th size from ``smallest`` up to multiplier * trained_max, and each
    k * trained_max."""
    top = multiplier * trained_max
    return sorted({n for n in range(smallest, top + 1) if n % every == 0 or n % trained_max == 0})


def score(model: Any, tokens: np.ndarray, roles: np.ndarray, batch_size: int,
          score_copies: bool = False) -> dict[str, float]:
    """Accuracy (%) of the scratchpad steps and of the answers (NaN where there are none), and
    the exact match: every scored token right under teacher forcing, which is exactly when
    greedy decoding (given tokens forced) reproduces the whole scored part."""
    hits = teacher_forced_hits(model, tokens, batch_size)  # (B, T)
    scored = np.isin(roles, scored_roles(score_copies))
    out = {}
    for name, role in (("step_accuracy", STEP), ("answer_accuracy", ANSWER)):
        mask = roles == role
        out[name] = 100.0 * float(hits[mask].mean()) if mask.any() else float("nan")
    out["exact_match"] = 100.0 * float((hits | ~scored).all(axis=1).mean())
    return out


def evaluate_sizes(model: Any, sizes: Sequence[int], test_set: Callable[[int], tuple[np.ndarray, np.ndarray]],
                   batch_size: int, size_key: str, columns: Sequence[str],
                   score_copies: bool = False) -> list[dict[str, Any]]:
    """One row per size: ``size_key``, the tokens of a sequence, the count and ``columns``."""
    was_training = model.training
    model.eval()
    rows = []
    for size in sizes:
        tokens, roles = test_set(size)
        result = score(model, tokens, roles, batch_size, score_copies)
        rows.append({size_key: size, "tokens": tokens.shape[1], "sequences": len(tokens),
                     **{c: result[c] for c in columns}})
    model.train(was_training)
    return rows


def summary(rows: Sequence[dict[str, Any]], size_key: str, columns: Sequence[str], trained_max: int,
            multipliers: Sequence[int]) -> dict[str, float]:
    """Per column: ``<c>_id`` (mean over sizes <= trained_max), ``<c>_ood`` (mean over larger
    sizes) and ``<c>_<m>x`` (the size m * trained_max, where it was evaluated)."""
    out: dict[str, float] = {}
    for c in columns:
        ind = [r[c] for r in rows if r[size_key] <= trained_max]
        ood = [r[c] for r in rows if r[size_key] > trained_max]
        if ind:
            out[f"{c}_id"] = float(np.mean(ind))
        if ood:
            out[f"{c}_ood"] = float(np.mean(ood))
        by_size = {r[size_key]: r[c] for r in rows}
        for m in multipliers:
            if m * trained_max in by_size:
                out[f"{c}_{m}x"] = float(by_size[m * trained_max])
    return out


def evaluate_to_csv(model: Any, sizes: Sequence[int], test_set: Callable[[int], tuple[np.ndarray, np.ndarray]],
                    batch_size: int, size_key: str, columns: Sequence[str], trained_max: int, multiplier: int,
                    csv_path: Path, score_copies: bool = False, **fixed: Any) -> dict[str, float]:
    """Score every size, write one CSV row per size (``fixed`` columns first) and return the
    summary metrics with ``eval_time_s``."""
    t0 = time.perf_counter()
    rows = evaluate_sizes(model, sizes, test_set, batch_size, size_key, columns, score_copies)
    rows = [{**fixed, **r} for r in rows]
    metrics = summary(rows, size_key, columns, trained_max, range(1, multiplier + 1))
    write_csv(rows, list(rows[0]), csv_path)
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


class SizedTask(Task):
    """A task trained on sizes in [task.<min_key>, task.<max_key>] and tested at every size up to
    task.eval_multiplier times the largest; ``task.vocab_size`` and ``task.seq_len`` are null in
    its config and filled by :meth:`prepare`. A subclass names its keys and gives its generators."""

    size_key: ClassVar[str]  # the CSV column of the size ("bits")
    unit: ClassVar[str]  # one size unit in messages ("a 4-bit training example")
    min_key: ClassVar[str]
    max_key: ClassVar[str]
    positive: ClassVar[tuple[str, ...]]  # task keys that must be >= 1
    columns: ClassVar[tuple[str, ...]]  # the scores of each size, in % (CSV columns and metrics)
    vocabulary: ClassVar[str] = "vocabulary"  # its name in messages ("MQAR vocabulary")
    vocab_formula: ClassVar[str] = ""  # how the vocabulary size follows from task keys
    fills_from: ClassVar[str]  # the task keys vocab_size and seq_len follow from

    # ---------------------------------------------------------------- what a task gives
    def vocab_size(self, t: DictConfig) -> int:
        """Tokens of the task's vocabulary."""
        raise NotImplementedError

    def sequence_length(self, t: DictConfig, size: int) -> int:
        """Tokens of a sequence of ``size``."""
        raise NotImplementedError

    def training_batch(self, t: DictConfig, rng: np.random.Generator, batch: int) -> dict[str, Any]:
        """A random training batch (input_ids, labels) of sizes in the training range."""
        raise NotImplementedError

    def validation_set(self, t: DictConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The fixed validation sequences (tokens, roles)."""
        raise NotImplementedError

    def test_set(self, t: DictConfig) -> TestSet:
        """size -> the fixed test sequences of that size (tokens, roles)."""
        raise NotImplementedError

    def check_task(self, t: DictConfig) -> None:
        """The task's own checks, after the sizes' (default: none)."""

    def vocabulary_name(self, t: DictConfig) -> str:
        """The vocabulary as messages name it (default: ``vocabulary``)."""
        return self.vocabulary

    def score_copies(self, t: DictConfig) -> bool:
        """Whether copied tokens are scored and trained on (default: no)."""
        return False

    def sizes(self, t: DictConfig) -> list[int]:
        """The tested sizes: every ``eval_every``-th up to eval_multiplier x the largest trained,
        and each k times it."""
        return tested_sizes(int(t[self.max_key]), int(t.eval_multiplier), int(t.eval_every))

    def csv_columns(self, t: DictConfig) -> dict[str, Any]:
        """Columns written first in every CSV row (default: none)."""
        return {}

    # ---------------------------------------------------------------- the Task hooks
    @property
    def csv_name(self) -> str:
        return f"{self.name}.csv"

    @property
    def wandb_tables(self) -> dict[str, WandbTable]:  # type: ignore[override]
        return {self.csv_name: WandbTable(f"eval/{self.name}")}

    def prepare(self, cfg: DictConfig) -> None:
        """Fill ``task.vocab_size`` and ``task.seq_len`` (null) from the task's keys."""
        t = cfg.task
        with open_dict(cfg):
            if t.get("vocab_size") is None:
                t.vocab_size = self.vocab_size(t)
            if t.get("seq_len") is None:
                t.seq_len = self.sequence_length(t, int(t[self.max_key]))

    def positions_needed(self, task_cfg: DictConfig) -> tuple[int, str]:
        """Tokens of the longest test sequence, and the key that sets it."""
        return self.sequence_length(task_cfg, max(self.sizes(task_cfg))), "task.eval_multiplier"

    def validate(self, cfg: DictConfig) -> None:
        """Every impossible setting, before anything trains; each message names the key."""
        t = cfg.task
        for key in self.positive:
            if int(t[key]) < 1:
                raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
        if int(t[self.min_key]) > int(t[self.max_key]):
            raise PipelineConfigError(f"task.{self.min_key}={t[self.min_key]} must be <= "
                                      f"task.{self.max_key}={t[self.max_key]}")
        self.check_task(t)
        if t.vocab_size is None or t.seq_len is None:
            raise PipelineConfigError(f"task.vocab_size / task.seq_len is null: pipelines.train fills them from "
                                      f"{self.fills_from}; leave them null there")
        need_vocab, need_len = self.vocab_size(t), self.sequence_length(t, int(t[self.max_key]))
        formula = f"{self.vocab_formula} = {need_vocab}" if self.vocab_formula else str(need_vocab)
        if int(t.vocab_size) < need_vocab:
            raise PipelineConfigError(f"task.vocab_size={t.vocab_size} is smaller than the "
                                      f"{self.vocabulary_name(t)} ({formula}); leave it null")
        if int(t.seq_len) < need_len:
            raise PipelineConfigError(f"task.seq_len={t.seq_len} is shorter than a {t[self.max_key]}-{self.unit} "
                                      f"training example ({need_len} tokens); leave it null")
        mc = model_config(cfg)
        check_model_vocab(mc, need_vocab, self.vocabulary_name(t))
        check_position_range(mc, int(t.seq_len), f"task.{self.max_key}")
        check_position_range(mc, *self.positions_needed(t))

    def datamodule(self, cfg: DictConfig) -> SyntheticDataModule:
        from tape.lightning.synthetic import SyntheticDataModule  # Lightning: after the checks

        t, seed, copies = cfg.task, int(cfg.seed), self.score_copies(cfg.task)
        return SyntheticDataModule(lambda rng, b: self.training_batch(t, rng, b),
                                   lambda: as_batch(*self.validation_set(t, seed), copies),
                                   int(t.batch_size), seed, int(t.vocab_size))

    def evaluate(self, model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
        """The scores (%) at every tested size -> <task>.csv + metrics."""
        t = task_cfg
        return evaluate_to_csv(model, self.sizes(t), self.test_set(t), int(t.eval_batch_size), self.size_key,
                               self.columns, int(t[self.max_key]), int(t.eval_multiplier), out_dir / self.csv_name,
                               self.score_copies(t), **self.csv_columns(t))
