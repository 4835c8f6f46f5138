"""Abacus-style index embeddings (McLeish et al. 2024; tape-spec A.10, ecosystem.md section 8).

Each digit token gets a learned embedding of its 1-based index inside its run of digits, added to
its token embedding; every other token gets nothing (index 0). The addition data writes numbers
least-significant digit first (tape/data/addition.py), so index 1 is the units digit, index 2
the tens, and digits of equal significance in a, b and the answer share an embedding. In
training each example's indices are shifted by a random offset k in [0, abacus_max_offset]
(drawn from torch's RNG, which the training module reseeds per batch), so the rows that longer
test numbers need have been trained; evaluation uses k = 0.

The indices are computed from the token ids alone; with a KV cache the length of the digit run
that the cached tokens end with is kept in the cache, so cached decoding equals uncached.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tape.model.cache import KVCache
from tape.model.config import ModelConfig


def digit_indices(
    input_ids: Tensor,  # (B, N) int64
    digit_ids: Tensor,  # (D,) the token ids that are digits
    run_before: Tensor | None = None,  # (B,) digits that end the preceding tokens (cache); None: 0
) -> Tensor:
    """(B, N) int64: 1 + the number of digits right before each digit token in the same run of
    digits, 0 for every other token. ``run_before`` continues a run across cached calls."""
    is_digit = torch.isin(input_ids, digit_ids)  # (B, N)
    count = is_digit.long().cumsum(dim=1)  # (B, N) digits so far
    if run_before is not None:
        count = count + run_before[:, None]
    # at each non-digit, the count reached there; the latest one before t starts t's run
    reset = torch.where(is_digit, torch.zeros_like(count), count)
    start = reset.cummax(dim=1).values  # (B, N)
    return (count - start) * is_digit


class AbacusEmbedding(nn.Module):
    """index (0 = not a digit, 1..abacus_max_index) -> a learned vector of width d_model
    (zero for index 0); in training each example's digit indices get a random offset."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.max_index, self.max_offset = cfg.abacus_max_index, cfg.abacus_max_offset
        self.register_buffer("digit_ids", torch.tensor(cfg.digit_token_ids), persistent=False)
        self.table = nn.Embedding(cfg.abacus_max_index, cfg.d_model)  # row i-1 embeds index i
        nn.init.normal_(self.table.weight, mean=0.0, std=cfg.init_std)

    def indices(self, input_ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, N) digit indices of this call's tokens, offset in training; records the run the
        tokens end with in ``cache`` (unshifted)."""
        run_before = cache.digit_run if cache is not None else None
        idx = digit_indices(input_ids, self.digit_ids, run_before)  # (B, N)
        if cache is not None:
            cache.digit_run = idx[:, -1].clone()  # 0 when the call ends with a non-digit
        if self.training and self.max_offset > 0:
            offset = torch.randint(0, self.max_offset + 1, (idx.shape[0], 1), device=idx.device)
            idx = torch.where(idx > 0, idx + offset, idx)
        return idx

    def forward(self, input_ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, N, d_model) to add to the token embeddings."""
        idx = self.indices(input_ids, cache)
        top = int(idx.max()) if idx.numel() else 0  # a clear error, not an index fault (one sync)
        if top > self.max_index:
            why = (f"a digit run plus a training offset of up to {self.max_offset}" if self.training
                   else f"a run of {top} digits")
            raise ValueError(f"Abacus index {top} ({why}) exceeds abacus_max_index={self.max_index}; "
                             f"set model.abacus_max_index>={top}")
        rows = self.table(idx.clamp(min=1) - 1)  # (B, N, C)
        return rows * (idx > 0).unsqueeze(-1).to(rows.dtype)
