"""KV cache for incremental decoding, for every PE.

Per layer it keeps the (already rotated) keys, the values and, for TAPE, that layer's E rows of
past tokens: E rows are causal functions of the prefix, so a new token needs only its own E at
layer 0 and the cached rows as extra values. Decoding one token then costs O(N), not the O(N^2)
of recomputing the prefix (the official TAPE code had no cache at all, tape-spec A.8).
Model-wide it keeps every key's position (for relative-bias PEs) and padding flag; per layer,
rows a PE keeps per key for its bias (FoX's cumulative log forget gates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    k: Tensor  # (B, Hkv, T, d) rotated keys
    v: Tensor  # (B, Hkv, T, d)
    extra: Tensor | None  # (B, Hkv, T, de) TAPE's E rows at this layer, else None


@dataclass
class KVCache:
    """Everything a decoder needs to continue a batch of sequences one call at a time."""

    n_layers: int
    layers: list[LayerCache | None] = field(default_factory=list)
    key_pos: Tensor | None = None  # (B, T) int64
    key_valid: Tensor | None = None  # (B, T) bool, False for padding
    padded: bool = False  # some key is padding: later calls must pass attention_mask
    digit_run: Tensor | None = None  # (B,) Abacus: digits that end the cached tokens (abacus.py)
    pe_rows: list[Tensor | None] = field(default_factory=list)
    """Per layer, what a PE keeps per key for its bias, keys on the last axis (FoX: its (B, H, T)
    cumulative log forget gates); written by the PE's ``before_attention``."""

    def __post_init__(self) -> None:
        if not self.layers:
            self.layers = [None] * self.n_layers
        if not self.pe_rows:
            self.pe_rows = [None] * self.n_layers

    @property
    def length(self) -> int:
        """Number of cached tokens T."""
        return 0 if self.key_pos is None else self.key_pos.shape[1]

    def extend_positions(self, pos: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's positions (B, N) and padding flags; return all of them (B, T+N)."""
        self.key_pos = pos if self.key_pos is None else torch.cat([self.key_pos, pos], dim=1)
        self.key_valid = valid if self.key_valid is None else torch.cat([self.key_valid, valid], dim=1)
        return self.key_pos, self.key_valid

    def update(
        self, layer: int, k: Tensor, v: Tensor, extra: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Append this call's rows for one layer and return the full (past + current) tensors."""
        past = self.layers[layer]
        if past is not None:
            k = torch.cat([past.k, k], dim=2)
            v = torch.cat([past.v, v], dim=2)
            if extra is not None:
                extra = torch.cat([past.extra, extra], dim=2)
        self.layers[layer] = LayerCache(k, v, extra)
        return k, v, extra
