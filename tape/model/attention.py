"""One attention shim for every PE: same results from every backend, the fastest exact path picked.

``attend`` computes softmax(q kᵀ / sqrt(d) + bias + mask) · V and, for TAPE, the same weights
applied to extra value rows E. Backends (``attn_backend``):
- ``triton``: ``tape.kernels.triton_attention``, one QKᵀ and one online softmax for [V | E] with a
  backward that sums both value paths into dq and dk. Needs triton, no bias or padding mask,
  head dims <= 128; TAPE calls only (calls without E go on as ``auto``). On CPU tensors it runs
  under the Triton interpreter (slow: tests only). Run on an H100: results/gpu.md.
- ``flex``: PyTorch's FlexAttention (``tape.model.flex``), one QKᵀ for [V | E] in one call,
  compiled on CUDA (bf16/fp16 there); TAPE calls without bias or padding mask only (others go on
  as ``auto``). On CPU forward only. ``auto`` takes it only where ``CUDA_TAPE_PATH`` names it
  (a measurement).
- ``flash``: flash-attn (CUDA, fp16/bf16, no arbitrary bias or padding mask), one call per value
  tensor, since FlashAttention-2 wants V as wide as q and k.
- ``sdpa``: PyTorch scaled_dot_product_attention; takes every call.
- ``eager``: A materialised once and multiplied by V and E (only when asked for).

``auto`` falls back in this order. A call without E (every PE but TAPE): flash, else sdpa.
A TAPE call on CUDA, when ``tape_fused`` is true or null: ``CUDA_TAPE_PATH`` (the Triton kernel,
or FlexAttention, or for null SDPA's two calls or one ``concat`` call, whichever a GPU measures
fastest) where it can run the call, then triton;
else two equal-width calls with flash-attn or under grouped-query attention (SDPA's fast kernels
want V as wide as q/k there), else one SDPA ``concat`` call (its memory-efficient and cuDNN
kernels take a wider value).
A TAPE call on CPU: one SDPA call, ``concat`` up to ``CPU_CONCAT_MAX_KEYS`` keys, else ``padded``.
Under ``torch.compile`` ``auto`` never takes the Triton kernel (an opaque autograd Function to the
compiler): FlexAttention (CUDA bf16/fp16), else SDPA, both traced into the compiled graph. A
forced ``triton`` runs eagerly there (a graph break).

The SDPA value layouts (``fuse``, TAPE's ``tape_fused`` option):
- ``"two_calls"`` (False): one call per value tensor of equal width (QKᵀ and softmax twice);
- ``"concat"``: one call with [V | E] (width 2d). On CPU a value wider than q/k drops SDPA to its
  math kernel, which still wins for short sequences and loses for long ones (fwd+bwd CPU time
  against two calls, 1 thread, 12 heads of 64: 0.93x at N = 256, 0.87x at 512, 1.43x at 1024);
- ``"padded"``: one call with q and k zero-padded to [V | E]'s width (the logits are unchanged;
  the scale stays 1/sqrt(d)), so CPU's flash kernel takes it (0.97x two calls at N = 1024);
- True: one QKᵀ: the Triton kernel where ``auto`` would take it, else one SDPA call as on CPU;
- None (auto): as above.
All paths are exact; tests check that they agree.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from tape import kernels
from tape.model.flex import flex_attend, flex_available
from tape.model.recompute import recomputed_in_backward
from tape.model.rotation import rotate_with_recipes
from tape.pe.rope import rotate_grouped

Backend = Literal["auto", "flash", "triton", "flex", "sdpa", "eager"]
BACKENDS = ("auto", "flash", "triton", "flex", "sdpa", "eager")
Fuse = Union[bool, Literal["two_calls", "concat", "padded"], None]
CUDA_TAPE_PATHS = ("triton", "flex", "two_calls", "concat")
CUDA_TAPE_PATH: Literal["triton", "flex", "two_calls", "concat"] = "triton"
"""``auto``'s choice for a TAPE call on CUDA, by measurement: the fastest path in the attention
sweep's forward+backward (``python -m pipelines.attention_sweep``, its "fastest TAPE path" row,
which uses these names) and the benchmark's training step (results/gpu.md, "the fastest TAPE path
in the training step"); the Triton kernel until a GPU says otherwise. two_calls / concat send
``tape_fused=null`` to SDPA; ``tape_fused=true`` still takes a one-QKᵀ path (the kernel)."""
CPU_CONCAT_MAX_KEYS = 512
"""On CPU, up to this many keys one [V | E] math call beats two flash calls; beyond, ``padded``."""

try:  # optional GPU extra: pip install -e .[flash]
    from flash_attn import flash_attn_func as _flash_attn_func
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_attn_func = None


def flash_available() -> bool:
    return _flash_attn_func is not None and torch.cuda.is_available()


def triton_available() -> bool:
    """The Triton kernel can be imported (tape.kernels.triton_attention)."""
    return kernels.triton_available()


def _device_type(x: Tensor) -> str:
    """The device kind the choice is made for (one seam, so tests can fake CUDA on CPU tensors)."""
    return x.device.type


@dataclass(frozen=True)
class Plan:
    """How one ``attend`` call runs: the backend and how A·V and A·E come out of it."""

    backend: str  # "flash" | "triton" | "flex" | "sdpa" | "eager"
    values: str  # "single" (no E, or one pass: eager, triton, flex) | "two_calls" | "concat" | "padded"


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


_WEIGHT_SINKS: list[list[Tensor]] = []


@contextlib.contextmanager
def recorded_weights() -> Iterator[list[Tensor]]:
    """Inside, every ``eager`` call appends its attention weights (B, H, Nq, Nk), detached, to the
    list this yields (measurements: tape.metrics.shift_robustness)."""
    sink: list[Tensor] = []
    _WEIGHT_SINKS.append(sink)
    try:
        yield sink
    finally:
        _WEIGHT_SINKS.remove(sink)


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
    for sink in _WEIGHT_SINKS:
        sink.append(probs.detach())
    return [torch.matmul(probs, _repeat_kv(v, groups)) for v in values]


def _sdpa(q, k, v, mask, bias, is_causal, scale):
    nq, nk = q.shape[-2], k.shape[-2]
    if is_causal and bias is None and nq != nk:  # SDPA's is_causal aligns upper-left
        mask, is_causal = causal_mask(nq, None, nk, q.device), False
    attn_mask = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
        elif is_causal:
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


@torch.compiler.disable  # forced under torch.compile: run the kernel eagerly (a graph break)
def _triton(q, k, v, extra, scale, rotation=None):
    from tape.kernels.triton_attention import fused_attention, takes_wide

    if not takes_wide(extra, v):
        extra = extra.to(v.dtype)
    if rotation is not None:  # q and k unrotated: rotated inside one autograd node with the kernel
        from tape.model.rotary_attention import rotary_fused_attention

        return list(rotary_fused_attention(q, k, v, extra, rotation, scale))
    return list(fused_attention(q, k, v, extra, scale))  # a float32 E is cast inside, saved uncast


def _flash_ok(q: Tensor, mask: Tensor | None, bias: Tensor | None, alibi: bool) -> bool:
    return (
        flash_available()
        and _device_type(q) == "cuda"
        and q.dtype in (torch.float16, torch.bfloat16)
        and mask is None
        and (bias is None or alibi)
        and q.shape[-1] <= 256
    )


def _triton_ok(q: Tensor, k: Tensor, extra: Tensor | None, mask: Tensor | None, bias: Tensor | None) -> bool:
    return (
        extra is not None
        and triton_available()
        and mask is None
        and bias is None
        and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and max(q.shape[-1], extra.shape[-1]) <= 128
        and q.shape[-2] <= k.shape[-2]
    )


def _flex_ok(q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None) -> bool:
    """FlexAttention can run this call. On CUDA bf16/fp16 only: torch 2.11's compiled fp32 kernel
    with value [V | E] (width 128) found no launch config on an H200 (results/gpu-check/20261127-185221)."""
    low_precision = _device_type(q) != "cuda" or q.dtype in (torch.float16, torch.bfloat16)
    return flex_available() and low_precision and mask is None and bias is None and q.shape[-2] <= k.shape[-2]


def _one_sdpa_call(q: Tensor, k: Tensor) -> str:
    """The single-call form for SDPA: CUDA takes a wider value; CPU picks by length."""
    if _device_type(q) == "cuda":
        return "concat"
    return "concat" if k.shape[-2] <= CPU_CONCAT_MAX_KEYS else "padded"


def plan_attention(
    backend: Backend, fuse: Fuse, q: Tensor, k: Tensor, extra: Tensor | None,
    mask: Tensor | None, bias: Tensor | None, alibi: bool,
) -> Plan:
    """The backend and value layout for this call (the fallback order of the module docstring),
    and a check that a forced backend can run it."""
    flash_ok = _flash_ok(q, mask, bias, alibi)
    if backend not in BACKENDS:
        raise ValueError(f"attn_backend={backend!r}; choose {', '.join(BACKENDS)}")
    if fuse not in (True, False, None, "two_calls", "concat", "padded"):
        raise ValueError(f"tape_fused={fuse!r}; choose true, false, null, two_calls, concat or padded")
    if backend == "flash" and not flash_ok:
        raise RuntimeError(
            "attn_backend='flash' needs flash-attn installed (pip install -e .[flash]), a CUDA "
            "device, fp16/bf16 inputs, no padding mask and no bias other than ALiBi; "
            "use attn_backend='auto' to fall back to SDPA"
        )
    if backend == "triton" and extra is not None and not _triton_ok(q, k, extra, mask, bias):
        raise RuntimeError(
            "attn_backend='triton' needs triton installed (pip install triton), no padding mask "
            "or attention bias (use it for unpadded TAPE batches), head dims <= 128 and at most "
            "as many queries as keys; use attn_backend='auto' to fall back to SDPA"
        )
    if backend == "flex" and extra is not None and not _flex_ok(q, k, mask, bias):
        raise RuntimeError(
            "attn_backend='flex' needs PyTorch's FlexAttention (torch >= 2.5), bf16/fp16 inputs on CUDA, "
            "no padding mask or attention bias (use it for unpadded TAPE batches) and at most as many "
            "queries as keys; use attn_backend='auto' to fall back to SDPA"
        )
    if extra is None:  # one value tensor: the Triton kernel and the flex path are for [V | E] only
        if backend in ("sdpa", "eager"):
            return Plan(backend, "single")
        return Plan("flash" if flash_ok else "sdpa", "single")
    mode = {True: "one", False: "two_calls", None: "auto"}.get(fuse, fuse)  # type: ignore[arg-type]
    cuda = _device_type(q) == "cuda"
    if backend == "eager":
        return Plan("eager", "single")
    if backend in ("triton", "flex"):
        return Plan(backend, "single")
    if backend == "flash":
        return Plan("flash", "two_calls")
    if backend == "auto" and mode == "auto" and cuda and CUDA_TAPE_PATH in ("two_calls", "concat"):
        if CUDA_TAPE_PATH == "concat" and q.shape[1] == k.shape[1]:  # GQA: V as wide as q/k
            return Plan("sdpa", "concat")
        return Plan("flash" if flash_ok else "sdpa", "two_calls")
    if backend == "auto" and mode in ("one", "auto") and cuda:
        compiling = torch.compiler.is_compiling()  # the compiler traces flex and SDPA, not our kernel
        if (CUDA_TAPE_PATH == "flex" or compiling) and _flex_ok(q, k, mask, bias):
            return Plan("flex", "single")
        if not compiling and _triton_ok(q, k, extra, mask, bias):
            return Plan("triton", "single")
    gqa = q.shape[1] != k.shape[1]
    if mode == "two_calls" or (backend == "auto" and mode == "auto" and cuda and (flash_ok or gqa)):
        return Plan("flash" if flash_ok and backend == "auto" else "sdpa", "two_calls")
    return Plan("sdpa", _one_sdpa_call(q, k) if mode in ("one", "auto") else mode)


def pick_backend(
    backend: Backend, q: Tensor, mask: Tensor | None, bias: Tensor | None, alibi: bool,
    extra: Tensor | None = None, k: Tensor | None = None, fuse: Fuse = None,
) -> str:
    """The backend ``auto`` resolves to for this call (and a check that a forced one can run)."""
    return plan_attention(backend, fuse, q, q if k is None else k, extra, mask, bias, alibi).backend


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    extra: Tensor | None = None,
    rotation: Tensor | None = None,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    backend: Backend = "auto",
    fuse: Fuse = None,
) -> tuple[Tensor, Tensor | None]:
    """Causal attention. q: (B, H, Nq, d); k, v: (B, Hkv, Nk, d); extra: (B, Hkv, Nk, de).

    rotation: (B, Hkv or 1, N, d) as [cos | sin] (TAPE's E), with q and k unrotated and Nq == Nk:
    q and k are rotated by it (``rope.rotate_grouped``'s rule, in >= float32, then cast to v's
    dtype) in one autograd node that keeps them unrotated for backward (on the Triton kernel, the
    kernel's node); SDPA saves the rotated ones as recipes (``tape.model.recompute``).

    mask: (B or 1, 1, Nq, Nk) bool from ``causal_mask`` (padding), or None for plain causal
    attention, lower-right aligned: the Nq queries are the last of the Nk keys (a KV cache).
    bias: (B or 1, H, Nq, Nk) float, added to the logits; when it is ALiBi, pass its
    ``alibi_slopes`` too so flash-attn can apply it.
    extra is aggregated in v's dtype (TAPE keeps E in float32 and adds A·E back into it).
    Returns (A·V of shape (B, H, Nq, d), A·extra of shape (B, H, Nq, de) or None).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    is_causal = mask is None and q.shape[-2] > 1  # one query sees every key
    plan = plan_attention(backend, fuse, q, k, extra, mask, bias, alibi_slopes is not None)
    saved_as_recipes = contextlib.nullcontext()
    if rotation is not None and plan.backend != "triton":
        if torch.compiler.is_compiling():  # traced operators: the compiler plans what to save
            q, k = rotate_grouped(q, k, rotation)
            q, k = q.to(v.dtype), k.to(v.dtype)
        else:
            q, k, recipes = rotate_with_recipes(q, k, rotation, v.dtype)
            if plan.backend in ("sdpa", "eager"):  # not flex: its compiled code saves for itself
                saved_as_recipes = recomputed_in_backward(recipes)
        rotation = None
    if extra is not None and plan.backend != "triton":  # the kernel takes E as it is (_triton)
        extra = extra.to(v.dtype)
    values = [v] if extra is None else [v, extra]
    with saved_as_recipes:
        outs = _dispatch(plan, q, k, v, extra, values, mask, bias, alibi_slopes, is_causal, scale, rotation)
    return outs[0], (outs[1] if extra is not None else None)


def _dispatch(plan, q, k, v, extra, values, mask, bias, alibi_slopes, is_causal, scale, rotation):
    """The attention outputs [A·V, A·extra] by the plan's backend and value layout."""
    width = v.shape[-1]
    if plan.backend == "eager":
        outs = _eager(q, k, values, mask, bias, is_causal, scale)
    elif plan.backend == "triton":
        outs = _triton(q, k, v, extra, scale, rotation)
    elif plan.backend == "flex":
        both = flex_attend(q, k, torch.cat([v, extra], dim=-1), scale)  # (B, H, Nq, d + de)
        outs = [both[..., :width], both[..., width:]]
    elif plan.backend == "flash":
        slopes = alibi_slopes.to(q.device, torch.float32) if bias is not None else None
        outs = [_flash(q, k, val, slopes, scale) for val in values]
    elif plan.values in ("concat", "padded"):
        both = torch.cat([v, extra], dim=-1)  # (B, Hkv, Nk, d + de)
        if plan.values == "padded":  # zero channels leave q kᵀ unchanged; scale passed explicitly
            pad = both.shape[-1] - q.shape[-1]
            q, k = F.pad(q, (0, pad)), F.pad(k, (0, pad))
        both = _sdpa(q, k, both, mask, bias, is_causal, scale)
        outs = [both[..., :width], both[..., width:]]
    else:
        outs = [_sdpa(q, k, val, mask, bias, is_causal, scale) for val in values]
    return outs
