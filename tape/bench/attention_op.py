"""The attention operator of one layer, per PE, for the microbenchmark (the paper's Table 4).

What is timed is the work between the q/k/v projections and the output projection, plus the
PE's own per-layer updates, exactly as ``SelfAttention.forward`` and ``Block.forward`` call them:
  gates from the input (FoX) -> rotate q, k (rotary PEs) -> attention bias (FIRE, T5, ALiBi,
  FoX, CoPE) -> attend (with E as extra values for TAPE) -> TAPE's post-attention map on A·E
  -> TAPE's token-gated PE-MLP.
The projections and the SwiGLU MLP are excluded: they are identical for every PE and would only
dilute the ratios. The model-level ``make_state`` (the RoPE table, once per forward) is excluded too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

import tape.pe as pe_registry
from tape.model.attention import attend, plan_attention
from tape.model.config import ModelConfig
from tape.model.decoder import rotate_or_defer
from tape.pe.base import LayerPE, PositionState


@dataclass
class AttentionOp:
    """Callable: one forward pass of a layer's PE-dependent attention work on fixed inputs."""

    layer: LayerPE
    state: PositionState
    q: Tensor  # (B, H, N, d)
    k: Tensor  # (B, Hkv, N, d)
    v: Tensor  # (B, Hkv, N, d)
    m: Tensor  # (B, N, C): stands in for the layer's MLP output that gates TAPE's PE-MLP
    backend: str
    fuse: bool | str | None

    def __call__(self) -> tuple[Tensor, Tensor | None]:
        layer = self.layer
        state = layer.before_attention(self.state, self.m, None, 0)  # FoX's gates; m stands in for x
        q, k, rotation = rotate_or_defer(layer, self.q, self.k, state, self.v.dtype, cached=False)  # as the model
        out, extra_out = attend(
            q, k, self.v, extra=layer.extra_values(state), rotation=rotation, bias=self.bias(q, k, state),
            alibi_slopes=layer.alibi_slopes(), backend=self.backend, fuse=self.fuse,
        )  # (B, H, N, d), (B, H, N, d) or None
        state = layer.after_attention(state, extra_out)
        state = layer.after_mlp(state, self.m)
        return out, state.rot

    def bias(self, q: Tensor, k: Tensor, state: PositionState) -> Tensor | None:
        """The PE's attention bias, plus its score-dependent part (CoPE's), as the decoder adds them."""
        bias = self.layer.attn_bias(state)
        score_bias = self.layer.score_bias(q, k, state, None)
        if score_bias is not None:
            bias = score_bias if bias is None else bias + score_bias
        return bias

    def resolved_backend(self) -> str:
        """The backend this op's call resolves to, with TAPE's value layout: "sdpa padded"."""
        state = self.layer.before_attention(self.state, self.m, None, 0)
        extra = self.layer.extra_values(state)
        plan = plan_attention(self.backend, self.fuse, self.q, self.k, extra, None,
                              self.bias(self.q, self.k, state), self.layer.alibi_slopes() is not None)
        return plan.backend if plan.values == "single" else f"{plan.backend} {plan.values}"


def build_attention_op(
    cfg: ModelConfig, batch: int, seq_len: int, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> AttentionOp:
    """Inputs and layer-0 PE module for ``cfg`` (any device, the meta device included).

    Layer 0 stands for every layer but the last (``cfg.n_layers`` must be >= 2 for TAPE to
    update E: its last layer only rotates)."""
    torch.manual_seed(seed)
    pe = pe_registry.build(cfg).to(device)
    layer = pe.make_layer(0).to(device)
    layer.init_weights(cfg.init_std)
    with torch.no_grad():  # TAPE zero-inits two maps; draw them so every update does real work
        for p in layer.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=cfg.init_std)
    layer = layer.to(dtype=dtype)
    h, hkv, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim

    def rand(*shape: int) -> Tensor:
        if device.type == "meta":
            return torch.empty(*shape, device=device, dtype=dtype)
        return torch.randn(*shape, device=device, dtype=dtype)

    pos = torch.arange(seq_len, device=device).expand(batch, seq_len)  # (B, N)
    state = pe.make_state(pos, pos, dtype)
    if state.rot is not None and cfg.pe == "tape":
        state = state.with_rot(state.rot.contiguous())  # past layer 0, E is a full (B, He, N, d) tensor
    return AttentionOp(
        layer=layer, state=state, q=rand(batch, h, seq_len, d), k=rand(batch, hkv, seq_len, d),
        v=rand(batch, hkv, seq_len, d), m=rand(batch, seq_len, cfg.d_model),
        backend=cfg.attn_backend, fuse=cfg.pe_options.get("tape_fused"),
    )
