"""Shifted sparse attention (S²-Attn, LongLoRA; tape-spec B.3) as a transformers attention
function, registered as ``"s2attn"``.

In training the sequence is cut into ``n_groups`` groups and each query attends causally within
its group; half of the heads use groups shifted by half a group, so information crosses group
borders. LongLoRA rolls the shifted heads around the sequence, which lets the first tokens see
the last ones; here the wrapped-around tail and head form two separate groups, so nothing sees
the future. With one group there is nothing to shift and S²-Attn is full causal attention. At
evaluation (``module.training`` False) it is full attention, as in the paper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

S2_ATTN_NAME = "s2attn"
DEFAULT_GROUPS = 4


def _causal_in_groups(q: Tensor, k: Tensor, v: Tensor, size: int, scale: float) -> Tensor:
    """Causal attention within consecutive groups of ``size`` tokens, groups folded into the head
    axis so that SDPA sees 4-D inputs and no mask (its flash kernels take neither 5-D inputs nor
    masks). q, k, v: (B, h, n, d), n a multiple of size -> (B, h, n, d)."""
    b, h, n, d = q.shape
    fold = lambda t: t.reshape(b, h * (n // size), size, d)  # noqa: E731 - (B, h·G, size, d)
    out = F.scaled_dot_product_attention(fold(q), fold(k), fold(v), is_causal=True, scale=scale)
    return out.reshape(b, h, n, d)


def shifted_sparse_attention(q: Tensor, k: Tensor, v: Tensor, n_groups: int = DEFAULT_GROUPS,
                             scale: float | None = None) -> Tensor:
    """q: (B, H, N, d), k/v: (B, H, N, d) (kv heads already repeated) -> (B, H, N, d)."""
    b, h, n, d = q.shape
    scale = scale if scale is not None else d ** -0.5
    if n_groups <= 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if n % n_groups or (n // n_groups) % 2:
        raise ValueError(
            f"S²-Attn needs the sequence length ({n}) to split into {n_groups} groups of even "
            "size; pad or pack training sequences to a multiple of 2 * n_groups"
        )
    g, half = n // n_groups, n // n_groups // 2
    plain = _causal_in_groups(q[:, : h // 2], k[:, : h // 2], v[:, : h // 2], g, scale)
    # Shifted heads: groups shifted by half a group, [j*g + g/2, (j+1)*g + g/2) for the G - 1
    # inner ones; LongLoRA's wrapped last group (the tail [N - g/2, N), then the head [0, g/2))
    # is kept as two groups, each causal on its own, so no token attends to a later one.
    q2, k2, v2 = q[:, h // 2 :], k[:, h // 2 :], v[:, h // 2 :]
    part = lambda lo, hi: (q2[:, :, lo:hi], k2[:, :, lo:hi], v2[:, :, lo:hi])  # noqa: E731
    inner = _causal_in_groups(*part(half, n - half), g, scale)
    head = F.scaled_dot_product_attention(*part(0, half), is_causal=True, scale=scale)
    tail = F.scaled_dot_product_attention(*part(n - half, n), is_causal=True, scale=scale)
    return torch.cat([plain, torch.cat([head, inner, tail], dim=2)], dim=1)


def s2attn_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                   attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs) -> tuple[Tensor, None]:
    """transformers attention-function signature; returns ((B, N, H, d), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    n_groups = getattr(module.config, "s2attn_groups", DEFAULT_GROUPS)
    out = shifted_sparse_attention(query, key, value, n_groups, scaling)
    return out.transpose(1, 2).contiguous(), None


def register_s2attn() -> str:
    """Register S²-Attn with transformers (idempotent); returns its attn_implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(S2_ATTN_NAME, s2attn_forward)
    AttentionMaskInterface.register(S2_ATTN_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return S2_ATTN_NAME
