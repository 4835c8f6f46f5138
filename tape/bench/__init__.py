"""Efficiency benchmark helpers (pure PyTorch): parameter and FLOP counts on the meta device,
a per-layer attention-operator microbenchmark, a full training step, timers and memory probes.

``pipelines/benchmark.py`` drives them from Hydra; ``run_benchmark`` can be called directly.
"""

from tape.bench.run import BenchSettings, OpSettings, TrainSettings, run_benchmark
from tape.bench.variants import Variant, make_variants

__all__ = [
    "BenchSettings", "OpSettings", "TrainSettings", "Variant", "make_variants", "run_benchmark",
]
