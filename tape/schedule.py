"""Learning-rate schedules shared by every training loop (Lightning modules and plain loops).
Imports torch only to build the optimizer, so the config checks (``optim_problems``) stay light."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import torch
    from torch import Tensor

SCHEDULES = ("constant", "cosine", "linear")


def optim_problems(lr: float, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                   weight_decay: float = 0.0, warmup_steps: int = 0, schedule: str = "cosine",
                   min_lr_ratio: float = 0.1, **_: object) -> list[str]:
    """What AdamW and the schedule would refuse (or silently misuse), as ``key=value: why``."""
    problems = []
    if not lr > 0:
        problems.append(f"lr={lr}: must be > 0")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        problems.append(f"betas={list(betas)}: two values in [0, 1)")
    if not eps > 0:
        problems.append(f"eps={eps}: must be > 0")
    if not weight_decay >= 0:
        problems.append(f"weight_decay={weight_decay}: must be >= 0")
    if not warmup_steps >= 0:
        problems.append(f"warmup_steps={warmup_steps}: must be >= 0")
    if schedule not in SCHEDULES:
        problems.append(f"schedule={schedule}: choose one of {list(SCHEDULES)}")
    if not 0 <= min_lr_ratio <= 1:
        problems.append(f"min_lr_ratio={min_lr_ratio}: must be in [0, 1]")
    return problems


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str = "cosine",
              min_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based): linear warm-up
    over ``warmup_steps``, then constant, cosine or linear decay to ``min_ratio`` at
    ``total_steps`` (linear = Hugging Face's polynomial schedule with power 1, the paper's)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"optim.schedule={schedule!r}; choose one of {list(SCHEDULES)}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw_with_schedule(
    params: Iterable[tuple[str, Tensor]], lr: float, betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8, weight_decay: float = 0.0, warmup_steps: int = 0, total_steps: int = 1000,
    schedule: str = "cosine", min_lr_ratio: float = 0.1,
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable ``(name, parameter)`` pairs (weight decay on matrices only) and
    its per-step :func:`lr_factor` schedule. Refuses parameters that are not fp32: Adam steps of
    about lr = 2e-5 vanish below half a bf16 ulp, so low precision belongs in autocast only."""
    import torch

    trainable = [(n, p) for n, p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    low = [n for n, p in trainable if p.dtype != torch.float32]
    if low:
        raise ValueError(f"trainable parameters must be float32 (low precision only through autocast, "
                         f"trainer.precision); got {sorted({str(p.dtype) for n, p in trainable if n in low})} for {low[:3]}")
    decay = [p for _, p in trainable if p.ndim >= 2]
    no_decay = [p for _, p in trainable if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=tuple(betas), eps=eps,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, schedule, min_lr_ratio))
    return optimizer, scheduler
