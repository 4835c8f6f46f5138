"""T5 relative position bias (Raffel et al. 2020), causal (unidirectional) bucketing.

Distances 0..B/2-1 get their own bucket; larger ones share B/2 log-spaced buckets up to
``t5_max_distance`` (everything beyond lands in the last bucket). B = ``t5_num_buckets`` = 64.
One learned (buckets x H) table per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tape.pe import register
from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionState


@dataclass
class T5Options(PEOptions):
    t5_num_buckets: int = 64
    t5_max_distance: int = 128


def causal_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """distance (any shape) int64 = query pos - key pos -> bucket ids in [0, num_buckets)."""
    n = distance.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(is_small, n, large)


class T5Layer(LayerPE):
    def __init__(self, n_heads: int, num_buckets: int, max_distance: int) -> None:
        super().__init__()
        self.bias = nn.Embedding(num_buckets, n_heads)
        self.num_buckets, self.max_distance = num_buckets, max_distance

    def attn_bias(self, state: PositionState) -> Tensor:
        distance = state.query_pos[:, :, None] - state.key_pos[:, None, :]  # (B, N, T)
        buckets = causal_bucket(distance, self.num_buckets, self.max_distance)
        return self.bias(buckets).float().permute(0, 3, 1, 2)  # (B, H, N, T)


@register("t5")
class T5Bias(PositionalEncoding):
    """Options: ``t5_num_buckets`` (64), ``t5_max_distance`` (128)."""

    display = "T5 bias"
    materialises_bias = True
    Options = T5Options

    def make_layer(self, layer_idx: int) -> LayerPE:
        return T5Layer(self.cfg.n_heads, self.opts.t5_num_buckets, self.opts.t5_max_distance)
