"""One attention shim for every PE: flash-attn -> PyTorch SDPA -> eager, same results.

``attend`` computes softmax(q kᵀ / sqrt(d) + bias + mask) · V and, for TAPE, the same weights
applied to extra value rows E. How it gets A·V and A·E depends on the backend:
- eager: A is materialised once and multiplied by V and E (truly fused);
- SDPA: ``fuse=True`` concatenates [V | E] into one call; ``fuse=False`` makes two calls of equal
  width; ``fuse=None`` (auto) makes one call except on CPU, where a wider value drops SDPA to
  its math kernel, so two calls are faster there;
- flash-attn (CUDA, fp16/bf16, no arbitrary bias or padding mask): one call per value tensor,
  since FlashAttention-2 wants the value head dim equal to the query's.
All paths are exact; tests check that they agree.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Backend = Literal["auto", "flash", "sdpa", "eager"]

try:  # optional GPU extra: pip install -e .[flash]
    from flash_attn import flash_attn_func as _flash_attn_func
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_attn_func = None


def flash_available() -> bool:
    return _flash_attn_func is not None and torch.cuda.is_available()


def causal_mask(
    n_queries: int, key_valid: Tensor | None, n_keys: int, device: torch.device
) -> Tensor:
    """(B or 1, 1, Nq, Nk) bool, True = may attend. The queries are the last Nq of the Nk keys
    (lower-right alignment, right for a KV cache). Padded keys are masked; a query may always
    attend to itself, so a padded query's row is never empty (its output is ignored)."""
    q_idx = torch.arange(n_keys - n_queries, n_keys, device=device)[:, None]  # (Nq, 1)
    k_idx = torch.arange(n_keys, device=device)[None, :]  # (1, Nk)
    mask = (k_idx <= q_idx)[None, None]  # (1, 1, Nq, Nk)
    if key_valid is not None:
        mask = mask & key_valid[:, None, None, :]
        mask = mask | (k_idx == q_idx)[None, None]
    return mask


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, Hkv, N, d) -> (B, Hkv * groups, N, d), each kv head repeated for its query group."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _eager(q, k, values, mask, bias, is_causal, scale):
    groups = q.shape[1] // k.shape[1]
    k = _repeat_kv(k, groups)
    acc = torch.promote_types(q.dtype, torch.float32)  # softmax in >= float32
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale  # (B, H, Nq, Nk)
    if bias is not None:
        scores = scores + bias
    if is_causal:
        nq, nk = scores.shape[-2:]
        mask = causal_mask(nq, None, nk, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1).to(q.dtype)
    return [torch.matmul(probs, _repeat_kv(v, groups)) for v in values]


def _sdpa(q, k, v, mask, bias, is_causal, scale):
    attn_mask = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
        elif is_causal:
            nq, nk = bias.shape[-2:]
            attn_mask = attn_mask.masked_fill(~causal_mask(nq, None, nk, q.device), float("-inf"))
        is_causal = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )


def _flash(q, k, v, alibi_slopes, scale):
    out = _flash_attn_func(  # flash layout (B, N, H, d); causal is lower-right aligned
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        softmax_scale=scale, causal=True, alibi_slopes=alibi_slopes,
    )
    return out.transpose(1, 2)


def pick_backend(
    backend: Backend, q: Tensor, mask: Tensor | None, bias: Tensor | None, alibi: bool
) -> str:
    """The backend ``auto`` resolves to for this call (and a check that a forced one can run)."""
    flash_ok = (
        flash_available()
        and q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and mask is None
        and (bias is None or alibi)
        and q.shape[-1] <= 256
    )
    if backend == "flash":
        if not flash_ok:
            raise RuntimeError(
                "attn_backend='flash' needs flash-attn installed (pip install -e .[flash]), a CUDA "
                "device, fp16/bf16 inputs, no padding mask and no bias other than ALiBi; "
                "use attn_backend='auto' to fall back to SDPA"
            )
        return "flash"
    if backend == "auto":
        return "flash" if flash_ok else "sdpa"
    return backend


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    extra: Tensor | None = None,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    backend: Backend = "auto",
    fuse: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Causal attention. q: (B, H, Nq, d); k, v: (B, Hkv, Nk, d); extra: (B, Hkv, Nk, de).

    mask: (B or 1, 1, Nq, Nk) bool from ``causal_mask``, or None for the plain causal case
    (Nq == Nk, or a single query that sees every key). bias: (B or 1, H, Nq, Nk) float, added to
    the logits; when it is ALiBi, pass its ``alibi_slopes`` too so flash-attn can apply it.
    Returns (A·V of shape (B, H, Nq, d), A·extra of shape (B, H, Nq, de) or None).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    is_causal = mask is None and q.shape[-2] == k.shape[-2] and q.shape[-2] > 1
    chosen = pick_backend(backend, q, mask, bias, alibi_slopes is not None)
    values = [v] if extra is None else [v, extra]
    if fuse is None:
        fuse = q.is_cuda

    if chosen == "eager":
        outs = _eager(q, k, values, mask, bias, is_causal, scale)
    elif chosen == "flash":
        slopes = alibi_slopes.to(q.device, torch.float32) if bias is not None else None
        outs = [_flash(q, k, val.to(q.dtype), slopes, scale) for val in values]
    elif fuse and extra is not None:
        width = v.shape[-1]
        both = _sdpa(q, k, torch.cat([v, extra.to(v.dtype)], dim=-1), mask, bias, is_causal, scale)
        outs = [both[..., :width], both[..., width:]]
    else:
        outs = [_sdpa(q, k, val.to(q.dtype), mask, bias, is_causal, scale) for val in values]
    return outs[0], (outs[1] if extra is not None else None)
