"""Timing: warm-up, then interleaved rounds so that every variant sees the same drift.

Each call records wall time and this process's CPU time (all its threads): on a shared machine
other jobs stretch wall time while the process waits, but much less its own CPU time, so ratios
of CPU time are the steadier measure of the work (on CUDA only wall time means anything)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Timing:
    """Seconds per call over ``n`` timed calls (wall), and the process CPU seconds of each call."""

    median_s: float
    min_s: float
    max_s: float
    n: int
    samples_s: list[float] = field(default_factory=list)
    cpu_median_s: float | None = None
    cpu_samples_s: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, samples: list[float], cpu_samples: list[float] | None = None) -> "Timing":
        cpu = list(cpu_samples or [])
        return cls(statistics.median(samples), min(samples), max(samples), len(samples), list(samples),
                   statistics.median(cpu) if cpu else None, cpu)

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
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            synchronize(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            synchronize(device)
            samples[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: Timing.of(s, cpu[name]) for name, s in samples.items()}


def paired_ratio(num: Timing, den: Timing, cpu: bool = False) -> dict[str, float]:
    """Round-by-round ratios num/den (same round, same machine state): median, min, max, and
    ``stderr``: the median's standard error for roughly normal ratios, 1.2533 · (IQR / 1.349) / sqrt(n),
    a +- on how stable the median is."""
    a, b = (num.cpu_samples_s, den.cpu_samples_s) if cpu else (num.samples_s, den.samples_s)
    ratios = sorted(x / y for x, y in zip(a, b) if y > 0)
    if not ratios:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "stderr": float("nan")}
    q1, q3 = (statistics.quantiles(ratios, n=4)[i] for i in (0, 2)) if len(ratios) > 1 else (ratios[0],) * 2
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1],
            "stderr": 1.2533 * (q3 - q1) / 1.349 / len(ratios) ** 0.5}
