"""TAPE's rotation of q and k and the Triton kernel as one autograd node.

Rotated apart, autograd keeps q and k twice for backward: unrotated (for E's gradient through the
rotation) and rotated (for the attention's). Here the node keeps them unrotated and recomputes
the rotation in backward (elementwise, bit for bit the forward's): two (B, H, N, d) tensors less
per layer between the passes, and one node instead of the rotation's dozen.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tape.kernels.triton_attention import _forward, attention_backward, check_inputs
from tape.pe.rope import rotate_backward, rotated


def _grouped(q: Tensor, k: Tensor) -> Tensor:
    """q (B, H, N, d) as (B, Hkv, H / Hkv, N, d): each key/value head's query group, a view."""
    b, h, n, d = q.shape
    return q.view(b, k.shape[1], h // k.shape[1], n, d)


def _rotated(q: Tensor, k: Tensor, rot: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """q and k rotated by rot (q's heads by their group's) in >= float32, cast to ``dtype``."""
    qr = rotated(_grouped(q, k), rot[:, :, None], dtype).view(q.shape)  # rot broadcast over groups
    return qr, rotated(k, rot, dtype)


class RotaryFusedVEAttention(torch.autograd.Function):
    """(q, k unrotated, v, e, rot) -> (A·V, A·E) with q and k rotated by rot, one QKᵀ for [V | E]."""

    @staticmethod
    def forward(ctx, q, k, v, e, rot, scale):  # noqa: D102
        qr, kr = _rotated(q, k, rot, v.dtype)
        o, oe, lse = _forward(qr, kr, v, e.to(v.dtype), scale, None)
        ctx.save_for_backward(q, k, v, e, rot, o, oe, lse)  # rot is e for TAPE: one storage
        ctx.scale = scale
        return o, oe

    @staticmethod
    def backward(ctx, do, doe):  # noqa: D102
        q, k, v, e, rot, o, oe, lse = ctx.saved_tensors
        qr, kr = _rotated(q, k, rot, v.dtype)  # the forward's, bit for bit
        do = torch.zeros_like(o) if do is None else do
        doe = torch.zeros_like(oe) if doe is None else doe
        dqr, dkr, dv, de = attention_backward(qr, kr, v, e, o, oe, lse, do, doe, ctx.scale, None)
        del qr, kr
        dq, drot_q = rotate_backward(_grouped(dqr, k), _grouped(q, k), rot[:, :, None])  # (B, Hkv, G, N, d)
        dk, drot_k = rotate_backward(dkr, k, rot)  # (B, Hkv, N, d)
        drot = None
        if ctx.needs_input_grad[4]:
            drot = _sum_to(drot_k.add_(drot_q.sum(2)), rot.shape).to(rot.dtype)
        return dq.view(q.shape), dk, dv, de, drot, None


def _sum_to(x: Tensor, shape: torch.Size) -> Tensor:
    """x summed over the dims ``shape`` broadcast (a rot shared by heads or batch rows)."""
    dims = [i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1]
    return x.sum(dims, keepdim=True) if dims else x


def rotary_fused_attention(q: Tensor, k: Tensor, v: Tensor, e: Tensor, rot: Tensor,
                           scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Causal attention of q and k rotated by rot (``rope.rotate_grouped``) over [V | E].

    q (B, H, N, d) and k (B, Hkv, N, d) unrotated; v, e (B, Hkv, N, ·); rot (B, Hkv or 1, N, d)
    as [cos | sin] (TAPE: rot is e, float32). -> A·V (B, H, N, dv), A·E (B, H, N, de), as
    ``fused_attention`` of the rotated q and k.
    """
    if rot.shape[-1] != q.shape[-1] or rot.shape[-2] != k.shape[-2] or q.shape[-2] != k.shape[-2]:
        raise ValueError(f"rot {tuple(rot.shape)} must rotate q {tuple(q.shape)} and k {tuple(k.shape)} "
                         "(the same N rows, head dim d)")
    check_inputs(q, k, v, e, wide_e=True)
    return RotaryFusedVEAttention.apply(q, k, v, e, rot, scale)
