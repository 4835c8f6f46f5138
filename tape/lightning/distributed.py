"""Distributed-training helpers that the trainer presets instantiate (conf/trainer/fsdp.yaml)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable, Sequence

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def autocast_only_precision() -> MixedPrecision:
    """FSDP keeps parameters, gradient reductions and buffers (rotary frequencies) in fp32;
    low precision comes only from the bf16 autocast Lightning opens for ``bf16-mixed``.
    Lightning's default for bf16-mixed casts all three, buffers included, to bf16."""
    return MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32, buffer_dtype=torch.float32)


def clip_gradients(module: L.LightningModule, optimizer: torch.optim.Optimizer,
                   gradient_clip_val: float | None, gradient_clip_algorithm: str | None) -> None:
    """Lightning's clipping, except norm clipping under FSDP, which Lightning refuses: there the
    sharded root module clips, with the norm over every shard (FSDP's ``clip_grad_norm_``)."""
    strategy = module.trainer.strategy
    if gradient_clip_val and gradient_clip_algorithm in (None, "norm") and isinstance(strategy, FSDPStrategy):
        strategy.model.clip_grad_norm_(gradient_clip_val)
        return
    module.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                          gradient_clip_algorithm=gradient_clip_algorithm)


def module_wrap_policy(classes: Sequence[str]) -> ModuleWrapPolicy:
    """FSDP's auto-wrap policy: one shard unit per module of any of ``classes`` (dotted paths,
    e.g. our decoder ``Block`` and Hugging Face's ``LlamaDecoderLayer``). A callable policy,
    not a list: Hydra hands lists to FSDP as a ListConfig, which FSDP cannot call."""
    if not classes:
        raise ValueError("module_wrap_policy needs at least one class path")
    return ModuleWrapPolicy({import_class(path) for path in classes})


def import_class(path: str) -> type:
    """The class at a dotted path (``package.module.Class``), with an error naming the path."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"auto_wrap_policy: cannot import {path!r}: {err}") from None


def trained_model(trainer: L.Trainer, module: L.LightningModule, build: Callable[[], nn.Module],
                  path: Path, through_checkpoint: bool | None = None) -> nn.Module | None:
    """The trained ``module.model`` with full weights on rank 0 (None on the other ranks). Under
    FSDP each rank holds shards only: the full state dict is gathered into the checkpoint file
    ``path`` (the preset's state_dict_type=full; a collective call) and loaded into ``build()``
    (``through_checkpoint`` forces that path)."""
    if through_checkpoint is None:
        through_checkpoint = isinstance(trainer.strategy, FSDPStrategy)
    if not through_checkpoint:
        return module.model if trainer.is_global_zero else None
    trainer.save_checkpoint(path, weights_only=True)  # collective: rank 0 writes full weights
    if not trainer.is_global_zero:
        return None
    model = build()
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    missing, unexpected = model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()},
                                                strict=False)
    if missing or unexpected:
        raise RuntimeError(f"the gathered checkpoint does not fit the rebuilt model: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return model
