"""What a resumed run carries over from the run it resumes, besides weights and optimizer state.

A resumed run writes into a directory of its own, so its files alone must tell what the
uninterrupted run's would: the best checkpoint so far (``RunCheckpoint``), the training time and
the validation curve so far (``RunHistory``; the claims' ``steps_to`` and ``train_time_s`` read
them from the run's record).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose best survives a resume into another directory: Lightning then drops
    the best score, so the resumed run's best-*.ckpt was the best of its own validations only.
    The earlier best checkpoint is copied in and its score kept (``save_top_k=1``). And last.ckpt
    is written at every validation: Lightning 2.6 writes it only where a best one is saved, so a
    killed run went back to its last improvement (a resumed one, to the run it resumed)."""

    @property
    def _legacy_state_key(self) -> str:  # type: ignore[override]
        """Where checkpoints written with Lightning's ModelCheckpoint keep this state (Lightning
        looks there when ``state_key``, which names this class, is not found)."""
        return self.state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)
                and not self._should_save_on_train_epoch_end(trainer)):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        earlier, score = state_dict.get("best_model_path"), state_dict.get("best_model_score")
        if (state_dict.get("dirpath") in (None, self.dirpath) or self.save_top_k != 1 or score is None
                or not earlier or not Path(earlier).is_file()):
            return
        copy = Path(self.dirpath) / Path(earlier).name
        if rank_zero_only.rank == 0:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(earlier, copy)
        self.best_model_path = self.kth_best_model_path = str(copy)
        self.best_model_score = self.kth_value = score
        self.best_k_models = {str(copy): score}


class RunHistory(Callback):
    """The training time and validation metrics so far, kept in every checkpoint. A resumed run
    starts its CSV log with the validations before the checkpoint (W&B continues its own run and
    has them), and reports the whole training time."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config  # the run's resolved config: a checkpoint moved out of its run keeps it
        self.earlier_s = 0.0  # training time of the runs this one resumes
        self.rows: list[dict[str, float]] = []  # {"step": s, "val/...": v} per validation
        self.restored = 0  # of those, the rows read from the checkpoint
        self._start: float | None = None

    def elapsed_s(self) -> float:
        """Training time so far, resumed runs included (from this run's fit start)."""
        return self.earlier_s + (time.perf_counter() - self._start if self._start is not None else 0.0)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._start = time.perf_counter()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not (trainer.is_global_zero and self.restored):
            return
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                for row in self.rows[: self.restored]:
                    logger.log_metrics({k: v for k, v in row.items() if k != "step"}, step=int(row["step"]))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        values = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        step = trainer.fit_loop.epoch_loop._batches_that_stepped  # the step Lightning logged them at
        self.rows.append({"step": step, **values})

    def state_dict(self) -> dict[str, Any]:
        return {"train_time_s": self.elapsed_s(), "rows": self.rows, "config": self.config}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.earlier_s = float(state_dict.get("train_time_s", 0.0))
        self.rows = list(state_dict.get("rows", []))
        self.restored = len(self.rows)  # the config stays this run's own (check_resumable compared them)
