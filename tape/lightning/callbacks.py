"""Training callbacks: throughput in tokens per second."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from tape.data.labels import PAD_ID


class TokensPerSecond(Callback):
    """Logs ``train/tokens_per_s``: non-padding input tokens over wall time between optimizer
    steps (data, forward, backward and optimizer included), times the world size (every rank
    trains on equally sized batches), averaged over ``log_every_n_steps``."""

    def __init__(self, pad_id: int = PAD_ID) -> None:
        self.pad_id = pad_id
        self._tokens: Tensor | int = 0  # a device tensor between logs: read back once per log
        self._t0: float | None = None
        self._val_start = 0.0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._t0 is not None:  # validation time is not training throughput
            self._t0 += time.perf_counter() - self._val_start

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._tokens = self._tokens + (batch["input_ids"] != self.pad_id).sum()
        if (batch_idx + 1) % max(1, trainer.log_every_n_steps) or self._t0 is None:
            return
        tokens = int(self._tokens)  # the one wait for the GPU per log interval, before timing
        elapsed = time.perf_counter() - self._t0
        rate = tokens * trainer.world_size / max(elapsed, 1e-9)
        pl_module.log("train/tokens_per_s", rate, batch_size=1)
        self._tokens, self._t0 = 0, time.perf_counter()
