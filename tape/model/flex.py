"""TAPE's one-QKᵀ attention through PyTorch's FlexAttention: value rows [V | E] in one call
(FlexAttention takes a value head dim other than q/k's), causal with lower-right alignment
(the queries are the last Nq of the Nk keys), grouped-query heads.

On CUDA the call is compiled (``torch.compile(flex_attention)``: one fused kernel, forward and
backward; a new (Nq, Nk) or grad mode recompiles, so it suits training and evaluation at fixed
shapes, not token-by-token decoding). Dynamo's recompile limit is raised to
``FLEX_RECOMPILE_LIMIT``: at its default of 8, the ninth shape silently ran PyTorch's unfused
reference, which materialises the N x N scores (an H200 sweep hit it at N = 16k). On CPU
PyTorch runs it unfused and has no backward: forward only.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any, Callable

import torch
from torch import Tensor


FLEX_RECOMPILE_LIMIT = 64
"""Compiled shapes (x grad modes) before dynamo gives up compiling flex_attention."""


_FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
"""Looked up once at import: torch 2.11's dynamo refuses to trace ``find_spec`` (a graph break in
every attention call of a compiled model)."""


def flex_available() -> bool:
    """PyTorch has FlexAttention (torch >= 2.5)."""
    return _FLEX_AVAILABLE


@lru_cache(maxsize=64)
def _causal_block_mask(n_queries: int, n_keys: int, device: str) -> Any:
    """The block mask of lower-right-aligned causal attention, built once per shape and device."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = n_keys - n_queries

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx + offset >= kv_idx

    return create_block_mask(causal, None, None, n_queries, n_keys, device=device)


@lru_cache(maxsize=2)
def _flex_fn(device_type: str) -> Callable[..., Tensor]:
    """flex_attention, compiled for CUDA; as it is elsewhere (PyTorch's unfused reference)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        return flex_attention
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, FLEX_RECOMPILE_LIMIT)
    return torch.compile(flex_attention, dynamic=False)


def flex_attend(q: Tensor, k: Tensor, values: Tensor, scale: float) -> Tensor:
    """softmax(q kᵀ · scale, causal) · values. q: (B, H, Nq, d); k: (B, Hkv, Nk, d);
    values: (B, Hkv, Nk, dv) with any dv (here [V | E]). Returns (B, H, Nq, dv)."""
    if q.device.type != "cuda" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, values)):
        raise RuntimeError(
            "attn_backend='flex' has no backward on CPU (PyTorch's FlexAttention); use it on CUDA, "
            "under torch.no_grad() on CPU, or choose attn_backend='auto'")
    shape = (q.shape[-2], k.shape[-2], str(q.device))
    if torch.compiler.is_compiling():  # inside a compiled model: the outer compile fuses the call
        from torch.nn.attention.flex_attention import flex_attention as fn

        mask = _causal_block_mask.__wrapped__(*shape)  # traced, not cached (dynamo skips caches)
    else:
        fn, mask = _flex_fn(q.device.type), _causal_block_mask(*shape)
    return fn(q, k, values, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
