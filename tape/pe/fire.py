"""FIRE (Li et al. 2023): a learned function of the progressively normalised distance.

bias_h(i, j) = MLP(psi(i - j) / psi(max(i, L)))_h, psi(x) = log(|c·x| + 1), with learnable c
(init ``fire_init_c`` = 0.1) and L = |L_mult · ``fire_init_L``| (L_mult learnable, init 1). The
MLP is 1 -> ``fire_mlp_width`` (32) -> H with ReLU. One FIRE per layer, as in the paper's
baseline (its parameter count matches Table 3 that way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tape.pe import register
from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionState, without_autocast

NORM_EPS = 1e-6  # the normaliser psi(max(i, L)) is 0 only when c = 0: the bias stays finite there


@dataclass
class FIREOptions(PEOptions):
    fire_mlp_width: int = 32
    fire_init_c: float = 0.1
    fire_init_L: float = 512.0


class FIRELayer(LayerPE):
    def __init__(self, n_heads: int, width: int, init_c: float, init_L: float) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_mult = nn.Parameter(torch.tensor(1.0))
        self.init_c, self.init_L = float(init_c), float(init_L)

    def _psi(self, x: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c.float() * x) + 1.0)

    def attn_bias(self, state: PositionState) -> Tensor:
        """The float32 bias, also under autocast (B, H, N, T)."""
        with without_autocast(state.query_pos.device):
            qp = state.query_pos.float()  # (B, N)
            rel = (qp[:, :, None] - state.key_pos.float()[:, None, :]).clamp(min=0)  # (B, N, T)
            L = torch.abs(self.L_mult.float() * self.init_L)
            norm = self._psi(torch.maximum(qp, L))[:, :, None].clamp_min(NORM_EPS)  # (B, N, 1); 0 only at c = 0
            x = (self._psi(rel) / norm)[..., None]  # (B, N, T, 1)
            lin1, lin2 = self.mlp[0], self.mlp[2]
            h = F.relu(F.linear(x, lin1.weight.float(), lin1.bias.float()))  # (B, N, T, width)
            return F.linear(h, lin2.weight.float(), lin2.bias.float()).permute(0, 3, 1, 2)  # (B, H, N, T)

    def init_weights(self, std: float) -> None:
        with torch.no_grad():
            self.c.fill_(self.init_c)
            self.L_mult.fill_(1.0)
            for layer in (self.mlp[0], self.mlp[2]):
                nn.init.normal_(layer.weight, std=std)
                nn.init.zeros_(layer.bias)


@register("fire")
class FIRE(PositionalEncoding):
    """Options: ``fire_mlp_width``, ``fire_init_c``, ``fire_init_L``."""

    display = "FIRE"
    materialises_bias = True
    Options = FIREOptions
    relative = False  # the max(i, L) normaliser depends on the absolute query position

    def make_layer(self, layer_idx: int) -> LayerPE:
        opts = self.opts
        return FIRELayer(self.cfg.n_heads, opts.fire_mlp_width, opts.fire_init_c, opts.fire_init_L)
