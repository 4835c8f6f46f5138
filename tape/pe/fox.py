"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025), and CABLE (Veisi et al. 2025).

Both add to the logits a data-dependent, non-positive bias that accumulates along the sequence.
Per token t and head h a per-token term l_t,h <= 0 comes from the layer's attention input x_t
(the normed hidden state): z = w_h · x_t + b_h and
- ``fox_gate: fox``:   l = log sigmoid(z), the log of FoX's forget gate f_t = sigmoid(z);
- ``fox_gate: cable``: l = -softplus(z), CABLE's per-token bias.
(The two are mirror images, -softplus(z) = log sigmoid(-z): the same family, the other sign of
w and b.) With c_t = l_1 + ... + l_t, the bias of query i on key j <= i is

    D_ij = l_{j+1} + ... + l_i = c_i - c_j  (<= 0, non-increasing in the distance i - j).

No other positional signal (FoX uses no RoPE by default). Position ids are never read, so the
logits are shift-invariant; a token's own term enters only the bias to keys before it, so left
padding (which precedes every real token) cannot change a real token's bias.

Precision: z, l and c are computed in float32 (float64 in a float64 model), outside autocast.
Cache: each layer keeps c of every key (``KVCache.pe_rows``); new tokens continue from the last
cached c. Init: the gate bias b_h sets each head's initial decay time tau_h (the bias falls by
one nat every tau_h tokens: l = -1/tau_h), log-spaced over heads from ``fox_decay_min`` to
``fox_decay_max``; the gate weights start at N(0, init_std) as every linear layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tape.pe import register
from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionState, without_autocast

if TYPE_CHECKING:
    from tape.model.cache import KVCache
    from tape.model.config import ModelConfig

GATES = ("fox", "cable")


@dataclass
class FoXOptions(PEOptions):
    fox_gate: str = "fox"
    """The per-token term: ``fox`` (log sigmoid, Lin et al.) or ``cable`` (-softplus, Veisi et al.)."""
    fox_decay_min: float = 16.0
    """Initial decay time (tokens per nat of bias) of the fastest-forgetting head."""
    fox_decay_max: float = 1024.0
    """Initial decay time of the slowest head (heads in between are log-spaced)."""

    def problems(self, cfg: "ModelConfig") -> list[str]:
        out = []
        if self.fox_gate not in GATES:
            out.append(f"fox_gate={self.fox_gate!r} must be one of {list(GATES)}")
        if not 0 < self.fox_decay_min <= self.fox_decay_max:
            out.append(f"fox_decay_min={self.fox_decay_min}, fox_decay_max={self.fox_decay_max}: "
                       "decay times must satisfy 0 < fox_decay_min <= fox_decay_max")
        return out


@dataclass
class FoXState(PositionState):
    """PositionState plus the current layer's cumulative log gates (set by before_attention)."""

    cum_query: Tensor | None = None  # (B, H, N) c of this call's tokens
    cum_key: Tensor | None = None  # (B, H, T) c of every key (cached + current)


def initial_gate_bias(n_heads: int, decay_min: float, decay_max: float, gate: str) -> Tensor:
    """(H,) gate biases b_h whose per-token term at z = b_h is -1/tau_h, tau_h log-spaced from
    decay_min to decay_max: log sigmoid(b) = -1/tau gives b = -log(expm1(1/tau)); CABLE's
    -softplus(b) = -1/tau gives the opposite sign."""
    taus = torch.logspace(math.log10(decay_min), math.log10(decay_max), n_heads, dtype=torch.float64)
    bias = -torch.log(torch.expm1(1.0 / taus))
    return bias if gate == "fox" else -bias


class FoXLayer(LayerPE):
    def __init__(self, d_model: int, n_heads: int, opts: FoXOptions) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, n_heads, bias=True)
        self.kind = opts.fox_gate
        self.decay = (opts.fox_decay_min, opts.fox_decay_max)

    def log_gates(self, x: Tensor) -> Tensor:
        """x (B, N, C) -> the per-token terms l (B, H, N) <= 0, in float32 or wider."""
        dt = torch.promote_types(x.dtype, torch.float32)
        with without_autocast(x.device):
            z = F.linear(x.to(dt), self.gate.weight.to(dt), self.gate.bias.to(dt))  # (B, N, H)
        term = F.logsigmoid(z) if self.kind == "fox" else -F.softplus(z)
        return term.transpose(1, 2)

    def before_attention(
        self, state: PositionState, x: Tensor, cache: "KVCache | None", layer_idx: int
    ) -> PositionState:
        cum = self.log_gates(x).cumsum(-1)  # (B, H, N)
        past = cache.pe_rows[layer_idx] if cache is not None else None
        if past is not None:  # continue from the last cached key
            cum = past[..., -1:] + cum
        keys = cum if past is None else torch.cat([past, cum], dim=-1)
        if cache is not None:
            cache.pe_rows[layer_idx] = keys
        return replace(state, cum_query=cum, cum_key=keys)

    def attn_bias(self, state: PositionState) -> Tensor:
        if not isinstance(state, FoXState) or state.cum_query is None or state.cum_key is None:
            raise RuntimeError("FoX's attn_bias needs before_attention to run first in this layer")
        # (B, H, N, T); above the diagonal (future keys) it is positive, but masked out
        return state.cum_query[..., :, None] - state.cum_key[..., None, :]

    def init_weights(self, std: float) -> None:
        with torch.no_grad():
            nn.init.normal_(self.gate.weight, std=std)
            self.gate.bias.copy_(initial_gate_bias(self.gate.out_features, *self.decay, self.kind))


@register("fox")
class FoX(PositionalEncoding):
    """Options: ``fox_gate`` (fox | cable), ``fox_decay_min`` (16), ``fox_decay_max`` (1024)."""

    display = "FoX"
    variants = {"fox_gate": {"cable": "CABLE"}}
    reads_positions = False
    materialises_bias = True
    Options = FoXOptions

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        return FoXState(query_pos=query_pos, key_pos=key_pos)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return FoXLayer(self.cfg.d_model, self.cfg.n_heads, self.opts)
