"""Console callbacks of the training runs (conf/callbacks/default.yaml): a progress bar that counts
optimizer steps, and a one-line model summary. Lightning's defaults showed "Epoch 0/-2" (training
is step-based over an endless stream, so max_epochs is -1), "600/499" after a resume (batches of
the resumed epoch against a total that ignores the steps already done) and "Total FLOPs: 0"
(nothing gives the summary an example input)."""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary, RichProgressBar
from lightning.pytorch.utilities.model_summary import get_human_readable_count

log = logging.getLogger("pipelines.train")


class StepProgressBar(RichProgressBar):
    """Rich progress bar whose training bar reads ``step <done>/<trainer.max_steps>``."""

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'Training steps':{len(self.validation_description)}}"

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.reset(self.train_progress_bar_id, total=trainer.max_steps,
                                completed=trainer.global_step, description=self._get_train_description(0))

    def _update(self, progress_bar_id: Any, current: int, visible: bool = True, hard: bool = False) -> None:
        if (self.progress is not None and progress_bar_id is not None
                and progress_bar_id == self.train_progress_bar_id):
            # optimizer steps, resumed ones included, out of max_steps (a resumed epoch's bar
            # is re-created with the batches left as its total)
            self.progress.update(progress_bar_id, total=self.trainer.max_steps)
            current = self.trainer.global_step
        super()._update(progress_bar_id, current, visible, hard)


class OneLineModelSummary(ModelSummary):
    """``model: 34.4 K parameters (34.4 K trainable), 0.14 MB``: the numbers that matter, once."""

    def __init__(self) -> None:
        super().__init__(max_depth=1)

    @staticmethod
    def summarize(summary_data: Any, total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int = 0,
                  **kwargs: Any) -> None:
        log.info("model: %s parameters (%s trainable), %.2f MB",
                 get_human_readable_count(total_parameters).strip(),
                 get_human_readable_count(trainable_parameters).strip(), model_size)
