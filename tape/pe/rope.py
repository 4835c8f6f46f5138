"""RoPE (Su et al. 2021), rotate-half convention: channel b pairs with channel b + d/2.

The tables are built per call from position ids (any offset), in float64, then cast. They are
stored as [cos | sin] of the d/2 unique frequencies, the same layout as TAPE's E stream.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tape.pe import register
from tape.pe.base import (LayerPE, PositionalEncoding, PositionState, RotaryOptions, Yarn,
                          angle_dtype, inverse_frequencies)


def rope_table(
    positions: Tensor, head_dim: int, theta: float, scaling: float, dtype: torch.dtype,
    fraction: float = 1.0, yarn: Yarn | None = None,
) -> Tensor:
    """positions (B, N) int64 -> (B, 1, N, d) = [cos(t·f_b) | sin(t·f_b)], t = position/scaling.
    ``fraction`` < 1 keeps the highest frequencies only (p-RoPE): the others get angle 0.
    ``yarn`` replaces the frequencies with YaRN's and scales the table by its magnitude."""
    if yarn is None:
        inv_freq = inverse_frequencies(head_dim, theta, positions.device)  # (d/2,), highest first
    else:
        inv_freq = yarn_frequencies(head_dim, theta, yarn, positions.device)
    if fraction < 1.0:
        kept = round(fraction * inv_freq.numel())
        inv_freq = torch.where(torch.arange(inv_freq.numel(), device=inv_freq.device) < kept, inv_freq, 0.0)
    t = positions.to(angle_dtype(positions.device)) / scaling  # (B, N)
    angles = t[..., None] * inv_freq  # (B, N, d/2)
    table = torch.cat([angles.cos(), angles.sin()], dim=-1)  # (B, N, d)
    if yarn is not None:
        table = table * yarn_magnitude(yarn.factor)
    return table[:, None].to(dtype)


def _pair_turning(turns: float, head_dim: int, theta: float, length: int) -> float:
    """The (fractional) pair index b whose frequency theta^(-2b/d) turns ``turns`` times in
    ``length`` positions."""
    return head_dim * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(theta))


def yarn_frequencies(head_dim: int, theta: float, yarn: Yarn, device: torch.device) -> Tensor:
    """YaRN's frequencies, (d/2,): pairs turning more than beta_fast times in the original
    length keep theta^(-2b/d), those turning fewer than beta_slow times are divided by the
    factor, and a ramp linear in b (ends rounded outwards) blends the pairs between."""
    inv_freq = inverse_frequencies(head_dim, theta, device)
    low = max(math.floor(_pair_turning(yarn.beta_fast, head_dim, theta, yarn.original_length)), 0)
    high = min(math.ceil(_pair_turning(yarn.beta_slow, head_dim, theta, yarn.original_length)), head_dim - 1)
    high = high if high > low else low + 1e-3
    pair = torch.arange(inv_freq.numel(), device=device, dtype=inv_freq.dtype)
    interpolated = ((pair - low) / (high - low)).clamp(0.0, 1.0)  # 0: kept, 1: divided by factor
    return inv_freq * (1 - interpolated) + inv_freq / yarn.factor * interpolated


def yarn_magnitude(factor: float) -> float:
    """The table's scale, 0.1 ln(s) + 1: q and k each carry it, so logits grow by its square
    (YaRN's attention temperature sqrt(1/t))."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def rotate(x: Tensor, rot: Tensor) -> Tensor:
    """Rotate each pair (x_b, x_{b+d/2}) by its (cos, sin): x (B, H, N, d), rot broadcastable.

    In complex form (x_b + i·x_{b+d/2}) · (cos + i·sin); equal to HF's x·cos + rotate_half(x)·sin
    with the cos/sin halves duplicated.
    """
    x1, x2 = x.chunk(2, dim=-1)
    c, s = rot.chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rotate_grouped(q: Tensor, k: Tensor, rot: Tensor) -> tuple[Tensor, Tensor]:
    """k (B, Hkv, N, d) rotated by rot (B, Hkv or 1, N, d); q (B, H, N, d) by its key/value
    head's rot (grouped-query attention: H / Hkv query heads share one), rot broadcast over each
    query group (a view of q, not rot repeated per query head)."""
    return rotate(query_groups(q, rot.shape[1]), rot[:, :, None]).view(q.shape), rotate(k, rot)


def query_groups(q: Tensor, kv_heads: int) -> Tensor:
    """q (B, H, N, d) as (B, Hkv, H / Hkv, N, d): each key/value head's query group, a view."""
    b, h, n, d = q.shape
    return q.view(b, kv_heads, h // kv_heads, n, d)


def broadcast_shape(*shapes: torch.Size) -> tuple[int, ...]:
    """The shape the given ones broadcast to (``torch.broadcast_shapes`` in plain Python: that one
    goes through symbolic-shape checks: 18 µs a call on this host against 1.6, a cost a GPU step pays)."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape, start=rank - len(shape)):
            if size != 1:
                if out[i] != 1 and out[i] != size:
                    raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast (dim {i})")
                out[i] = size
    return tuple(out)


def _like(x: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An empty tensor of ``shape``, laid out as x where x has that shape (a transposed
    projection stays token-major: its gradient flows back without a copy)."""
    if tuple(x.shape) == shape:
        return torch.empty_like(x, dtype=dtype)  # x's strides where it is dense
    return torch.empty(shape, dtype=dtype, device=x.device)


def rotated(x: Tensor, rot: Tensor, dtype: torch.dtype) -> Tensor:
    """``rotate(x, rot)`` in >= float32 (a product and a multiply-add per channel), cast to
    ``dtype``, laid out as x: five device kernels instead of eight. Writes through ``out=``: no
    autograd."""
    acc = torch.promote_types(torch.promote_types(x.dtype, rot.dtype), torch.float32)
    out = _like(x, broadcast_shape(x.shape, rot.shape), acc)
    (x1, x2), (c, s), (y1, y2) = (t.chunk(2, dim=-1) for t in (x, rot, out))
    torch.mul(x1, c, out=y1).addcmul_(x2, s, value=-1)  # x1·c - x2·s
    torch.mul(x2, c, out=y2).addcmul_(x1, s)  # x2·c + x1·s
    return out.to(dtype)


def rotate_backward(grad: Tensor, x: Tensor, rot: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of ``rotate(x, rot)`` given its output's, grad: d/dx in x's dtype and d/drot
    in >= float32 and the product's shape (the caller sums broadcast dims). No autograd.

    Per pair in complex form, y = x·z with z = c + i·s: dx = dy·conj(z), dz = dy·conj(x).
    """
    acc = torch.promote_types(torch.promote_types(grad.dtype, rot.dtype), torch.float32)
    shape = broadcast_shape(grad.shape, x.shape, rot.shape)
    grad_x, grad_rot = _like(x, shape, acc), _like(x, shape, acc)
    (g1, g2), (x1, x2), (c, s) = (t.chunk(2, dim=-1) for t in (grad, x, rot))
    (dx1, dx2), (dc, ds) = grad_x.chunk(2, dim=-1), grad_rot.chunk(2, dim=-1)
    torch.mul(g1, c, out=dx1).addcmul_(g2, s)  # g1·c + g2·s
    torch.mul(g2, c, out=dx2).addcmul_(g1, s, value=-1)  # g2·c - g1·s
    torch.mul(g1, x1, out=dc).addcmul_(g2, x2)  # g1·x1 + g2·x2
    torch.mul(g2, x1, out=ds).addcmul_(g1, x2, value=-1)  # g2·x1 - g1·x2
    return grad_x.to(x.dtype), grad_rot


class RotaryLayer(LayerPE):
    """Rotates q and k with ``state.rot`` (shared by every layer for RoPE and RandPE)."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return rotate(q, state.rot), rotate(k, state.rot)


@register("rope")
class RoPE(PositionalEncoding):
    """Rotary position embedding. Options: ``rope_theta`` (base), ``rope_scaling`` (linear
    position interpolation factor), ``rope_yarn_factor`` / ``rope_yarn_original_length`` (YaRN)."""

    display = "RoPE"
    Options = RotaryOptions
    rotary = True

    def rotating_fraction(self) -> float:
        """Share of the frequency pairs that rotate, the highest ones (p-RoPE keeps fewer)."""
        return 1.0

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        opts = self.opts
        rot = rope_table(query_pos, self.cfg.head_dim, opts.rope_theta, opts.rope_scaling, dtype,
                         self.rotating_fraction(), opts.yarn())
        return PositionState(query_pos=query_pos, key_pos=key_pos, rot=rot)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return RotaryLayer()
