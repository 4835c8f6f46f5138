"""ALiBi (Press et al. 2022): a per-head linear penalty -slope_h * (i - j) on the logits.

Slopes follow the paper: for a power of two H, 2^(-8/H * (h+1)); otherwise the slopes of the
next lower power of two p, then every other slope of 2p (for H=12: 2^-1..2^-8, then
2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tape.pe import register
from tape.pe.base import LayerPE, PositionalEncoding, PositionState


def alibi_slopes(n_heads: int) -> Tensor:
    """(H,) float32 head slopes."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(p)
    if p < n_heads:
        slopes += power_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


def relative_distance(state: PositionState) -> Tensor:
    """(B, 1, N, T) float32 query position minus key position."""
    return (state.query_pos[:, None, :, None] - state.key_pos[:, None, None, :]).float()


class ALiBiLayer(LayerPE):
    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def attn_bias(self, state: PositionState) -> Tensor:
        slopes = self.slopes.float()[None, :, None, None]  # (1, H, 1, 1)
        return -slopes * relative_distance(state)  # (B, H, N, T)

    def alibi_slopes(self) -> Tensor:
        return self.slopes.float()


@register("alibi")
class ALiBi(PositionalEncoding):
    """No learned parameters; the slopes are fixed by the number of heads."""

    display = "ALiBi"
    materialises_bias = True

    def make_layer(self, layer_idx: int) -> LayerPE:
        return ALiBiLayer(self.cfg.n_heads)
