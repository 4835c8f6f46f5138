"""TAPE's rotation of q and k by E as one autograd node that keeps q and k unrotated.

E's gradient through the rotation needs q and k unrotated; the attention's needs them rotated.
The node keeps the unrotated ones (and E, kept anyway) and writes the rotation's gradient by hand;
``rotate_q``/``rotate_k`` (or ``rotate_joined``) rebuild the rotated ones bit for bit, so the
attention can save them as recipes (``tape.model.recompute``) or recompute them itself (the Triton
node).

Where every head of q and k rotates by the same E rows (as many query as key heads, or one E for
all heads) q and k are joined into one tensor first, laid out token-major as the projections
write them (B, N, H + H, d): one rotation of the pair, forward and backward, instead of one each
(one copy more; in all 18 device operators less a layer, forward, backward and rebuilds), and
the gradients of q and k are views of the joined one's.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from tape.model.recompute import BuiltOnce
from tape.pe.rope import query_groups, rotate_backward, rotated


def rotate_q(q: Tensor, rot: Tensor, dtype: torch.dtype) -> Tensor:
    """q (B, H, N, d) rotated by its key/value head's rot (B, Hkv or 1, N, d), in >= float32 (a
    product and a multiply-add per channel), cast to ``dtype``. No autograd."""
    return rotated(query_groups(q, rot.shape[1]), rot[:, :, None], dtype).view(q.shape)


def rotate_k(k: Tensor, rot: Tensor, dtype: torch.dtype) -> Tensor:
    """k (B, Hkv, N, d) rotated by rot, as ``rotate_q``."""
    return rotated(k, rot, dtype)


def rotate_qk_backward(dqr: Tensor, dkr: Tensor, q: Tensor, k: Tensor, rot: Tensor,
                       needs_rot: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """The gradients of q, k (their dtypes) and rot (its dtype and shape; None unless
    ``needs_rot``) given those of the rotated q and k."""
    heads = rot.shape[1]
    dq, drot_q = rotate_backward(query_groups(dqr, heads), query_groups(q, heads),
                                 rot[:, :, None])  # (B, Hkv, G, N, d)
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


def joinable(q: Tensor, k: Tensor, rot: Tensor) -> bool:
    """q and k rotate as one tensor: one rot row for every head, or as many query heads as key
    heads and rot heads (no grouped-query sharing, whose query groups a joined view cannot split)."""
    return rot.shape[1] == 1 or q.shape[1] == k.shape[1] == rot.shape[1]


def join(q: Tensor, k: Tensor) -> Tensor:
    """q (B, H, N, d), k (B, Hk, N, d) -> (B, H + Hk, N, d): one copy, token-major (its memory
    (B, N, H + Hk, d)). Differentiable: the gradients of q and k are views of the joined one's."""
    return torch.cat([q.transpose(1, 2), k.transpose(1, 2)], dim=2).transpose(1, 2)


def _paired(x: Tensor, rot: Tensor) -> tuple[Tensor, Tensor]:
    """A joined (B, 2H, N, d) tensor and rot (B, H or 1, N, d) as views that broadcast."""
    if rot.shape[1] == 1:
        return x, rot
    b, heads, n, d = x.shape
    return x.view(b, 2, heads // 2, n, d), rot[:, None]


def rotate_joined(qk: Tensor, rot: Tensor, dtype: torch.dtype) -> Tensor:
    """A joined q and k (``join``) rotated by rot (B, H or 1, N, d), in >= float32, cast to
    ``dtype``, in qk's layout. No autograd."""
    x, r = _paired(qk, rot)
    return rotated(x, r, dtype).view(qk.shape)


def rotate_joined_backward(dqk: Tensor, qk: Tensor, rot: Tensor, needs_rot: bool) -> tuple[Tensor, Tensor | None]:
    """The gradients of the joined qk (its dtype and layout) and of rot (its dtype and shape;
    None unless ``needs_rot``) given the rotated one's, dqk."""
    (g, r), (x, _) = _paired(dqk, rot), _paired(qk, rot)
    dx, drot = rotate_backward(g, x, r)
    return dx.view(qk.shape), (_sum_to(drot, r.shape).view(rot.shape).to(rot.dtype) if needs_rot else None)


class RotateQK(torch.autograd.Function):
    """(q, k, rot, dtype) -> (q rotated, k rotated) in ``dtype``; keeps q, k and rot for backward."""

    @staticmethod
    def forward(ctx, q, k, rot, dtype):  # noqa: D102
        ctx.save_for_backward(q, k, rot)
        return rotate_q(q, rot, dtype), rotate_k(k, rot, dtype)

    @staticmethod
    def backward(ctx, dqr, dkr):  # noqa: D102
        q, k, rot = ctx.saved_tensors
        dq, dk, drot = rotate_qk_backward(dqr, dkr, q, k, rot, ctx.needs_input_grad[2])
        return dq, dk, drot, None


class RotateJoined(torch.autograd.Function):
    """(qk joined, rot, dtype, heads) -> (q rotated, k rotated), views of one tensor in ``dtype``
    (q: the first ``heads`` heads); keeps qk and rot for backward."""

    @staticmethod
    def forward(ctx, qk, rot, dtype, heads):  # noqa: D102
        ctx.save_for_backward(qk, rot)
        ctx.heads = heads
        out = rotate_joined(qk, rot, dtype)
        return out[:, :heads], out[:, heads:]

    @staticmethod
    def backward(ctx, dqr, dkr):  # noqa: D102
        qk, rot = ctx.saved_tensors
        dqk, drot = rotate_joined_backward(join(dqr, dkr), qk, rot, ctx.needs_input_grad[1])
        return dqk, drot, None, None


Recipe = tuple[Tensor, Callable[[], Tensor]]


def rotate_with_recipes(q: Tensor, k: Tensor, rot: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor, list[Recipe]]:
    """q and k rotated by rot (one node that keeps them unrotated) and cast to dtype, and for each
    a recipe that rebuilds it bit for bit from what that node keeps anyway: the attention then
    need not keep the rotated copies (``recompute``). Joined where ``joinable``; the joined
    rotation is rebuilt once for both."""
    if not joinable(q, k, rot):
        q_rot, k_rot = RotateQK.apply(q, k, rot, dtype)
        return q_rot, k_rot, [(q_rot, lambda: rotate_q(q, rot, dtype)), (k_rot, lambda: rotate_k(k, rot, dtype))]
    heads = q.shape[1]
    qk = join(q, k)
    q_rot, k_rot = RotateJoined.apply(qk, rot, dtype, heads)
    both = BuiltOnce(lambda: rotate_joined(qk, rot, dtype), unread=2)  # q's recipe and k's
    return q_rot, k_rot, [(q_rot, lambda: both()[:, :heads]), (k_rot, lambda: both()[:, heads:])]

