"""Learning-rate schedules shared by every training loop (Lightning modules and plain loops)."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear")


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
