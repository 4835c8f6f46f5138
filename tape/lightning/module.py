"""CausalLMModule: trains a DecoderLM on next-token loss restricted by a label mask.

Batches are dicts with ``input_ids`` (B, N) and ``labels`` (B, N); labels equal to IGNORE_INDEX
(prompt, padding) do not count. Randomness inside a training step (RandPE's random positions)
is reseeded from (seed, rank, batch index) at every batch, so a run resumed from a checkpoint
replays exactly what an uninterrupted run would have done (eager; compiled CPU steps repeat
exactly at one thread only). ``compile_model`` runs training steps through torch.compile
(docs/devices.md, "Compiled training").
"""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

import tape.pe as pe_registry
from tape.data.labels import IGNORE_INDEX
from tape.model import DecoderLM, ModelConfig
from tape.model.compiling import compile_model
from tape.lightning.distributed import clip_gradients
from tape.schedule import adamw_with_schedule


class CausalLMModule(L.LightningModule):
    """A DecoderLM with AdamW, warm-up + cosine schedule and masked next-token loss."""

    def __init__(
        self,
        model: dict[str, Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        warmup_steps: int = 0,
        schedule: str = "cosine",
        min_lr_ratio: float = 0.1,
        total_steps: int = 1000,
        seed: int = 0,
        compile_model: bool = False,
    ) -> None:
        super().__init__()
        # The checkpoint alone can rebuild the model; compiling is how this run trains, not what.
        self.save_hyperparameters(ignore=["compile_model"])
        self.model = DecoderLM(ModelConfig.from_dict(pe_registry.legacy_options(dict(model))))
        self.compile_model = compile_model
        self._compiled: dict[str, Any] = {}  # a plain dict: the compiled wrapper is no submodule

    def forward(self, input_ids: Tensor) -> Tensor:
        return self._model_for_step()(input_ids).logits  # (B, N, V)

    def _model_for_step(self) -> Any:
        """The model through torch.compile in training when ``compile_model`` is set (built at the
        first training step, after the strategy has moved and wrapped the model); else eager.
        Validation and evaluation stay eager: their shapes change (decoding with a cache)."""
        if not (self.compile_model and self.training):
            return self.model
        if "train" not in self._compiled:
            self._compiled["train"] = compile_model(self.model)  # torch.compile, guarded on old CPU torch
        return self._compiled["train"]

    def _scored(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Logits (B, N-1, V), targets (B, N-1) and the mask of scored positions (B, N-1).
        No boolean indexing: selecting the scored rows would wait for the GPU every step."""
        logits = self(batch["input_ids"])[:, :-1]  # (B, N-1, V): position t predicts t+1
        targets = batch["labels"][:, 1:]  # (B, N-1)
        return logits, targets, targets != IGNORE_INDEX

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """The batch index stays a host int (reading it back from the GPU would sync)."""
        if isinstance(batch, dict) and isinstance(batch.get("batch_index"), Tensor):
            batch = {**batch, "batch_index": int(batch["batch_index"])}
        return batch

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """The optimizer step's loss is its mean NLL over every scored target of its accumulated
        batches and of every rank, as one large batch would have it (batches score different
        counts): this batch returns its NLL sum over the step's count (``step_scored``, from
        ``tape.lightning.datamodule.StepWindows``), times what Lightning divides by (the
        accumulated batches) and DDP/FSDP average over (the ranks). train/loss is logged once
        per step, the step's mean. A batch without ``step_scored`` counts as a step of its own."""
        self._reseed(int(batch["batch_index"]))
        logits, targets, mask = self._scored(batch)
        nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                              reduction="sum")
        local = batch.get("step_scored", mask.sum())  # scored targets of the step on this rank
        first, last = batch.get("step_first", True), batch.get("step_last", True)
        accumulate, ranks = self._step_scale()
        share = nll / self._all_ranks(local).clamp(min=1)  # this batch's part of the step's mean
        self._step_loss = share.detach() if first else self._step_loss + share.detach()
        if last:
            self.log("train/loss", self._all_ranks(self._step_loss), prog_bar=True,
                     batch_size=batch["input_ids"].shape[0])
        return share * (accumulate * ranks)

    def _step_scale(self) -> tuple[int, int]:
        """(batches accumulated per optimizer step, ranks); (1, 1) outside a Trainer."""
        trainer = getattr(self, "_trainer", None)
        return (1, 1) if trainer is None else (trainer.accumulate_grad_batches, trainer.world_size)

    def _all_ranks(self, value: Tensor) -> Tensor:
        """The sum of a per-rank value over the ranks: a collective on the device, no host wait
        (Lightning's ``strategy.reduce`` adds a barrier, which blocks the host on NCCL)."""
        if self._step_scale()[1] == 1:
            return value.to(torch.float32)
        import torch.distributed as dist

        total = value.to(torch.float32, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, targets, mask = self._scored(batch)
        right = logits.argmax(-1) == targets  # (B, N-1)
        nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                              reduction="sum")
        self._val_sums += torch.stack([nll, (right & mask).sum(), mask.sum()]).to(self._val_sums.dtype)
        # Teacher-forced argmax right on every answer token <=> greedy decoding gets it right.
        exact = (right | ~mask).all(dim=1).float().mean()
        self.log("val/exact_match", exact, prog_bar=True, batch_size=batch["input_ids"].shape[0], sync_dist=True)

    def on_validation_epoch_start(self) -> None:
        """Validation loss and token accuracy pool the scored tokens of every batch and rank
        (batches score different counts): sums on the device, read once at the end."""
        self._val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # NLL, right, scored

    def on_validation_epoch_end(self) -> None:
        nll, right, tokens = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum").tolist()
        scored = tokens > 0  # no scored token: nothing to average
        # every rank holds the same pooled values: sync_dist averages equals (and keeps Lightning quiet)
        self.log("val/loss", nll / tokens if scored else float("nan"), prog_bar=True, sync_dist=True)
        self.log("val/token_accuracy", right / tokens if scored else float("nan"), sync_dist=True)

    def _reseed(self, batch_index: int) -> None:
        """Seed torch's global RNG from (seed, rank, batch index): the step's randomness no
        longer depends on how many steps this process has run (exact resume)."""
        words = [self.hparams.seed, self.global_rank, batch_index]
        torch.manual_seed(int(np.random.SeedSequence(words).generate_state(1)[0]))

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)  # FSDP: its own norm

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer, scheduler = adamw_with_schedule(
            self.named_parameters(), hp.lr, tuple(hp.betas), hp.eps, hp.weight_decay,
            hp.warmup_steps, hp.total_steps, hp.schedule, hp.min_lr_ratio)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
