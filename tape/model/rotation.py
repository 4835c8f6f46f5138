"""TAPE's rotation of q and k by E as one autograd node that keeps q and k unrotated.

E's gradient through the rotation needs q and k unrotated; the attention's needs them rotated.
``RotateQK`` keeps the unrotated ones (and E, kept anyway) and writes the rotation's gradient by
hand; ``rotate_q`` and ``rotate_k`` rebuild the rotated ones bit for bit, so the attention can
save them as recipes (``tape.model.recompute``) or recompute them itself (the Triton node).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tape.pe.rope import rotate_backward, rotated


def _grouped(q: Tensor, kv_heads: int) -> Tensor:
    """q (B, H, N, d) as (B, Hkv, H / Hkv, N, d): each key/value head's query group, a view."""
    b, h, n, d = q.shape
    return q.view(b, kv_heads, h // kv_heads, n, d)


def rotate_q(q: Tensor, rot: Tensor, dtype: torch.dtype) -> Tensor:
    """q (B, H, N, d) rotated by its key/value head's rot (B, Hkv or 1, N, d), in >= float32 (a
    product and a multiply-add per channel), cast to ``dtype``. No autograd."""
    return rotated(_grouped(q, rot.shape[1]), rot[:, :, None], dtype).view(q.shape)


def rotate_k(k: Tensor, rot: Tensor, dtype: torch.dtype) -> Tensor:
    """k (B, Hkv, N, d) rotated by rot, as ``rotate_q``."""
    return rotated(k, rot, dtype)


def rotate_qk_backward(dqr: Tensor, dkr: Tensor, q: Tensor, k: Tensor, rot: Tensor,
                       needs_rot: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """The gradients of q, k (their dtypes) and rot (its dtype and shape; None unless
    ``needs_rot``) given those of the rotated q and k."""
    heads = rot.shape[1]
    dq, drot_q = rotate_backward(_grouped(dqr, heads), _grouped(q, heads), rot[:, :, None])  # (B, Hkv, G, N, d)
    dk, drot_k = rotate_backward(dkr, k, rot)  # (B, Hkv, N, d)
    drot = None
    if needs_rot:
        drot_q = _sum_to(drot_q.sum(2), rot.shape)  # each query group's, summed
        drot = _sum_to(drot_k, rot.shape).add_(drot_q).to(rot.dtype)
    return dq.view(q.shape), dk, drot


def _sum_to(x: Tensor, shape: torch.Size) -> Tensor:
    """x summed over the dims ``shape`` broadcast (a rot shared by heads or batch rows)."""
    dims = [i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1]
    return x.sum(dims, keepdim=True) if dims else x


class RotateQK(torch.autograd.Function):
    """(q, k, rot, dtype) -> (q rotated, k rotated) in ``dtype``; keeps q, k and rot for backward."""

    @staticmethod
    def forward(ctx, q, k, rot, dtype):  # noqa: D102
        ctx.save_for_backward(q, k, rot)
        return rotate_q(q, rot, dtype), rotate_k(k, rot, dtype)

    @staticmethod
    def backward(ctx, dqr, dkr):  # noqa: D102
        q, k, rot = ctx.saved_tensors
        dqr = torch.zeros_like(q) if dqr is None else dqr
        dkr = torch.zeros_like(k) if dkr is None else dkr
        dq, dk, drot = rotate_qk_backward(dqr, dkr, q, k, rot, ctx.needs_input_grad[2])
        return dq, dk, drot, None
