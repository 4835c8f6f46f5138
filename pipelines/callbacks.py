"""Console callbacks of the training runs (conf/callbacks/default.yaml): a progress bar that counts
optimizer steps, a one-line model summary, and progress lines when the output goes to a file. Lightning's defaults showed "Epoch 0/-2" (training
is step-based over an endless stream, so max_epochs is -1), "600/499" after a resume (batches of
the resumed epoch against a total that ignores the steps already done) and "Total FLOPs: 0"
(nothing gives the summary an example input)."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelSummary, RichProgressBar
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


class ProgressLog(Callback):
    """With output going to a file (stdout not a terminal, where the progress bar draws nothing),
    a log line every ``interval_s`` seconds: step, loss, tokens/s and the time left."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 force: bool = False) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.active = force or not sys.stdout.isatty()
        self._start: tuple[float, int] | None = None
        self._last = 0.0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if not self.active or not trainer.is_global_zero:
            return
        now, step = self.clock(), trainer.global_step
        if self._start is None:
            self._start, self._last = (now, step), now
            return
        if now - self._last < self.interval_s:
            return
        self._last = now
        rate = (step - self._start[1]) / max(now - self._start[0], 1e-9)  # steps per second
        left = (trainer.max_steps - step) / rate if rate > 0 and trainer.max_steps > 0 else float("nan")
        metrics = trainer.callback_metrics
        loss = metrics.get("train/loss")
        tokens = metrics.get("train/tokens_per_s")
        log.info("step %d/%d  loss %s  tokens/s %s  left %s", step, trainer.max_steps,
                 f"{float(loss):.4f}" if loss is not None else "-",
                 f"{float(tokens):.0f}" if tokens is not None else "-",
                 time.strftime("%H:%M:%S", time.gmtime(left)) if left == left else "-")


class InterruptAt(Callback):
    """A Ctrl-C at the start of optimizer step ``step`` (after the checkpoints before it): the run
    stops unfinished, as a killed one, so that ``ckpt_path=last`` can be proven on any device
    (``make gpu-check``: ``+callbacks.interrupt._target_=pipelines.callbacks.InterruptAt
    +callbacks.interrupt.step=4``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt(f"InterruptAt: step {self.step}")


class StepClock(Callback):
    """Seconds per optimizer step once warmed up: the device is waited for at step ``after`` and
    at ``trainer.max_steps`` only (no wait in between), and the result goes to ``path`` as JSON
    (``make gpu-measure``'s timed presets: ``python -m pipelines.gpu_check preset``)."""

    def __init__(self, path: str, after: int = 10) -> None:
        self.path, self.after = path, after
        self._start: tuple[int, float] | None = None  # (step, seconds) where the clock started
        self._written = False

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps done; it moves on a step's last micro-batch
        if self._written or step < self.after:
            return
        if self._start is None:
            self._start = (step, _synced_clock(pl_module))
        elif step >= trainer.max_steps:
            first, t0 = self._start
            seconds = _synced_clock(pl_module) - t0
            Path(self.path).write_text(json.dumps({"after": first, "steps": step - first, "seconds": seconds,
                                                   "s_per_step": seconds / (step - first)}))
            self._written = True


def _synced_clock(pl_module: LightningModule) -> float:
    """time.perf_counter() once the module's device has finished its queued work."""
    if pl_module.device.type == "cuda":
        import torch

        torch.cuda.synchronize(pl_module.device)
    return time.perf_counter()
