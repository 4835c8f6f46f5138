"""The numeric precision of an evaluation: the same autocast a run trained with, or what
``pipelines.evaluate precision=...`` asks for (bf16 autocast on a GPU by default)."""

from __future__ import annotations

import contextlib
from typing import ContextManager

from pipelines.errors import PipelineConfigError

AUTOCAST = ("bf16-mixed", "16-mixed")
FULL = ("32", "32-true")  # fp64 is not offered: trainable weights are fp32 (tape.schedule refuses others)
TRAINER_CHOICES = "32-true, bf16-mixed or 16-mixed"


def known_precision(precision: str, key: str, choices: str) -> str:
    """``precision`` when it is a full or a mixed (autocast) precision; else the error naming
    ``key`` and its ``choices``."""
    if precision not in (*AUTOCAST, *FULL):
        raise PipelineConfigError(f"{key}={precision}: choose {choices}")
    return precision


def training_precision(cfg) -> str:
    """``trainer.precision`` when the weights train in fp32 (autocast lowers the rest); else the
    error naming the choices, before training starts (``check_trainer``)."""
    return known_precision(str(cfg.trainer.precision), "trainer.precision", TRAINER_CHOICES)


def evaluation_precision(cfg) -> str:
    """The precision of ``pipelines.train``'s evaluation: ``eval_precision``, else the trainer's;
    an unknown value is named before training starts (``check_trainer``)."""
    value = cfg.get("eval_precision")
    if value is None:
        return training_precision(cfg)
    return known_precision(str(value), "eval_precision", "null (the trainer's), 32, bf16-mixed or 16-mixed")


def device_default(device_type: str) -> str:
    """``auto``'s precision on a device: bf16 autocast on a GPU, fp32 elsewhere."""
    return "bf16-mixed" if device_type == "cuda" else "32"


def eval_autocast(device_type: str, precision: str) -> ContextManager:
    """A context for evaluating on ``device_type`` at ``precision``: ``auto`` (bf16 autocast on
    a GPU, fp32 on a CPU), a Lightning mixed precision (bf16-mixed, 16-mixed: autocast), or
    full precision (32, 32-true: no autocast). Weights stay as they are: only autocast lowers."""
    precision = str(precision)
    if precision == "auto":
        precision = device_default(device_type)
    if known_precision(precision, "precision", "auto, 32, bf16-mixed or 16-mixed") in FULL:
        return contextlib.nullcontext()
    import torch  # here, not at import: pipelines.train reports config errors before torch loads

    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16-mixed" else torch.float16)
