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
    nonfinite: int = 0  # values left out as NaN or infinite (a diverged run): said in the cell

    def format(self, digits: int = 2) -> str:
        cell = f"{self.mean:.{digits}f}" if self.std is None else f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"
        return cell + (f" (n = {self.n}; {self.nonfinite} non-finite left out)" if self.nonfinite else "")


@dataclass(frozen=True)
class Missing:
    """A cell with no number, and why ("not run: data unavailable", "unfinished: ...")."""

    reason: str

    def format(self, digits: int = 2) -> str:
        return self.reason


def summarize(values: Sequence[float]) -> Summary | Missing:
    """Summary of the finite values, counting the non-finite ones it leaves out; Missing when
    there are none."""
    given = [float(v) for v in values if v is not None]
    finite = [v for v in given if math.isfinite(v)]
    if not finite:
        return Missing(f"no finite value ({len(given)} non-finite)" if given else "no finite value")
    n = len(finite)
    mean = math.fsum(finite) / n  # fsum: exact sums, so the runs' order cannot move the last digit
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else None
    return Summary(mean, std, n, len(given) - n)
