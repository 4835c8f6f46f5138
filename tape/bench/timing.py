"""Wall-clock timing: warm-up, then interleaved rounds so that every variant sees the same drift."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Timing:
    """Seconds per call over ``n`` timed calls."""

    median_s: float
    min_s: float
    max_s: float
    n: int
    samples_s: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, samples: list[float]) -> "Timing":
        return cls(statistics.median(samples), min(samples), max(samples), len(samples), list(samples))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (CUDA is asynchronous; the CPU is not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    fns: dict[str, Callable[[], Any]], warmup: int, repeats: int, device: torch.device
) -> dict[str, Timing]:
    """Time each callable ``repeats`` times after ``warmup`` untimed calls.

    Calls are interleaved round-robin (round r starts at variant r mod k), so slow phases of a
    shared machine hit every variant alike and the ratios stay pairwise comparable.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            synchronize(device)
            start = time.perf_counter()
            fns[name]()
            synchronize(device)
            samples[name].append(time.perf_counter() - start)
    return {name: Timing.of(s) for name, s in samples.items()}


def paired_ratio(num: Timing, den: Timing) -> dict[str, float]:
    """Round-by-round ratios num/den (same round, same machine state): median, min, max."""
    ratios = [a / b for a, b in zip(num.samples_s, den.samples_s)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
