"""TAPE: contextualized equivariant positional encoding (Zhu et al., ICML 2025; tape-spec A.2).

A second stream E rides beside the token features. Per token and (key/value) head, E holds the
d/2 complex numbers z_b = c_b + i·s_b as [c | s] (width d, the head dim). Layer 0's E is the RoPE
table; every layer
  1. rotates q and k with its current E (RoPE's formula with learned, contextual cos/sin),
  2. aggregates E with the same attention weights as V (A·E), maps it over heads and adds it,
  3. mixes E over heads through a token-gated MLP: E += W2 · diag(SiLU(W_x m)) · W1 · E, where
     m is the layer's MLP output. Per token this is one He x He matrix M_n = W2 diag(g_n) W1
     applied to E (He = E heads): He²·(I + d) multiply-adds per token (forming M_n, applying it)
     instead of 2·I·He·d, and no (B, I, N, d) intermediates.
Steps 2 and 3 run as one operator after the MLP (nothing reads E in between):
E' = (I + M_n)(E + P·AE) per token, ``_UpdateE``, which saves no intermediate E and recomputes
E + P·AE and M_n in backward.
Every update is real-linear in E with the same coefficients for c and s and never mixes
frequencies, so multiplying all z_b by a common phase commutes with the layer: the token
stream is exactly invariant to a global position shift.

The official code stores cos and sin at full width d with tied halves; we store each pair once
(tape-spec F.2.7), which halves E's memory and makes A·E exactly as wide as A·V.
With grouped-query attention E lives per key/value head; query heads rotate with their group's E.
E stays float32 across layers whatever the activation dtype (tape-spec F.2.2): A·E arrives in the
activation dtype; the head map, the token mix and the sums are computed in float32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tape.pe import register
from tape.pe.base import LayerPE, PositionalEncoding, PositionState, RotaryOptions
from tape.pe.rope import rope_table, rotate_grouped
from tape.pe.tape_ablations import Layout, feature_mlp, feature_post_map

if TYPE_CHECKING:
    from tape.model.config import ModelConfig


@dataclass
class TAPEOptions(RotaryOptions):
    """TAPE's options; rope_theta and rope_scaling set E at layer 0."""

    tape_position_size: int | None = None
    """Width I of the PE-MLP over heads (W1: H -> I, W2: I -> H); None means 4 * n_heads."""
    tape_post_attn: Literal["mix", "rowsum"] = "mix"
    """Map over heads after A·E. mix: a true head-mixing matrix (the paper's description).
    rowsum: per-head scalar = row sum of an H x H matrix (what the official code computes)."""
    tape_zero_init: Literal["w1", "w2"] = "w1"
    """Which PE-MLP matrix starts at zero (w1: the official code, w2: the paper's PEFT text).
    Either way TAPE at initialisation equals RoPE."""
    tape_attn_update: bool = True
    """Update E with the attention weights (A·E). Off = the 'FF only' ablation."""
    tape_mlp_update: bool = True
    """Update E with the token-gated PE-MLP. Off = the 'attention only' ablation."""
    tape_equivariant: bool = True
    """The E maps use one coefficient per (c, s) pair. Off = Table 6's 'rotation equivariance'
    ablation (tape.pe.tape_ablations)."""
    tape_tensorial: bool = True
    """The E maps act over E's head axis. Off = Table 6's 'tensorial embedding' ablation: over
    each head's own features, with maps the heads share (tape.pe.tape_ablations)."""
    tape_fused: bool | Literal["two_calls", "concat", "padded"] | None = None
    """How A·V and A·E are computed. True: one QKᵀ (the Triton kernel on CUDA; one SDPA call with
    [V | E] as values otherwise). False or two_calls: two calls of equal width. concat / padded:
    one SDPA call with [V | E], q and k as they are / zero-padded to its width. None (auto): the
    fastest exact path per device and length (tape/model/attention.py). All are exact."""

    def width(self, cfg: ModelConfig) -> int:
        """The PE-MLP width I."""
        return self.tape_position_size or 4 * cfg.n_heads

    def problems(self, cfg: ModelConfig) -> list[str]:
        problems = super().problems(cfg)  # the choices of the Literal options: tape.pe checks types
        if self.tape_position_size is not None and self.tape_position_size <= 0:
            problems.append(f"tape_position_size={self.tape_position_size} must be positive")
        if not self.tape_tensorial and cfg.kv_heads != cfg.n_heads:
            problems.append(f"tape_tensorial=false maps each head's own E, so it needs one E per query "
                            f"head: set model.n_kv_heads=null (it is {cfg.kv_heads} for {cfg.n_heads} heads)")
        if not self.tape_tensorial and self.tape_post_attn == "rowsum":
            problems.append("tape_post_attn=rowsum is a map over heads, which tape_tensorial=false has "
                            "not: set tape_post_attn=mix")
        return problems

    @property
    def layout(self) -> Layout:
        """The two switches of Table 6's lower half."""
        return Layout(equivariant=self.tape_equivariant, tensorial=self.tape_tensorial)


class _UpdateE(torch.autograd.Function):
    """A layer's whole E update, per token n: E' = (I + M_n)(E + P·AE), M_n = W2 diag(g_n) W1.

    P (He x H) maps the H query-head aggregates A·E onto the He E heads (None: no attention
    update); gate g (None: no token mix). Computed in E's dtype (float32) with autocast off.
    Saves only what other operators keep alive anyway (E, which the rotations save; A·E, the
    attention's output) and the gate: backward recomputes E + P·AE and M instead of storing them.
    """

    @staticmethod
    def forward(ctx, e: Tensor, ae: Tensor | None, p: Tensor | None, gate: Tensor | None,  # noqa: D102
                w1: Tensor | None, w2: Tensor | None) -> Tensor:
        # e (B, He, N, d); ae (B, H, N, d); p (He, H); gate (B, N, I); w1 (I, He); w2 (He, I)
        ctx.save_for_backward(e, ae, p, gate, w1, w2)
        with _no_autocast(e):
            u = _attention_update(e, ae, p)  # (B, He, N, d)
            if gate is None:
                return u
            mix = _mix_matrix(gate.to(e.dtype), w1.to(e.dtype), w2.to(e.dtype))  # (B, N, He, He)
            return u + _per_token(mix, u)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        e, ae, p, gate, w1, w2 = ctx.saved_tensors
        grad_ae = grad_p = grad_gate = grad_w1 = grad_w2 = None
        with _no_autocast(e):
            grad = grad.to(e.dtype)
            ae_f = None if ae is None else ae.to(e.dtype)  # (B, H, N, d)
            pf = None if p is None else p.to(e.dtype)
            grad_u = grad
            if gate is not None:
                u = _attention_update(e, ae_f, pf)  # recomputed
                g, w1f, w2f = gate.to(e.dtype), w1.to(e.dtype), w2.to(e.dtype)
                mix = _mix_matrix(g, w1f, w2f)  # (B, N, He, He), recomputed
                grad_t = grad.transpose(1, 2).contiguous()  # (B, N, He, d)
                grad_u = grad + torch.matmul(mix.transpose(-1, -2), grad_t).transpose(1, 2)
                grad_mix = torch.matmul(grad_t, u.transpose(1, 2).transpose(-1, -2))  # (B, N, He, He)
                b, n, he = grad_mix.shape[:3]
                left = torch.bmm(w2f.t().expand(b * n, -1, -1), grad_mix.view(b * n, he, he)).view(
                    b, n, -1, he)  # (B, N, I, He) = W2ᵀ dM, one product (as _head_map)
                grad_gate = (left * w1f).sum(-1).to(gate.dtype)  # (B, N, I)
                grad_w1 = torch.einsum("bni,bnij->ij", g, left).to(w1.dtype)  # (I, He)
                grad_w2 = torch.einsum("bnhj,bni,ij->hi", grad_mix, g, w1f).to(w2.dtype)  # (He, I)
            if ae is not None:
                grad_ae = _head_map(pf.t(), grad_u).to(ae.dtype)  # (B, H, N, d)
                grad_p = _head_map_grad(grad_u, ae_f).to(p.dtype)  # (He, H)
        return grad_u, grad_ae, grad_p, grad_gate, grad_w1, grad_w2


def _attention_update(e: Tensor, ae: Tensor | None, p: Tensor | None) -> Tensor:
    """E + P·AE in E's dtype: e (B, He, N, d), ae (B, H, N, d) or None, p (He, H) -> (B, He, N, d)."""
    return e if ae is None else e + _head_map(p.to(e.dtype), ae.to(e.dtype))


def _head_map(p: Tensor, x: Tensor) -> Tensor:
    """Mix heads: p (G, H), x (B, H, N, d) -> (B, G, N, d), one batched product (bmm with p
    broadcast: ``matmul`` folds the batch into one product there, with two copies, when x
    requires grad). A token-major x (attention's output for token-major q, as the joined
    rotation gives) is mapped token by token, without a copy, into a token-major result."""
    b, h, n, d = x.shape
    if _token_major(x):
        mapped = torch.bmm(p.expand(b * n, -1, -1), _token_rows(x))  # (B·N, G, d)
        return mapped.view(b, n, -1, d).transpose(1, 2)
    return torch.bmm(p.expand(b, -1, -1), x.reshape(b, h, n * d)).view(b, p.shape[0], n, d)


def _head_map_grad(grad: Tensor, x: Tensor) -> Tensor:
    """The gradient of ``_head_map``'s p: sum over batch and tokens of grad (B, G, N, d) times x
    (B, H, N, d) -> (G, H), batched in x's layout (token by token for a token-major x)."""
    if _token_major(x):
        return torch.bmm(_token_rows(grad), _token_rows(x).mT).sum(0)  # (B·N, G, H) summed
    b, h, n, d = x.shape
    return torch.bmm(grad.reshape(b, grad.shape[1], n * d), x.reshape(b, h, n * d).mT).sum(0)


def _token_rows(x: Tensor) -> Tensor:
    """x (B, H, N, d) as (B·N, H, d): each token's heads, a view where x is token-major."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b * n, h, d)


def _token_major(x: Tensor) -> bool:
    """x (B, H, N, d) laid out as (B, N, H, d) in memory, densely."""
    b, h, n, d = x.shape
    return n > 1 and h > 1 and x.stride(3) == 1 and x.stride(1) == d and x.stride(2) == h * d and (
        b == 1 or x.stride(0) == n * h * d)


def _per_token(mix: Tensor, x: Tensor) -> Tensor:
    """M_n · x[:, :, n] for every token: mix (B, N, He, He), x (B, He, N, d) -> (B, He, N, d)."""
    return torch.matmul(mix, x.transpose(1, 2)).transpose(1, 2)


AUTOCAST_DEVICES = frozenset(
    d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "privateuseone") if torch.amp.is_autocast_available(d))
"""Device types with autocast, read once at import: torch 2.11's dynamo cannot trace
``is_autocast_available`` (a graph break in every compiled E update)."""


def _no_autocast(x: Tensor) -> contextlib.AbstractContextManager:
    """Autocast off on x's device (the meta device, used for FLOP counts, has no autocast)."""
    if x.device.type in AUTOCAST_DEVICES:
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def _mix_matrix(gate: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """M = W2 diag(g) W1 per token: gate (B, N, I), w1 (I, He), w2 (He, I) -> (B, N, He, He)."""
    return torch.matmul(w2 * gate[..., None, :], w1)


_TAPE_LAYOUT = Layout(equivariant=True, tensorial=True)


class TAPELayer(LayerPE):
    """TAPE's per-layer maps. Parameter names: post_attn (the map after A·E), x_proj (gate W_x,
    C -> I), w1 (heads -> I), w2 (I -> heads).

    The last layer's updated E is never read, so that layer rotates q and k with its E but has
    no update maps: no dead parameters (DDP rejects parameters without gradients) and no wasted
    A·E. The official code keeps them, which is why its count is 38,160 higher at 155M.
    """

    def __init__(self, cfg: ModelConfig, opts: TAPEOptions, updates_e: bool = True) -> None:
        super().__init__()
        heads, e_heads, width = cfg.n_heads, cfg.kv_heads, opts.width(cfg)
        self.groups = heads // e_heads
        self.post_mode = opts.tape_post_attn
        self.zero_init = opts.tape_zero_init
        self.layout = opts.layout
        self.post_attn: nn.Linear | None = None
        if opts.tape_attn_update and updates_e:
            if self.layout.tensorial:
                # mix: (He x H) maps the H query-head aggregates onto the He E heads.
                # rowsum: (H x H) of which only the row sums act (the official einsum).
                out_features = e_heads if self.post_mode == "mix" else heads
                self.post_attn = nn.Linear(heads, out_features, bias=False)
            else:  # over each head's features (d/2 or d), shared by the heads
                features = self.layout.post_width(cfg.head_dim)
                self.post_attn = nn.Linear(features, features, bias=False)
        self.x_proj: nn.Linear | None = None
        if opts.tape_mlp_update and updates_e:
            features = self.layout.mlp_width(e_heads, cfg.head_dim)  # He for TAPE
            self.x_proj = nn.Linear(cfg.d_model, width, bias=False)
            self.w1 = nn.Linear(features, width, bias=False)
            self.w2 = nn.Linear(width, features, bias=False)

    # ---------------------------------------------------------------- hooks
    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return rotate_grouped(q, k, state.rot)  # E (B, He, N, d)

    def rotation(self, state: PositionState) -> Tensor | None:
        """E: ``attend`` rotates q and k with it (``rotate``'s rule), inside the Triton kernel's
        autograd node when the call runs there, which then keeps q and k unrotated for backward."""
        return state.rot

    def extra_values(self, state: PositionState) -> Tensor | None:
        return state.rot if self.post_attn is not None else None

    def after_attention(self, state: PositionState, extra_out: Tensor | None) -> PositionState:
        """Keep A·E for the layer's one E update after the MLP (nothing reads E in between)."""
        if self.post_attn is None or extra_out is None:
            return state
        return replace(state, pending=extra_out)

    def after_mlp(self, state: PositionState, mlp_out: Tensor) -> PositionState:
        ae = state.pending
        if ae is None and self.x_proj is None:
            return state
        gate = w1 = w2 = None
        if self.x_proj is not None:
            gate = F.silu(self.x_proj(mlp_out))  # (B, N, I): per (token, channel i), shared over d
            w1, w2 = self.w1.weight, self.w2.weight
        if self.layout != _TAPE_LAYOUT:
            return replace(state, rot=self._ablated_update(state.rot, ae, gate), pending=None)
        rot = _UpdateE.apply(state.rot, ae, None if ae is None else self.head_map(), gate, w1, w2)
        return replace(state, rot=rot, pending=None)  # (B, He, N, d)

    def _ablated_update(self, e: Tensor, ae: Tensor | None, gate: Tensor | None) -> Tensor:
        """Table 6's ablations: E + post(A·E), then + the PE-MLP's increment, in E's dtype with
        autocast off (tape.pe.tape_ablations); e (B, He, N, d) -> (B, He, N, d)."""
        with _no_autocast(e):
            u = self._ablated_attention_update(e, ae)
            if gate is None:
                return u
            return u + feature_mlp(u, gate.to(e.dtype), self.w1.weight.to(e.dtype),
                                   self.w2.weight.to(e.dtype), self.layout)

    def _ablated_attention_update(self, e: Tensor, ae: Tensor | None) -> Tensor:
        """E + post(A·E) for the ablations: over heads (tensorial) or each head's features."""
        if ae is None:
            return e
        if self.layout.tensorial:
            return _attention_update(e, ae, self.head_map())
        return e + feature_post_map(ae.to(e.dtype), self.post_attn.weight.to(e.dtype), self.layout)

    def head_map(self) -> Tensor:
        """P (He x H), the map of the H query-head aggregates A·E onto the He E heads. rowsum:
        head h's scalar sum_e W[h, e], summed within its group (the official code's einsum)."""
        weight = self.post_attn.weight
        if self.post_mode == "mix":
            return weight
        heads = weight.shape[0]
        group = torch.arange(heads, device=weight.device) // self.groups  # (H,) E head of each query head
        own = group[None, :] == torch.arange(heads // self.groups, device=weight.device)[:, None]  # (He, H)
        return own.to(weight.dtype) * weight.sum(-1)[None, :]

    def attention_updated(self, state: PositionState) -> Tensor:
        """E + P·AE: E between the attention update and the token mix (for measurements)."""
        ae = state.pending
        if self.layout != _TAPE_LAYOUT:
            with _no_autocast(state.rot):
                return self._ablated_attention_update(state.rot, ae)
        return _attention_update(state.rot, ae, None if ae is None else self.head_map())

    def init_weights(self, std: float) -> None:
        """Zero the post-attention map and W1 (or W2): at init E stays the RoPE table."""
        with torch.no_grad():
            if self.post_attn is not None:
                self.post_attn.weight.zero_()
            if self.x_proj is not None:
                (self.w1 if self.zero_init == "w1" else self.w2).weight.zero_()


@register("tape")
class TAPE(PositionalEncoding):
    """Options (``TAPEOptions``): tape_position_size, tape_post_attn, tape_zero_init,
    tape_attn_update, tape_mlp_update, tape_equivariant, tape_tensorial, tape_fused; rope_theta
    and rope_scaling for E at layer 0."""

    display = "TAPE"
    Options = TAPEOptions
    rotary = True

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        cfg, opts = self.cfg, self.opts
        e_dtype = torch.promote_types(dtype, torch.float32)  # E is float32 (or float64) at every layer
        table = rope_table(query_pos, cfg.head_dim, opts.rope_theta, opts.rope_scaling, e_dtype,
                           yarn=opts.yarn())
        b, _, n, d = table.shape
        rot = table.expand(b, cfg.kv_heads, n, d)  # (B, He, N, d): one E per key/value head
        return PositionState(query_pos=query_pos, key_pos=key_pos, rot=rot)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return TAPELayer(self.cfg, self.opts, updates_e=layer_idx < self.cfg.n_layers - 1)
