"""The interface every task implements; each hook has a default, so a task overrides only what
it needs (as ``tape.pe.base.LayerPE`` does for encodings).

A training task gives ``validate`` and ``datamodule`` (and usually ``evaluate``); an evaluation
task sets ``trains = False`` and gives ``evaluate`` and ``adopt``; a task of several fits
(context extension) sets ``runs_itself = True`` and gives ``run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, NamedTuple

from omegaconf import DictConfig

from pipelines.errors import PipelineConfigError, evaluation_only
from pipelines.result_files import Row, read_csv_rows
from tape.data.tokenizer import TextTokenizer, load_tokenizer

if TYPE_CHECKING:
    from torch import nn


def as_written(rows: list[Row], cfg: DictConfig) -> list[Row]:
    """A result file's rows unchanged (a WandbTable's default preparation)."""
    return rows


def task_tokenizer(task_cfg: DictConfig) -> TextTokenizer:
    """The tokenizer ``task.tokenizer`` names (our BPE's tokenizer.json or a Hugging Face
    directory); unset or missing, an error naming the key."""
    if not task_cfg.tokenizer:
        raise PipelineConfigError("task.tokenizer is not set: a tokenizer.json of our BPE or a "
                                  "Hugging Face tokenizer directory")
    try:
        return load_tokenizer(str(task_cfg.tokenizer))
    except FileNotFoundError as err:
        raise PipelineConfigError(f"task.tokenizer={task_cfg.tokenizer}: {err}") from None


class WandbTable(NamedTuple):
    """How a result file the task writes becomes a ``wandb.Table``: its key, reader (default:
    a CSV) and row preparation (rows, run config) -> rows."""

    key: str
    read: Callable[[Path], list[Row]] = read_csv_rows
    prepare: Callable[[list[Row], DictConfig], list[Row]] = as_written


class Task:
    """A task (``task.name``): its config checks, data, evaluation and result files."""

    name: ClassVar[str] = ""  # set by pipelines.tasks.register
    trains: ClassVar[bool] = True  # False: pipelines.train refuses it (pipelines.evaluate runs it)
    runs_itself: ClassVar[bool] = False  # True: pipelines.train hands the whole run to ``run``
    prepare_reads_runs: ClassVar[bool] = False  # True: ``prepare`` needs another run, not only conf/
    wandb_tables: ClassVar[Mapping[str, WandbTable]] = {}  # run-dir file -> its W&B table

    def prepare(self, cfg: DictConfig) -> None:
        """Complete the config in place before validation (e.g. adopt a pretrained run's model)."""

    def validate(self, cfg: DictConfig) -> None:
        """Raise PipelineConfigError for any setting that cannot work, before any training."""
        self.refuse_training()

    def datamodule(self, cfg: DictConfig) -> Any:
        """The LightningDataModule (with ``vocab_size``) that trains this task."""
        self.refuse_training()
        raise NotImplementedError(f"task {self.name} trains but gives no datamodule")

    def initialize(self, model: nn.Module, cfg: DictConfig) -> None:
        """Change a fresh (not resumed) model before training, e.g. load pretrained weights."""

    def evaluate(self, model: nn.Module, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, Any]:
        """Write the evaluation's artifacts into ``out_dir``; return flat metrics."""
        return {}

    def run(self, cfg: DictConfig) -> dict[str, Any]:
        """The whole run of a task of several fits (``runs_itself``): its metrics."""
        raise NotImplementedError(f"task {self.name} does not run itself")

    def positions_needed(self, task_cfg: DictConfig) -> tuple[int, str] | None:
        """(tokens, config key) the evaluation needs, checked against a model's trained range."""
        return None

    def check(self, task_cfg: DictConfig) -> None:
        """Check evaluation settings against an evaluated run (pipelines.evaluate, before loading)."""

    def check_model(self, model_cfg: Any, task_cfg: DictConfig) -> None:
        """Check evaluation settings against the evaluated model's ModelConfig (before loading)."""

    def adopt(self, task_cfg: DictConfig, source: Any, out_dir: Path) -> None:
        """Fill null settings from another run (a pipelines.run_source.RunSource) to evaluate it."""
        raise PipelineConfigError(
            f"task={self.name} cannot evaluate another run's model; pass task=passkey, "
            "task=perplexity or task=multiple_choice, or no task= to re-run the run's own evaluation"
        )

    def trained_tokenizer(self, run_cfg: DictConfig) -> str | None:
        """The text tokenizer a run of this task (its config.yaml) trained with (None: none)."""
        return None

    def heldout_files(self, run_cfg: DictConfig, out_dir: Path) -> dict[str, str] | None:
        """Token files (uint16) of such a run's held-out text by corpus, written into ``out_dir``
        where they must be made (None: the run has no held-out text)."""
        return None

    def refuse_training(self) -> None:
        """An evaluation task (``trains = False``) says how to run it instead."""
        if not self.trains:
            evaluation_only(self.name)
