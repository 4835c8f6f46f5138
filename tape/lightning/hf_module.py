"""HFCausalLMModule: trains a Hugging Face causal LM (a context-extension recipe applied, or a
fresh Llama) with the masked text + passkey loss and the shared AdamW schedule.

The module wraps a model built by the caller (recipes change its structure), so a checkpoint
restores into an identically rebuilt model. Trainable parameters must be fp32 (checked when the
optimizer is built); low precision comes from ``trainer.precision`` (autocast) only, and frozen
weights may be stored in bf16 to save memory.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from tape.hf.loss import scored_parts, split_losses, weighted_loss
from tape.lightning.distributed import clip_gradients
from tape.schedule import adamw_with_schedule

log = logging.getLogger("tape.lightning")


class HFCausalLMModule(L.LightningModule):
    """One training stage of a Hugging Face causal LM; metrics are logged as ``<stage>/<name>``."""

    def __init__(
        self,
        model: nn.Module,
        stage: str = "train",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        schedule: str = "constant",
        min_lr_ratio: float = 0.1,
        total_steps: int = 1000,
        passkey_weight: float = 1.0,
        log_every: int = 10,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["model"])
        self.model = model
        self.start_step = 0  # the step this fit started at (> 0 when resumed from a checkpoint)
        self.history: list[dict[str, float]] = []  # the logged points {step, loss..., lr}: kept with
        # the saved model, so a later run that reuses it can show the training curves too

    def on_train_start(self) -> None:
        self.start_step = self.trainer.global_step

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits  # (B, N, V); HF would keep a KV cache

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Which loss parts the batch scores, found on the host (on the GPU it would wait)."""
        if isinstance(batch, dict) and "labels" in batch:
            batch = {**batch, "scored_parts": scored_parts(batch["labels"], batch.get("passkey"))}
        return batch

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """The batch's weighted loss; the losses are logged once per optimizer step, as the mean
        over its accumulated batches (what the step optimises; ``step_first`` / ``step_last``
        from ``tape.lightning.datamodule.StepWindows``; a batch without them is its own step)."""
        logits = self(batch["input_ids"])  # (B, N, V)
        parts = split_losses(logits, batch["labels"], batch.get("passkey"), batch.get("scored_parts"))
        loss = weighted_loss(parts, self.hparams.passkey_weight, logits)
        values = {"loss": loss.detach(), **{f"loss_{k}": v.detach() for k, v in parts.items()}}
        if batch.get("step_first", True):
            self._step_sums: dict[str, list] = {}
        for key, value in values.items():  # a part a batch lacks (no passkey rows) is not averaged in
            total, count = self._step_sums.get(key, (0.0, 0))
            self._step_sums[key] = (total + value, count + 1)
        if batch.get("step_last", True):
            b, name = batch["input_ids"].shape[0], self.hparams.stage
            for key, (total, count) in self._step_sums.items():
                self.log(f"{name}/{key}", total / count, prog_bar=key == "loss", batch_size=b)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """A log line every ``log_every`` optimizer steps (and at the last), on rank 0."""
        at_step_end = (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0
        point = self._curve_point() if self.trainer.is_global_zero and at_step_end else None
        if point is None:
            return
        self.history.append(point)
        values = {k: v for k, v in point.items() if k not in ("step", "lr")}
        log.info("%s step %d: %s lr=%.3g", self.hparams.stage, point["step"],
                 " ".join(f"{k}={v:.4g}" for k, v in sorted(values.items())), point["lr"])

    def _curve_point(self) -> dict[str, float] | None:
        """The training curve's point {step, losses..., lr} for the optimizer step just done, or
        None where this step logs none (every ``log_every`` steps and the last)."""
        step, hp = self.trainer.global_step, self.hparams
        if not ((step - 1) % max(1, hp.log_every) == 0 or step == self.trainer.max_steps):
            return None
        values = {k.split("/", 1)[1]: float(v) for k, v in self.trainer.callback_metrics.items()
                  if k.startswith(f"{hp.stage}/")}
        return {"step": step, **values, "lr": self.trainer.optimizers[0].param_groups[0]["lr"]}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The training curve so far travels in the checkpoint, so a resumed stage's curve starts
        at step 1. A step's checkpoint is written before this module's batch-end hook runs
        (Lightning calls callbacks first): that step's point, when it has one, is added here."""
        points = list(self.history)
        due = self._curve_point() if self.trainer.global_step > 0 else None
        if due is not None and (not points or points[-1]["step"] < due["step"]):
            points.append(due)
        checkpoint["tape_history"] = points

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.history = list(checkpoint.get("tape_history", []))

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)  # FSDP: its own norm

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer, scheduler = adamw_with_schedule(
            self.model.named_parameters(), hp.lr, tuple(hp.betas), hp.eps, hp.weight_decay,
            hp.warmup_steps, hp.total_steps, hp.schedule, hp.min_lr_ratio)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
