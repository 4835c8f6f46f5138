"""RandPE (Ruoss et al. 2023): RoPE on randomised positions.

In training, each sequence's positions are a sorted random subset of [0, R) with
R = ``randpe_max_position`` (default 2 * max_seq_len), so the model sees large position values
with short sequences. At evaluation the positions are the given (contiguous) ones, unlike the
official code, which resampled at inference too (tape-spec D.4, F.2.11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from tape.pe import register
from tape.pe.base import LayerPE, PositionalEncoding, PositionLimit, PositionState, RotaryOptions

if TYPE_CHECKING:
    from tape.model.config import ModelConfig
from tape.pe.rope import RotaryLayer, rope_table


def sorted_random_positions(batch: int, length: int, max_position: int, device: torch.device) -> Tensor:
    """(batch, length) int64: for each row a sorted sample without replacement from [0, max_position)."""
    max_position = max(max_position, length)
    keys = torch.rand(batch, max_position, device=device)
    return keys.topk(length, dim=-1).indices.sort(dim=-1).values


@dataclass
class RandPEOptions(RotaryOptions):
    randpe_max_position: int | None = None
    """Training positions are a sorted random subset of [0, this); None means 2 * max_seq_len."""

    def problems(self, cfg: ModelConfig) -> list[str]:
        problems = super().problems(cfg)
        if self.randpe_max_position is not None and self.randpe_max_position < cfg.max_seq_len:
            problems.append(
                f"randpe_max_position={self.randpe_max_position} is below "
                f"max_seq_len={cfg.max_seq_len}; RandPE samples positions from a larger range"
            )
        return problems

    def max_position(self, cfg: ModelConfig) -> int:
        return self.randpe_max_position or 2 * cfg.max_seq_len


@register("randpe")
class RandPE(PositionalEncoding):
    """Options: ``randpe_max_position`` (range R of training positions), ``rope_theta``."""

    display = "RandPE"
    Options = RandPEOptions
    rotary = True
    relative = False  # training positions are random, so logits are not a function of offsets

    @classmethod
    def position_limit(cls, cfg: ModelConfig, opts: RandPEOptions) -> PositionLimit:
        return PositionLimit(opts.max_position(cfg), "randpe_max_position", "2 * model.max_seq_len")

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        cfg, opts = self.cfg, self.opts
        if self.training and query_pos.shape == key_pos.shape:
            b, n = query_pos.shape
            query_pos = key_pos = sorted_random_positions(b, n, opts.max_position(cfg), query_pos.device)
        rot = rope_table(query_pos, cfg.head_dim, opts.rope_theta, opts.rope_scaling, dtype,
                         yarn=opts.yarn())
        return PositionState(query_pos=query_pos, key_pos=key_pos, rot=rot)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return RotaryLayer()
