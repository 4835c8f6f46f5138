"""RoPE (Su et al. 2021), rotate-half convention: channel b pairs with channel b + d/2.

The tables are built per call from position ids (any offset), in float64, then cast. They are
stored as [cos | sin] of the d/2 unique frequencies, the same layout as TAPE's E stream.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tape.pe import register
from tape.pe.base import (LayerPE, PositionalEncoding, PositionState, RotaryOptions, angle_dtype,
                          inverse_frequencies)


def rope_table(
    positions: Tensor, head_dim: int, theta: float, scaling: float, dtype: torch.dtype,
    fraction: float = 1.0,
) -> Tensor:
    """positions (B, N) int64 -> (B, 1, N, d) = [cos(t·f_b) | sin(t·f_b)], t = position/scaling.
    ``fraction`` < 1 keeps the highest frequencies only (p-RoPE): the others get angle 0."""
    inv_freq = inverse_frequencies(head_dim, theta, positions.device)  # (d/2,), highest first
    if fraction < 1.0:
        kept = round(fraction * inv_freq.numel())
        inv_freq = torch.where(torch.arange(inv_freq.numel(), device=inv_freq.device) < kept, inv_freq, 0.0)
    t = positions.to(angle_dtype(positions.device)) / scaling  # (B, N)
    angles = t[..., None] * inv_freq  # (B, N, d/2)
    table = torch.cat([angles.cos(), angles.sin()], dim=-1)  # (B, N, d)
    return table[:, None].to(dtype)


def rotate(x: Tensor, rot: Tensor) -> Tensor:
    """Rotate each pair (x_b, x_{b+d/2}) by its (cos, sin): x (B, H, N, d), rot broadcastable.

    In complex form (x_b + i·x_{b+d/2}) · (cos + i·sin); equal to HF's x·cos + rotate_half(x)·sin
    with the cos/sin halves duplicated.
    """
    x1, x2 = x.chunk(2, dim=-1)
    c, s = rot.chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class RotaryLayer(LayerPE):
    """Rotates q and k with ``state.rot`` (shared by every layer for RoPE and RandPE)."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return rotate(q, state.rot), rotate(k, state.rot)


@register("rope")
class RoPE(PositionalEncoding):
    """Rotary position embedding. Options: ``rope_theta`` (base), ``rope_scaling`` (linear
    position interpolation factor)."""

    display = "RoPE"
    Options = RotaryOptions
    rotary = True

    def rotating_fraction(self) -> float:
        """Share of the frequency pairs that rotate, the highest ones (p-RoPE keeps fewer)."""
        return 1.0

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        opts = self.opts
        rot = rope_table(query_pos, self.cfg.head_dim, opts.rope_theta, opts.rope_scaling, dtype,
                         self.rotating_fraction())
        return PositionState(query_pos=query_pos, key_pos=key_pos, rot=rot)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return RotaryLayer()
