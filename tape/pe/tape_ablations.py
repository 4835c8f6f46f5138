"""The E maps of TAPE's Table 6 ablations (tape-spec A.9, E.6): without rotation equivariance,
without the tensorial embedding, or without both (docs/experiments.md defines each).

TAPE's maps act over E's head axis with one coefficient per (c, s) pair. The ablations change
the axis the post-attention map and the PE-MLP act on:
- tensorial, not equivariant: the PE-MLP reads each token's whole E flattened (He·d -> I -> He·d),
  mixing c with s and frequencies with separate weights; the post map stays over heads;
- not tensorial, equivariant: both maps act over each head's d/2 frequencies (shared by the
  heads), the same weights for the c row and the s row: they commute with a common rotation of
  every pair but mix frequencies, so a position shift is no longer a no-op;
- neither: both maps act over each head's d features (d -> I -> d), c and s mixed.
Plain autograd (no fused backward): these are ablations, not a path to optimise.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class Layout(NamedTuple):
    """Which ablation: the two switches of Table 6's lower half."""

    equivariant: bool
    tensorial: bool

    def mlp_width(self, e_heads: int, head_dim: int) -> int:
        """The width of the features the PE-MLP's W1 reads (W2 writes)."""
        if self.tensorial:
            return e_heads if self.equivariant else e_heads * head_dim
        return head_dim // 2 if self.equivariant else head_dim

    def post_width(self, head_dim: int) -> int:
        """The width of the post-attention map's features (without the tensorial embedding)."""
        return head_dim // 2 if self.equivariant else head_dim


def feature_rows(e: Tensor, layout: Layout) -> Tensor:
    """E (B, He, N, d) as the rows the ablated PE-MLP maps: (B, N, He·d) flattened per token
    (tensorial, not equivariant), (B, He, N, 2, d/2) c and s rows (equivariant vector), or
    (B, He, N, d) itself."""
    b, he, n, d = e.shape
    if layout.tensorial:
        return e.transpose(1, 2).reshape(b, n, he * d)
    if layout.equivariant:
        return e.reshape(b, he, n, 2, d // 2)
    return e


def from_feature_rows(rows: Tensor, shape: tuple[int, ...], layout: Layout) -> Tensor:
    """The inverse of ``feature_rows``: back to E's (B, He, N, d)."""
    b, he, n, d = shape
    if layout.tensorial:
        return rows.view(b, n, he, d).transpose(1, 2)
    return rows.reshape(b, he, n, d)


def gate_for(gate: Tensor, layout: Layout) -> Tensor:
    """The token gate (B, N, I) broadcast against the W1 output of ``feature_rows``."""
    if layout.tensorial:
        return gate  # (B, N, I)
    if layout.equivariant:
        return gate[:, None, :, None, :]  # (B, 1, N, 1, I)
    return gate[:, None]  # (B, 1, N, I)


def feature_post_map(ae: Tensor, weight: Tensor, layout: Layout) -> Tensor:
    """The post-attention map over each head's features (not tensorial): A·E (B, H, N, d), H = He,
    mapped by weight (d/2 x d/2 on the c and s rows, or d x d) -> (B, H, N, d)."""
    rows = feature_rows(ae, layout)
    return from_feature_rows(F.linear(rows, weight), tuple(ae.shape), layout)


def feature_mlp(u: Tensor, gate: Tensor, w1: Tensor, w2: Tensor, layout: Layout) -> Tensor:
    """The ablated PE-MLP's increment W2 · diag(g) · W1 · u over the layout's features:
    u (B, He, N, d), gate (B, N, I), w1 (I, F), w2 (F, I) -> (B, He, N, d)."""
    hidden = F.linear(feature_rows(u, layout), w1) * gate_for(gate, layout)
    return from_feature_rows(F.linear(hidden, w2), tuple(u.shape), layout)
