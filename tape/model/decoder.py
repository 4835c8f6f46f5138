"""DecoderLM: a Llama-style pre-norm decoder (RMSNorm, SwiGLU) with a pluggable positional encoding.

Parameter names do not depend on the PE: ``embed``, ``layers.{i}.attn_norm``,
``layers.{i}.attn.{q,k,v,o}_proj``, ``layers.{i}.mlp_norm``, ``layers.{i}.mlp.{gate,up,down}_proj``,
``norm``, ``lm_head``. A PE's own parameters live under ``layers.{i}.pe``, so a RoPE checkpoint
loads into a TAPE model with ``strict=False`` and only TAPE's parameters are missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

import tape.pe as pe_registry
from tape.model.abacus import AbacusEmbedding
from tape.model.attention import Fuse, attend, causal_mask
from tape.model.cache import KVCache
from tape.model.config import ModelConfig
from tape.model.generate import greedy_generate
from tape.pe.base import LayerPE, PositionState


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in at least float32 and cast back (as Llama)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SelfAttention(nn.Module):
    """Causal self-attention with grouped-query support; the PE enters through ``pe`` hooks."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.backend = cfg.attn_backend
        self.fuse = cfg.pe_options.get("tape_fused")  # how A·V and A·E are computed (TAPE)

    def forward(
        self,
        x: Tensor,  # (B, N, C)
        pe: LayerPE,
        state: PositionState,
        mask: Tensor | None,
        cache: KVCache | None,
        layer_idx: int,
    ) -> tuple[Tensor, Tensor | None]:
        return attention_forward(
            self, x, pe, state, mask, cache, layer_idx,
            heads=(self.n_heads, self.n_kv_heads, self.head_dim), backend=self.backend, fuse=self.fuse,
        )


def rotate_or_defer(pe: LayerPE, q: Tensor, k: Tensor, state: PositionState, dtype: torch.dtype,
                    cached: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(q, k, None) rotated by the PE and cast to the attention's dtype, or (q, k, rotation)
    unrotated with the rotation ``attend`` applies itself (TAPE's E; calls without a cache)."""
    rotation = None if cached else pe.rotation(state)
    if rotation is not None:
        return q, k, rotation
    q, k = pe.rotate(q, k, state)
    return q.to(dtype), k.to(dtype), None  # rotated in E's float32: back to the attention's dtype


def attention_forward(
    attn: nn.Module,
    x: Tensor,  # (B, N, C)
    pe: LayerPE,
    state: PositionState,
    mask: Tensor | None,
    cache: KVCache | None,
    layer_idx: int,
    heads: tuple[int, int, int],
    backend: str = "auto",
    fuse: Fuse = None,
) -> tuple[Tensor, Tensor | None]:
    """Self-attention through the PE hooks for any module with q/k/v/o_proj (ours or HF Llama's).
    heads = (n_heads, n_kv_heads, head_dim). Returns (output (B, N, C), A·extra or None)."""
    n_heads, n_kv_heads, head_dim = heads
    b, n, _ = x.shape
    state = pe.before_attention(state, x, cache, layer_idx)  # FoX: this layer's forget gates
    q = attn.q_proj(x).view(b, n, n_heads, head_dim).transpose(1, 2)  # (B, H, N, d)
    k = attn.k_proj(x).view(b, n, n_kv_heads, head_dim).transpose(1, 2)  # (B, Hkv, N, d)
    v = attn.v_proj(x).view(b, n, n_kv_heads, head_dim).transpose(1, 2)
    q, k, rotation = rotate_or_defer(pe, q, k, state, v.dtype, cached=cache is not None)
    own = pe.attention(q, k, v, state, mask) if cache is None else None  # PaTH's kernel
    if own is not None:
        return attn.o_proj(own.transpose(1, 2).reshape(b, n, n_heads * head_dim)), None
    extra = pe.extra_values(state)  # (B, Hkv, N, de) for TAPE, else None
    if cache is not None:
        k, v, extra = cache.update(layer_idx, k, v, extra)
    bias = pe.attn_bias(state)
    score_bias = pe.score_bias(q, k, state, mask)  # CoPE: needs q and every (cached) key
    if score_bias is not None:
        bias = score_bias if bias is None else bias + score_bias
    out, extra_out = attend(
        q, k, v, extra=extra, rotation=rotation, mask=mask, bias=bias,
        alibi_slopes=pe.alibi_slopes(), backend=backend, fuse=fuse,
    )
    out = out.transpose(1, 2).reshape(b, n, n_heads * head_dim)
    return attn.o_proj(out), extra_out


class Block(nn.Module):
    """attention -> x residual -> PE takes A·E -> MLP -> PE update with m (and A·E) -> x residual."""

    def __init__(self, cfg: ModelConfig, pe: LayerPE) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = SelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim)
        self.pe = pe

    def forward(
        self, x: Tensor, state: PositionState, mask: Tensor | None, cache: KVCache | None, idx: int
    ) -> tuple[Tensor, PositionState]:
        attn_out, extra_out = self.attn(self.attn_norm(x), self.pe, state, mask, cache, idx)
        x = x + attn_out
        state = self.pe.after_attention(state, extra_out)
        m = self.mlp(self.mlp_norm(x))
        state = self.pe.after_mlp(state, m)  # TAPE's gate reads the MLP output (tape-spec A.2.3)
        return x + m, state


def prepare_positions(
    input_ids: Tensor,  # (B, N)
    position_ids: Tensor | None,
    attention_mask: Tensor | None,  # (B, T_past + N), 1 = token, 0 = padding
    cache: KVCache | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Positions of this call's tokens (B, N), of every key (B, T), and the attention mask
    (None when plain causal attention is right). Extends the cache's position record."""
    b, n = input_ids.shape
    device = input_ids.device
    past = cache.length if cache is not None else 0
    valid_all = None
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (b, past + n):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}; expected "
                f"(batch, cached + new tokens) = ({b}, {past + n})"
            )
        valid_all = attention_mask.to(device).bool()
    if position_ids is None:
        if valid_all is not None:  # left padding: count real tokens (as HF does)
            position_ids = (valid_all.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        else:
            position_ids = torch.arange(past, past + n, device=device).expand(b, n)
    position_ids = position_ids.to(device=device, dtype=torch.long)
    if position_ids.shape[-1] != n or position_ids.dim() > 2 or (
            position_ids.dim() == 2 and position_ids.shape[0] not in (1, b)):
        raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}; expected (batch, new "
                         f"tokens) = ({b}, {n}), or (1, {n}) for the same positions in every row")
    position_ids = position_ids.expand(b, n)  # (1, N) as Hugging Face models accept it
    if attention_mask is None and cache is not None and cache.padded:
        raise ValueError("this cache holds padding (an earlier call's attention_mask marked some), so "
                         "every later call needs attention_mask of shape (batch, cached + new tokens) = "
                         f"({b}, {past + n}), as tape.model.generate.greedy_generate passes it")
    new_valid = valid_all[:, past:] if valid_all is not None else torch.ones(
        b, n, dtype=torch.bool, device=device
    )
    if cache is not None:
        key_pos, key_valid = cache.extend_positions(position_ids, new_valid)
    else:
        key_pos, key_valid = position_ids, new_valid
    padded = valid_all is not None and not bool(valid_all.all())
    if cache is not None and padded:
        cache.padded = True
    mask = causal_mask(n, key_valid, past + n, device) if padded else None  # None: causal (attend)
    return position_ids, key_pos, mask


@dataclass
class DecoderOutput:
    logits: Tensor  # (B, N, vocab_size)
    past_key_values: KVCache | None = None


class DecoderLM(nn.Module):
    """Causal language model. ``forward(input_ids, position_ids=None, attention_mask=None,
    past_key_values=None, use_cache=False)``; ``generate`` decodes greedily with the cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pe = pe_registry.build(cfg)
        self.layers = nn.ModuleList(Block(cfg, self.pe.make_layer(i)) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # built last, so the other weights drawn from one seed do not depend on it
        self.abacus = AbacusEmbedding(cfg) if cfg.abacus else None

    def reset_parameters(self) -> None:
        """Linear and embedding weights ~ N(0, init_std), norms at 1, then each PE's own init
        (TAPE zeroes its post-attention map and W1, so it starts as the RoPE model)."""
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.layers:
            block.pe.init_weights(std)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: Tensor,  # (B, N) int64
        position_ids: Tensor | None = None,  # (B, N) int64, any offset
        attention_mask: Tensor | None = None,  # (B, T_past + N), 1 = token, 0 = padding
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
    ) -> DecoderOutput:
        cache = past_key_values if past_key_values is not None else (
            KVCache(self.cfg.n_layers) if use_cache else None
        )
        position_ids, key_pos, mask = prepare_positions(input_ids, position_ids, attention_mask, cache)
        x = self.embed(input_ids)  # (B, N, C)
        if self.abacus is not None:
            x = x + self.abacus(input_ids, cache)  # digit index embeddings
        state = self.pe.make_state(position_ids, key_pos, x.dtype)
        recompute = self.cfg.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for idx, block in enumerate(self.layers):
            if recompute and cache is None:  # activations of each block are recomputed in backward
                x, state = checkpoint(block, x, state, mask, None, idx, use_reentrant=False)
            else:
                x, state = block(x, state, mask, cache, idx)
        logits = self.lm_head(self.norm(x))
        return DecoderOutput(logits=logits, past_key_values=cache)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt_ids: Tensor,  # (B, N) int64, left-padded if lengths differ
        max_new_tokens: int,
        attention_mask: Tensor | None = None,  # (B, N), 0 marks left padding
        eos_token_id: int | None = None,
        use_cache: bool = True,
        return_logits: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Greedy decoding with the KV cache; see ``tape.model.generate.greedy_generate``."""
        return greedy_generate(self, prompt_ids, max_new_tokens, attention_mask, eos_token_id,
                               use_cache, return_logits)

    # ------------------------------------------------------------------ helpers
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        params = {id(p): p for p in self.parameters()}  # tied weights counted once
        total = sum(p.numel() for p in params.values())
        if exclude_embeddings:
            total -= self.embed.weight.numel()
        return total
