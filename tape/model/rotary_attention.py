"""TAPE's rotation of q and k and the Triton kernel as one autograd node.

Rotated apart, autograd keeps q and k twice for backward: unrotated (for E's gradient through the
rotation) and rotated (for the attention's). Here the node keeps them unrotated and recomputes
the rotation in backward (``tape.model.rotation``, bit for bit the forward's): two (B, H, N, d)
tensors less per layer between the passes, and one node instead of two. Where q and k can be
joined (``rotation.joinable``) they rotate as one tensor, and the kernel writes dq and dk into
the two halves of the joined gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tape.kernels.triton_attention import _forward, attention_backward, check_inputs
from tape.model.rotation import (join, joinable, rotate_joined, rotate_joined_backward, rotate_k, rotate_q,
                                 rotate_qk_backward)


def _rotated(q: Tensor, k: Tensor, rot: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return rotate_q(q, rot, dtype), rotate_k(k, rot, dtype)


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
        dqr, dkr, dv, de = attention_backward(qr, kr, v, e, o, oe, lse, do, doe, ctx.scale, None)
        del qr, kr
        dq, dk, drot = rotate_qk_backward(dqr, dkr, q, k, rot, ctx.needs_input_grad[4])
        return dq, dk, dv, de, drot, None


class JoinedRotaryFusedVEAttention(torch.autograd.Function):
    """(qk joined and unrotated, v, e, rot, scale, heads) -> (A·V, A·E): as
    ``RotaryFusedVEAttention`` with q, k as the halves of one tensor (q: the first ``heads``)."""

    @staticmethod
    def forward(ctx, qk, v, e, rot, scale, heads):  # noqa: D102
        qkr = rotate_joined(qk, rot, v.dtype)
        o, oe, lse = _forward(qkr[:, :heads], qkr[:, heads:], v, e.to(v.dtype), scale, None)
        ctx.save_for_backward(qk, v, e, rot, o, oe, lse)
        ctx.scale, ctx.heads = scale, heads
        return o, oe

    @staticmethod
    def backward(ctx, do, doe):  # noqa: D102
        qk, v, e, rot, o, oe, lse = ctx.saved_tensors
        heads = ctx.heads
        qkr = rotate_joined(qk, rot, v.dtype)  # the forward's, bit for bit
        dqkr = torch.empty_like(qkr)  # the kernel writes dq and dk into its halves
        _, _, dv, de = attention_backward(qkr[:, :heads], qkr[:, heads:], v, e, o, oe, lse, do, doe, ctx.scale,
                                          None, into=(dqkr[:, :heads], dqkr[:, heads:]))
        del qkr
        dqk, drot = rotate_joined_backward(dqkr, qk, rot, ctx.needs_input_grad[3])
        return dqk, dv, de, drot, None, None


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
    if joinable(q, k, rot):
        return JoinedRotaryFusedVEAttention.apply(join(q, k), v, e, rot, scale, q.shape[1])
    return RotaryFusedVEAttention.apply(q, k, v, e, rot, scale)
