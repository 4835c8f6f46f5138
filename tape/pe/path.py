"""PaTH, position encoding by accumulated Householder-like transforms (Yang et al., NeurIPS 2025).

Each token t carries, per KV head, a transform H_t = I - beta_t w_t w_tᵀ with a unit direction
w_t = normalize(W_w x_t) and a strength beta_t = 2 sigmoid(W_beta x_t + b) in (0, 2), both read
from the layer's attention input x_t (the normed hidden state). The logit of query i on key j <= i
is

    s_ij = q_iᵀ H_i H_{i-1} ... H_{j+1} k_j / sqrt(d)     (the identity when i = j),

so positions are data-dependent: no position id is read, and left padding (which precedes every
real key) never enters a real pair's product. Query heads of a group share their KV head's
transforms (KV sharing survives GQA). At beta = 0 every H_t is I and PaTH is NoPE.

Computation, O(N²·d + N³) per head, materialising (B, H, N, N) like CoPE: the product of the
transforms over any contiguous range (j, i] has the compact (UT) form I - U_R T_Rᵀ U_Rᵀ with
T = (I + diag(beta) striu(U Uᵀ))⁻¹ diag(beta), upper triangular, and since T is triangular its
block over R equals the transform of that range alone. Hence, with A_is = q_i·u_s (s <= i) and
B_tj = u_t·k_j (t > j), every logit at once is

    s = (Q Kᵀ - A Tᵀ B) / sqrt(d),

and attention gets the difference from the plain q·k as an additive float32 bias. A KV cache
keeps, per layer, every key carried through the transforms up to the last cached token
(``KVCache.pe_rows``); a new chunk continues from them.

On CUDA, ``path_kernel`` (``auto`` by default) sends bf16/fp16 calls without a cache or padding
mask, at head dim 16, 32, 64 or 128, to flash-linear-attention's chunked kernel
(``parallel_path_attn``, ``pip install fla-core``; directions and strengths stay float32), which
never materialises the N x N matrix; every other call, and ``path_kernel=reference``, runs the
computation above. Both compute the same attention (tests/test_path.py checks ours against
flash-linear-attention's PyTorch reference; tests/test_cuda_paths.py the kernel, on a GPU).

Not here: the paper's low-rank direction projection with a short convolution (W_w is one linear
map).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tape.pe import register
from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionState, without_autocast

KERNELS = ("auto", "reference", "fla")
FLA_HEAD_DIMS = (16, 32, 64, 128)


@dataclass
class PaTHOptions(PEOptions):
    path_kernel: str = "auto"
    """``reference`` (ours, every call), ``fla`` (flash-linear-attention's kernel, an error
    where it cannot run) or ``auto`` (the kernel where it can run, else the reference). Calls
    with a KV cache (cached decoding) always run the reference."""

    def problems(self, cfg: "ModelConfig") -> list[str]:
        if self.path_kernel not in KERNELS:
            return [f"path_kernel={self.path_kernel!r} must be one of {list(KERNELS)}"]
        return []

if TYPE_CHECKING:
    from tape.model.cache import KVCache
    from tape.model.config import ModelConfig


@dataclass
class PaTHState(PositionState):
    """PositionState plus the current layer's transforms (set by before_attention)."""

    directions: Tensor | None = None  # (B, Hkv, N, d) unit w_t of this call's tokens
    strengths: Tensor | None = None  # (B, Hkv, N) beta_t in [0, 2]
    carried_keys: Tensor | None = None  # (B, Hkv, T_past, d) cached keys carried to the last cached token
    cache: Any = None  # the KVCache whose pe_rows this layer updates (None: no cache)
    layer_idx: int = 0


def range_transforms(directions: Tensor, strengths: Tensor) -> Tensor:
    """directions (..., N, d) unit, strengths (..., N) -> T (..., N, N) upper triangular with
    H_a ... H_b = I - U_R T_RR U_Rᵀ for every contiguous range R = [a, b]."""
    n = directions.shape[-2]
    gram = torch.matmul(directions, directions.transpose(-1, -2)).triu(1)  # (..., N, N)
    eye = torch.eye(n, dtype=directions.dtype, device=directions.device)
    unit_upper = eye + strengths[..., :, None] * gram
    return torch.linalg.solve_triangular(unit_upper, torch.diag_embed(strengths), upper=True,
                                         unitriangular=True)


def transformed_key_terms(directions: Tensor, strengths: Tensor, keys: Tensor, n_past: int) -> Tensor:
    """C (..., N, T) with C_sj = sum_t T_ts (u_t·k_j) over this call's tokens t > j: the
    coefficients of u_s in what the transforms remove from key j. keys (..., T, d) are the
    carried past keys followed by this call's N keys; past keys see every new transform."""
    n, total = directions.shape[-2], keys.shape[-2]
    t_idx = torch.arange(n, device=keys.device)[:, None]
    key_idx = torch.arange(total, device=keys.device)[None, :] - n_past  # < 0 for past keys
    projections = torch.matmul(directions, keys.transpose(-1, -2)) * (t_idx > key_idx)  # (..., N, T)
    return torch.matmul(range_transforms(directions, strengths).transpose(-1, -2), projections)


_FLA_INSTALLED = importlib.util.find_spec("fla") is not None  # at import: dynamo cannot trace find_spec


def fla_installed() -> bool:
    return _FLA_INSTALLED


def why_not_fla(q: Tensor, mask: Tensor | None) -> str | None:
    """Why flash-linear-attention's kernel cannot run this call (q (B, H, N, d)), or None."""
    if q.device.type != "cuda":
        return f"it runs on CUDA only (this call is on {q.device.type})"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"it takes bf16/fp16 q, k, v (these are {q.dtype}; train with bf16 autocast)"
    if q.shape[-1] not in FLA_HEAD_DIMS:
        return f"it supports head dims {list(FLA_HEAD_DIMS)} (this model has {q.shape[-1]})"
    if mask is not None:
        return "it has no padding mask (this call has one)"
    if not fla_installed():
        return "flash-linear-attention is not installed (pip install fla-core einops)"
    return None


def fla_path_attention(q: Tensor, k: Tensor, v: Tensor, directions: Tensor, strengths: Tensor,
                       scale: float) -> Tensor:
    """flash-linear-attention's PaTH kernel in this module's layout: q (B, H, N, d), k and v
    (B, Hkv, N, d), directions (B, Hkv, N, d) and strengths (B, Hkv, N) float32 -> (B, H, N, d)."""
    from fla.ops.path_attn import parallel_path_attn

    out, _ = parallel_path_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                directions.transpose(1, 2), strengths.transpose(1, 2), scale=scale)
    return out.transpose(1, 2)


class PaTHLayer(LayerPE):
    def __init__(self, d_model: int, n_kv_heads: int, head_dim: int, kernel: str = "auto") -> None:
        super().__init__()
        self.direction = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.strength = nn.Linear(d_model, n_kv_heads, bias=True)
        self.heads = (n_kv_heads, head_dim)
        self.kernel = kernel

    def transforms(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, N, C) -> unit directions (B, Hkv, N, d) and strengths (B, Hkv, N) in (0, 2),
        in float32 or wider."""
        b, n, _ = x.shape
        dt = torch.promote_types(x.dtype, torch.float32)
        with without_autocast(x.device):
            xf = x.to(dt)
            w = F.linear(xf, self.direction.weight.to(dt)).view(b, n, *self.heads).transpose(1, 2)
            z = F.linear(xf, self.strength.weight.to(dt), self.strength.bias.to(dt)).transpose(1, 2)
        return F.normalize(w, dim=-1), 2.0 * torch.sigmoid(z)

    def before_attention(
        self, state: PositionState, x: Tensor, cache: "KVCache | None", layer_idx: int
    ) -> PositionState:
        directions, strengths = self.transforms(x)
        carried = cache.pe_rows[layer_idx] if cache is not None else None
        return replace(state, directions=directions, strengths=strengths, carried_keys=carried,
                       cache=cache, layer_idx=layer_idx)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, state: PositionState,
                  mask: Tensor | None) -> Tensor | None:
        """flash-linear-attention's kernel for this call per ``path_kernel``; None: the reference."""
        if self.kernel == "reference":
            return None
        reason = why_not_fla(q, mask)
        if reason is not None:
            if self.kernel == "fla":
                raise RuntimeError(f"pe.path_kernel=fla cannot run this call: {reason}; "
                                   "use pe.path_kernel=auto to fall back to the reference")
            return None
        if not isinstance(state, PaTHState) or state.directions is None:
            raise RuntimeError("PaTH's attention needs before_attention to run first in this layer")
        return fla_path_attention(q, k, v, state.directions, state.strengths, 1.0 / math.sqrt(q.shape[-1]))

    def score_bias(self, q: Tensor, k: Tensor, state: PositionState, mask: Tensor | None) -> Tensor:
        """q (B, H, N, d), k (B, Hkv, T, d) every raw key -> (s - q·k/sqrt(d)), (B, H, N, T)
        float32 (float64 in a float64 model). Writes the carried keys to the cache, if any."""
        if not isinstance(state, PaTHState) or state.directions is None:
            raise RuntimeError("PaTH's score_bias needs before_attention to run first in this layer")
        n, total = q.shape[-2], k.shape[-2]
        n_past = total - n
        groups = q.shape[1] // k.shape[1]
        with without_autocast(q.device):
            acc = torch.promote_types(q.dtype, torch.float32)
            qf, kf = q.to(acc), k.to(acc)
            past = state.carried_keys
            if n_past and (past is None or past.shape[-2] != n_past):
                raise RuntimeError(f"PaTH found {n_past} cached keys but carried keys for "
                                   f"{0 if past is None else past.shape[-2]}: a cache from another model?")
            keys = kf if past is None else torch.cat([past.to(acc), kf[..., n_past:, :]], dim=-2)
            u, beta = state.directions.to(acc), state.strengths.to(acc)
            coeffs = transformed_key_terms(u, beta, keys, n_past)  # (B, Hkv, N, T)
            reach = torch.matmul(qf, u.repeat_interleave(groups, dim=1).transpose(-1, -2)).tril()  # s <= i
            removed = torch.matmul(reach, coeffs.repeat_interleave(groups, dim=1))  # (B, H, N, T)
            carried_shift = torch.matmul(qf, (keys - kf).repeat_interleave(groups, dim=1).transpose(-1, -2))
            if state.cache is not None:  # every key carried through this call's transforms
                state.cache.pe_rows[state.layer_idx] = keys - torch.matmul(coeffs.transpose(-1, -2), u)
            return (carried_shift - removed) / math.sqrt(q.shape[-1])

    def init_weights(self, std: float) -> None:
        with torch.no_grad():
            nn.init.normal_(self.direction.weight, std=std)
            nn.init.zeros_(self.strength.bias)  # beta = 1 at z = 0


@register("path")
class PaTH(PositionalEncoding):
    """The transforms' directions and strengths are learned per layer and KV head; the one option
    picks the kernel."""

    display = "PaTH"
    reads_positions = False
    materialises_bias = True  # logits need the (B, H, N, T) matrix of transformed products
    Options = PaTHOptions

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        return PaTHState(query_pos=query_pos, key_pos=key_pos)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return PaTHLayer(self.cfg.d_model, self.cfg.kv_heads, self.cfg.head_dim, self.opts.path_kernel)
