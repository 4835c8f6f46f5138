"""Launch configurations of the Triton attention kernels, measured on a GPU.

``TUNED`` maps (kernel, dtype, head-dim tile) to the configuration ``sweep`` chose on a GPU; it
is filled from the JSON that ``tape.kernels.autotune.sweep`` prints on a GPU (device and date
beside each entry), so a GPU without time to autotune launches the measured choice. fp32 without a
measurement takes ``SPILL_FREE`` (read off compiled code). A kernel without an entry starts from
``triton_attention.default_block`` with Triton's default warps and stages.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

KERNELS = ("_fwd", "_bwd_dkdvde", "_bwd_dq")


@dataclass(frozen=True)
class LaunchConfig:
    """Query and key blocks, warps and software-pipeline stages of one launch."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3

    @property
    def label(self) -> str:
        return f"m{self.block_m}-n{self.block_n}-w{self.num_warps}-s{self.num_stages}"


# (kernel, dtype, head-dim tile) -> the measured best: one H100 80GB, 2026-11-27, batch 2, 16 heads,
# N = 2048 (results/gpu-check/20261127-100334). Only dK/dV/dE at head dim 128 beats the default
# (warps 4, stages 3) by more than noise; the rest record that the default was best. Measured on
# the kernels before 2026-11-28's transposed dK/dV/dE loop and unmasked blocks: `make gpu-measure`
# retunes them.
TUNED: dict[tuple[str, str, int], LaunchConfig] = {
    ("_fwd", "bfloat16", 64): LaunchConfig(64, 64, 4, 3),  # 0.107 ms, default 0.107
    ("_bwd_dkdvde", "bfloat16", 64): LaunchConfig(64, 64, 4, 3),  # 0.533 ms, default 0.535
    ("_bwd_dq", "bfloat16", 64): LaunchConfig(64, 64, 4, 3),  # 0.533 ms, default 0.532
    ("_fwd", "bfloat16", 128): LaunchConfig(64, 64, 4, 3),  # 0.171 ms, default 0.171
    ("_bwd_dkdvde", "bfloat16", 128): LaunchConfig(64, 64, 8, 2),  # 1.116 ms, default 1.243
    ("_bwd_dq", "bfloat16", 128): LaunchConfig(64, 64, 4, 3),  # 1.243 ms, default 1.241
}

# What the sweep tries. The backward kernels run with block_m = block_n (a one-query fp16/bf16
# dK came out wrong on an H100 with a shorter query block), so only their block_n varies.
FORWARD_CANDIDATES = (
    LaunchConfig(64, 64, 4, 3), LaunchConfig(128, 64, 8, 3), LaunchConfig(128, 64, 4, 2),
    LaunchConfig(64, 32, 4, 3), LaunchConfig(128, 32, 8, 2), LaunchConfig(64, 64, 8, 2),
)
BACKWARD_CANDIDATES = (
    LaunchConfig(64, 64, 4, 3), LaunchConfig(64, 64, 8, 2), LaunchConfig(32, 32, 4, 3),
    LaunchConfig(32, 32, 4, 2), LaunchConfig(64, 64, 8, 3),
)

_FORCED: dict[str, LaunchConfig] = {}
_UNTUNED: list[bool] = []  # inside ``untuned()``


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


SAME_CODE = {"float16": "bfloat16"}
"""Dtypes whose kernels compile to the same tiles and tensor-core instructions as another's: without
a measurement of their own they take its configuration (compiled for sm_90 with triton 3.6, fp16's
dK/dV/dE at head dim 128 spilled inside its loop at the default warps 4, stages 3 (145 spill
instructions) and not at bf16's tuned 8, 2, as bf16's; with triton 3.9 both spill at either)."""


SPILL_FREE: dict[tuple[str, str, int], LaunchConfig] = {
    ("_bwd_dkdvde", "float32", 16): LaunchConfig(32, 32, 8, 2),
    ("_bwd_dq", "float32", 16): LaunchConfig(32, 32, 4, 3),
    ("_bwd_dkdvde", "float32", 32): LaunchConfig(32, 32, 8, 2),
    ("_bwd_dq", "float32", 32): LaunchConfig(32, 32, 4, 3),
    ("_fwd", "float32", 64): LaunchConfig(32, 32, 4, 3),
    ("_bwd_dkdvde", "float32", 64): LaunchConfig(32, 32, 8, 2),
    ("_bwd_dq", "float32", 64): LaunchConfig(32, 32, 4, 3),
    ("_fwd", "float32", 128): LaunchConfig(16, 16, 4, 3),
    ("_bwd_dkdvde", "float32", 128): LaunchConfig(32, 32, 8, 2),
    ("_bwd_dq", "float32", 128): LaunchConfig(32, 32, 8, 2),
}
"""fp32 (ieee products on FMA units) without a measurement: configurations that compile for sm_90
without a spill inside any loop under triton 3.6 and 3.9 (``make kernel-report``), where the
defaults spilled 0.4-20 KB a thread (head dim 64 at BLOCK 64: 8-20 KB; the backward at head dims
16 and 32: up to 11 KB). The forward at 16 and 32 spills nowhere at the default block and has no
entry. Chosen from compiled structure, not timed; a ``TUNED`` entry, measured on a GPU, takes
precedence."""


def config(kernel: str, dtype: torch.dtype, head_dim_tile: int) -> LaunchConfig | None:
    """The configuration for ``kernel`` at this dtype and head-dim tile, if any: the measured one
    (for fp16, bf16's when fp16 has none), else fp32's spill-free one."""
    if _UNTUNED:
        return None
    name = dtype_name(dtype)
    key = (kernel, name, head_dim_tile)
    return (TUNED.get(key) or TUNED.get((kernel, SAME_CODE.get(name, name), head_dim_tile))
            or SPILL_FREE.get(key))


def forced(kernel: str) -> LaunchConfig | None:
    """The configuration ``forcing`` imposes on ``kernel`` right now, if any."""
    return _FORCED.get(kernel)


@contextlib.contextmanager
def untuned() -> Iterator[None]:
    """Launch with the kernels' own defaults (their blocks, warps 4, stages 3) inside the block,
    ignoring ``TUNED`` and ``SPILL_FREE``: the sweep's baseline."""
    _UNTUNED.append(True)
    try:
        yield
    finally:
        _UNTUNED.pop()


@contextlib.contextmanager
def forcing(kernel: str, cfg: LaunchConfig) -> Iterator[None]:
    """Launch ``kernel`` with ``cfg`` exactly (no fallback) inside the block: what the sweep times."""
    _FORCED[kernel] = cfg
    try:
        yield
    finally:
        del _FORCED[kernel]
