"""CoPE, contextual position encoding (Golovneva et al. 2024, "Learning to Count What's Important").

Positions are counted from content, not from token indices. For query i and key j <= i:
  gate      g_ij = sigmoid(q_i · k_j / sqrt(d))                (keys j > i and padding count 0)
  position  p_ij = sum_{t=j..i} g_it, clamped to npos - 1       (a reverse cumulative sum over keys)
  logit     q_i · e[p_ij] / sqrt(d), e[p] linearly interpolated between e[floor p] and e[ceil p]
with a learned table e[0..npos-1] per layer, head-dim wide and shared by the heads. The logit
term is computed as z_i = q_i Eᵀ at the integer positions, then interpolated, and enters attention
as an additive float32 bias (B, H, Nq, Nk): attention materialises it on every backend.

Scaling: the paper writes sigmoid(q·k) and softmax(q·(k + e)) without 1/sqrt(d) (as papers do);
its listing and the official code (facebookresearch/RAM, projects/cope) take the gate from the
scaled product, and by default divide the position term by sqrt(d) together with q·k. We do both.
The table starts at zero (as the official code), so CoPE at init is NoPE. CoPE replaces RoPE:
no other position information enters, and the position ids are never read (so the logits are
trivially invariant to shifting them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from tape.pe import register
from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionState, without_autocast

if TYPE_CHECKING:
    from tape.model.config import ModelConfig


@dataclass
class CoPEOptions(PEOptions):
    cope_npos: int | None = None
    """Size of the position table; positions are clamped to cope_npos - 1. None = max_seq_len + 1
    (p_ij reaches i - j + 1 <= max_seq_len, and 0 is possible, so no trained count is clamped)."""

    def problems(self, cfg: "ModelConfig") -> list[str]:
        if self.cope_npos is not None and self.cope_npos < 2:
            return [f"cope_npos={self.cope_npos} must be >= 2 (null = max_seq_len + 1)"]
        return []

    def npos(self, cfg: "ModelConfig") -> int:
        return self.cope_npos or cfg.max_seq_len + 1


def causal_keys(n_queries: int, n_keys: int, device: torch.device) -> Tensor:
    """(Nq, Nk) bool: the queries are the last Nq of the Nk keys and see keys up to themselves."""
    q_idx = torch.arange(n_keys - n_queries, n_keys, device=device)[:, None]
    return torch.arange(n_keys, device=device)[None, :] <= q_idx


def contextual_positions(gates: Tensor, max_position: int) -> Tensor:
    """gates (..., Nk), zero where a key must not count -> p (..., Nk), p_j = sum_{t>=j} g_t,
    clamped to max_position."""
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=max_position)


def interpolate(z: Tensor, p: Tensor) -> Tensor:
    """z (..., npos) values at the integer positions, p (..., Nk) fractional positions in
    [0, npos - 1] -> (..., Nk), linear between floor(p) and ceil(p) (exact at integers)."""
    lo = p.detach().floor()
    frac = p - lo  # carries the gradient to p (and so to the gates)
    lo = lo.long()
    hi = p.detach().ceil().long()
    return torch.lerp(z.gather(-1, lo), z.gather(-1, hi), frac)


class CoPELayer(LayerPE):
    def __init__(self, head_dim: int, npos: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(npos, head_dim))  # e[0..npos-1], shared by heads
        self.npos = npos

    def gate(self, scaled_logits: Tensor) -> Tensor:
        """How much each key counts; a seam tests replace (all ones: plain token counting)."""
        return torch.sigmoid(scaled_logits)

    def score_bias(self, q: Tensor, k: Tensor, state: PositionState, mask: Tensor | None) -> Tensor:
        """q (B, H, Nq, d), k (B, Hkv, Nk, d) every key, mask (B or 1, 1, Nq, Nk) bool or None
        (plain causal) -> q_i · e[p_ij] / sqrt(d), (B, H, Nq, Nk) in float32 (float64 models:
        float64, so their exactness tests stay exact)."""
        scale = 1.0 / math.sqrt(q.shape[-1])
        with without_autocast(q.device):  # counts must stay exact past bf16's 256
            acc = torch.promote_types(q.dtype, torch.float32)
            qf = q.to(acc)
            kf = k.to(acc).repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Nk, d)
            gates = self.gate(torch.matmul(qf, kf.transpose(-1, -2)) * scale)  # (B, H, Nq, Nk)
            if mask is None:
                mask = causal_keys(q.shape[-2], k.shape[-2], q.device)
            gates = gates.masked_fill(~mask, 0.0)  # later keys and padding do not count
            p = contextual_positions(gates, self.npos - 1)
            z = torch.matmul(qf, self.table.to(acc).t()) * scale  # (B, H, Nq, npos)
            return interpolate(z, p)

    def init_weights(self, std: float) -> None:
        with torch.no_grad():
            self.table.zero_()


@register("cope")
class CoPE(PositionalEncoding):
    """Options: ``cope_npos`` (table size; null = max_seq_len + 1)."""

    display = "CoPE"
    reads_positions = False
    Options = CoPEOptions
    materialises_bias = True  # the gates need the full (B, H, Nq, Nk) score matrix

    def make_layer(self, layer_idx: int) -> LayerPE:
        return CoPELayer(self.cfg.head_dim, self.opts.npos(self.cfg))
