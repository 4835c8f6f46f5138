"""xPos (Sun et al. 2022): RoPE plus a per-frequency exponential decay of |q·k| with distance.

q is scaled by zeta_b^(p(t)) and k by zeta_b^(-p(t)), p(t) = (t - c) / scale_base,
zeta_b = (2b + 0.4 d) / (1.4 d). The product depends on t_q - t_k only, so the centre c
(max_seq_len // 2, for numerical range) cancels; we keep it fixed rather than re-centring when a
sequence outgrows the cache as the official code did, which changes nothing in exact arithmetic
and keeps the KV cache valid. In fp16 the scales leave the range far from c (k's is inf at
t = 19,000 with max_seq_len 1024); every evaluation here stays below 8,500 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tape.pe import register
from tape.pe.base import LayerPE, PositionalEncoding, PositionState, RotaryOptions, angle_dtype
from tape.pe.rope import rope_table, rotate


def xpos_scale(positions: Tensor, head_dim: int, scale_base: float, centre: int, dtype: torch.dtype) -> Tensor:
    """positions (B, N) -> (B, 1, N, d/2) query scales zeta^((t - centre) / scale_base)."""
    dt = angle_dtype(positions.device)
    b = torch.arange(0, head_dim, 2, device=positions.device, dtype=dt)
    zeta = (b + 0.4 * head_dim) / (1.4 * head_dim)  # (d/2,)
    power = (positions.to(dt) - centre) / scale_base  # (B, N)
    return (zeta ** power[..., None])[:, None].to(dtype)


@dataclass
class XPosOptions(RotaryOptions):
    xpos_scale_base: float = 2048.0


class XPosLayer(LayerPE):
    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        s = torch.cat([state.q_scale, state.q_scale], dim=-1)  # both channels of a pair
        return rotate(q, state.rot) * s, rotate(k, state.rot) / s


@register("xpos")
class XPos(PositionalEncoding):
    """Options: ``xpos_scale_base`` (2048 in the paper's baseline), ``rope_theta``."""

    display = "xPos"
    Options = XPosOptions
    rotary = True

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        cfg, opts = self.cfg, self.opts
        rot = rope_table(query_pos, cfg.head_dim, opts.rope_theta, opts.rope_scaling, dtype,
                         yarn=opts.yarn())
        scale = xpos_scale(query_pos, cfg.head_dim, opts.xpos_scale_base, cfg.max_seq_len // 2, dtype)
        return PositionState(query_pos=query_pos, key_pos=key_pos, rot=rot, q_scale=scale)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return XPosLayer()
