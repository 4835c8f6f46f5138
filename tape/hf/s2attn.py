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


def _grouped_causal(q: Tensor, k: Tensor, v: Tensor, n_groups: int, mask: Tensor | None, scale: float) -> Tensor:
    """Causal attention within consecutive groups. q, k, v: (B, h, N, d) -> (B, h, N, d)."""
    b, h, n, d = q.shape
    g = n // n_groups
    split = lambda t: t.reshape(b, h, n_groups, g, d)  # noqa: E731
    if mask is None:
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True, scale=scale)
    else:
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask, scale=scale)
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
    plain = _grouped_causal(q[:, : h // 2], k[:, : h // 2], v[:, : h // 2], n_groups, None, scale)
    # Shifted heads: roll by half a group, so group j holds tokens [j*g + g/2, (j+1)*g + g/2).
    # The last rolled group holds the tail [N - g/2, N) followed by the head [0, g/2): the
    # mask keeps them apart (each causal on its own), so no token attends to a later one.
    roll = lambda t: t[:, h // 2 :].roll(-half, dims=2)  # noqa: E731
    causal = torch.ones(g, g, dtype=torch.bool, device=q.device).tril()
    last = causal.clone()
    last[half:, :half] = False  # the wrapped head must not see the tail
    mask = torch.stack([causal] * (n_groups - 1) + [last])  # (G, g, g)
    shifted = _grouped_causal(roll(q), roll(k), roll(v), n_groups, mask, scale).roll(half, dims=2)
    return torch.cat([plain, shifted], dim=1)


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
