"""Mean ± standard deviation over seeds, and how a cell that has no number says why."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation (ddof = 1; None for a single seed) of ``n`` values."""

    mean: float
    std: float | None
    n: int

    def format(self, digits: int = 2) -> str:
        if self.std is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


@dataclass(frozen=True)
class Missing:
    """A cell with no number, and why ("not run: data unavailable", "unfinished: ...")."""

    reason: str

    def format(self, digits: int = 2) -> str:
        return self.reason


def summarize(values: Sequence[float]) -> Summary | Missing:
    """Summary of the finite values; Missing when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return Missing("no finite value")
    n = len(finite)
    mean = math.fsum(finite) / n  # fsum: exact sums, so the runs' order cannot move the last digit
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else None
    return Summary(mean, std, n)
