"""Where a training step's time goes: wall time against the device's busy time, kernel counts and
the kernels that take the most time, TAPE beside RoPE, at two batch sizes.

A step whose device is busy for a small share of its wall time is bound by the host (Python and
kernel launches), and there a TAPE/RoPE time ratio measures launch counts, not work. Run it with
``python -m tape.bench.step_profile`` (one JSON line; on CUDA the 155M model at 1024 tokens).
On CPU it counts instead the operators a step's forward and backward dispatch that would each
launch a kernel on a GPU (``tape.bench.dispatch_count``; the optimizer, foreach on a GPU, left out):
a stand-in for launches where no GPU is at hand. ``--variants`` picks the models
(``tape_triton``: TAPE through the Triton kernel, under the interpreter on a CPU).
``--compile`` runs every model through ``torch.compile`` (minutes of compiling on the GPU), which
removes most launches: the ratio that remains is the work's. ``--compile-mode reduce-overhead``
also replays each compiled graph as a CUDA graph (one launch for the graph's kernels).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any, Callable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from tape.bench.dispatch_count import device_ops
from tape.bench.timing import synchronize, time_interleaved
from tape.bench.train_step import TrainStep
from tape.bench.variants import TAPE_MODES, make_variants
from tape.model import ModelConfig

PAPER_SHAPE = dict(vocab_size=32000, n_layers=12, d_model=768, n_heads=12, max_seq_len=1024)
TINY_SHAPE = dict(vocab_size=64, n_layers=2, d_model=32, n_heads=2, max_seq_len=32)
VARIANTS = ("rope", "tape_fused", "tape_unfused")  # TAPE: auto's path (the Triton kernel on CUDA), two calls
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
COMPILED_VARIANTS = VARIANTS[:2]  # compiling takes minutes a model on a GPU: RoPE and auto's TAPE


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds)."""
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def profile_step(step: TrainStep, device: torch.device, steps: int) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step`` (already warm): per step, the device's busy time and
    kernel count, the 8 costliest kernels (CUDA); or the device operators its forward and
    backward dispatch (CPU, ``dispatch_count``)."""
    if device.type != "cuda":
        if hasattr(step.model, "_orig_mod"):  # compiled: counting would retrace it under the mode
            return {}
        total = 0
        for _ in range(steps):
            total += sum(device_ops(lambda: step.loss().backward()).values())
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
        return {"ops_per_step": total / steps}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    kernels = device_kernels(prof.events())
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    by_name: Counter[str] = Counter()
    for e in kernels:
        by_name[e.name[:80]] += e.time_range.elapsed_us()
    return {
        "kernels_per_step": len(kernels) / steps,
        "device_busy_ms": _busy_us(spans) / steps / 1e3,
        "top_kernels_ms": {name: round(us / steps / 1e3, 3) for name, us in by_name.most_common(8)},
    }


def _cudagraph_skips() -> int:
    """How often inductor has run a compiled graph without CUDA graphs so far (process-wide)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


def device_kernels(events: Sequence[Any]) -> list[Any]:
    """The profiler's device events that are work (kernels, copies), not its annotations: torch
    >= 2.2 also reports an annotated CPU region (``Optimizer.step#AdamW.step``) as a CUDA event
    spanning its first to its last kernel, host gaps included."""
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False)]


def step_profile(device: str = "cuda", batches: Sequence[int] = (4, 16), seq_len: int = 1024,
                 shape: dict | None = None, warmup: int = 3, timed: int = 10, profiled: int = 3,
                 compile_model: bool = False, compile_mode: str = "default",
                 labels: Sequence[str] | None = None, bf16: bool | None = None,
                 layers: int | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Per batch size and variant (``labels``, RoPE first): wall ms per step, the profile, and
    TAPE/RoPE ratios of both. ``bf16``: autocast (default: on CUDA only); ``layers`` replaces
    the shape's; ``on_row`` gets the results so far after each variant (a cut run keeps them)."""
    dev = torch.device(device)
    shape = dict(shape or (PAPER_SHAPE if dev.type == "cuda" else TINY_SHAPE))
    base = ModelConfig(**(shape if layers is None else {**shape, "n_layers": layers}))
    variants = {v.label: v for v in make_variants(["tape", "rope"], list(TAPE_MODES))}
    labels = list(labels or (COMPILED_VARIANTS if compile_model else VARIANTS))
    unknown = sorted(set(labels) - set(variants))
    if unknown or labels[0] != "rope":
        raise ValueError(f"variants {labels}: start with rope, then any of {sorted(set(variants) - {'rope'})}")
    autocast = torch.bfloat16 if (dev.type == "cuda" if bf16 is None else bf16) else None
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                           "seq_len": seq_len, "compiled": compile_model}
    if compile_model:
        out["compile_mode"] = compile_mode
    if autocast is not None:
        out["autocast"] = "bfloat16"
    for batch in batches:
        rows: dict[str, Any] = {}
        for label in labels:
            skips = _cudagraph_skips()
            step = TrainStep(variants[label].config(base), batch, seq_len, dev, autocast,
                             compile_model=compile_model, compile_mode=compile_mode)
            timing = time_interleaved({label: step}, warmup, timed, dev)[label]  # one model alone
            rows[label] = {"wall_ms": timing.median_s * 1e3, **profile_step(step, dev, profiled)}
            if compile_mode == "reduce-overhead":  # inductor may skip CUDA graphs with a warning only
                rows[label]["cudagraph_skips"] = _cudagraph_skips() - skips
            if "device_busy_ms" in rows[label]:
                rows[label]["busy_share"] = rows[label]["device_busy_ms"] / rows[label]["wall_ms"]
            del step
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            if label != "rope":
                for key in ("wall_ms", "device_busy_ms", "kernels_per_step", "ops_per_step"):
                    if key in rows[label]:
                        rows[label][f"{key}_vs_rope"] = rows[label][key] / rows["rope"][key]
            out[f"batch_{batch}"] = rows
            if on_row is not None:
                on_row(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tape.bench.step_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batches", default="4,16", help="comma-separated batch sizes (of seq-len tokens)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--compile", action="store_true", help="torch.compile every model first")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default=None,
                   help="torch.compile's mode (implies --compile); reduce-overhead adds CUDA graphs")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated, rope first (default {','.join(VARIANTS)}; compiled: "
                        f"{','.join(COMPILED_VARIANTS)}); tape_triton: TAPE through the Triton kernel")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast (default: on CUDA only)")
    p.add_argument("--layers", type=int, default=None, help="the model's layers (default: the shape's)")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    compiled = args.compile or args.compile_mode is not None
    labels = args.variants.split(",") if args.variants else None
    # one JSON line after each variant, the results so far: a step cut at its time limit keeps
    # what finished (the page reads the last line)
    step_profile(args.device, batches, args.seq_len, compile_model=compiled,
                 compile_mode=args.compile_mode or "default", labels=labels, bf16=args.bf16,
                 layers=args.layers, on_row=lambda out: print(json.dumps(out), flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
