"""Sweep the Triton attention kernels' launch configurations on a GPU: what fills
``tuning.TUNED``."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable

import torch
from triton.runtime.errors import OutOfResources

from tape.kernels.triton_attention import _block, attention_backward, attention_forward
from tape.kernels.tuning import (
    BACKWARD_CANDIDATES,
    FORWARD_CANDIDATES,
    KERNELS,
    LaunchConfig,
    dtype_name,
    forcing,
    untuned,
)


def _time_ms(fn: Callable[[], object], device: str) -> float:
    """Mean milliseconds of ``fn``: triton's do_bench on CUDA, one timed call elsewhere."""
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=50))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def sweep(dtype: torch.dtype, head_dim: int, batch: int = 2, heads: int = 16, n: int = 2048,
          device: str = "cuda", forward: tuple[LaunchConfig, ...] = FORWARD_CANDIDATES,
          backward: tuple[LaunchConfig, ...] = BACKWARD_CANDIDATES) -> dict[str, dict]:
    """Time each candidate of each kernel on (batch, heads, n, head_dim) inputs, the other
    kernels as the code launches them; per kernel the best, the kernels' own default's time
    (``default_ms``: nothing tuned), the code's current choice's (``current_ms``: ``TUNED``), and
    every candidate's (None where it did not launch, e.g. out of shared memory). A backward
    kernel's times are the whole backward's (its two kernels and the Δ pass)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, e = (torch.randn(batch, heads, n, head_dim, generator=gen).to(device, dtype) for _ in range(4))
    o, oe, lse = attention_forward(q, k, v, e)
    do, doe = torch.randn_like(o), torch.randn_like(oe)
    run: dict[str, Callable[[], object]] = {
        "_fwd": lambda: attention_forward(q, k, v, e),
        "_bwd_dkdvde": lambda: attention_backward(q, k, v, e, o, oe, lse, do, doe),
        "_bwd_dq": lambda: attention_backward(q, k, v, e, o, oe, lse, do, doe),
    }
    out = {}
    for kernel in KERNELS:
        with untuned():
            default_ms = _time_ms(run[kernel], device)
        current_ms = _time_ms(run[kernel], device)
        times: dict[LaunchConfig, float | None] = {}
        for cfg in forward if kernel == "_fwd" else backward:
            try:
                with forcing(kernel, cfg):
                    times[cfg] = _time_ms(run[kernel], device)
            except OutOfResources:
                times[cfg] = None
        ran = {c: t for c, t in times.items() if t is not None}
        best = min(ran, key=ran.__getitem__) if ran else None
        out[f"{kernel}/{dtype_name(dtype)}/{_block(head_dim)}"] = {
            "best": asdict(best) if best else None, "best_ms": ran[best] if best else None,
            "default_ms": default_ms, "current_ms": current_ms,
            "times_ms": {c.label: t for c, t in times.items()},
        }
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m tape.kernels.autotune``: one JSON line of sweeps (bf16 at head dims 64 and 128
    by default; fp32 compiles take minutes per candidate)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m tape.kernels.autotune", description=main.__doc__)
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated: bfloat16,float16,float32")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    if args.device != "cuda":
        p.exit(2, "python -m tape.kernels.autotune: --device cuda only: on a CPU the kernels run under "
                  "Triton's interpreter, where launch configurations change nothing and times say nothing\n")
    out: dict[str, dict] = {}
    for name in args.dtypes.split(","):
        for head_dim in map(int, args.head_dims.split(",")):
            out |= sweep(getattr(torch, name), head_dim, n=args.n, device=args.device)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
