"""Flip-flop language modelling (Liu et al. 2023, "Exposing attention glitches with flip-flop
language modeling"): a seeded generator and training batches.

A sequence is a run of instruction-bit pairs: ``w b`` writes bit b, ``i b`` is noise to ignore,
``r b`` reads: b must equal the most recently written bit. Every sequence starts with a write
and ends with a read, so it holds at least one read. Instructions are drawn independently with
P(ignore) = ``p_ignore`` and P(write) = P(read) = (1 - p_ignore) / 2: a high ``p_ignore`` gives
sparse sequences (a read far from its write), a low one dense sequences. The only deterministic
tokens are the bits after ``r``; the read error is the fraction of them a model gets wrong.
All randomness comes from NumPy generators seeded by explicit integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from tape.data.labels import IGNORE_INDEX

VOCAB: tuple[str, ...] = ("<pad>", "w", "r", "i", "0", "1")
PAD, WRITE, READ, IGNORE, ZERO, ONE = range(6)
VOCAB_SIZE = len(VOCAB)
TRAIN_STREAM, VAL_STREAM, EVAL_STREAM = 0, 1, 2
LOSS_ON = ("reads", "all")


def decode(ids: np.ndarray | list[int]) -> str:
    """Token ids -> text such as ``w1i0r1``."""
    return "".join(VOCAB[int(i)] for i in ids)


def generate(rng: np.random.Generator, batch: int, length: int, p_ignore: float) -> np.ndarray:
    """``batch`` flip-flop sequences of ``length`` tokens (even, >= 4): int64 (batch, length)."""
    if length < 4 or length % 2:
        raise ValueError(f"flip-flop length {length} must be even and >= 4 (instruction-bit pairs, "
                         "a write first and a read last)")
    if not 0.0 <= p_ignore < 1.0:
        raise ValueError(f"p_ignore={p_ignore} must be in [0, 1)")
    n = length // 2
    p_wr = (1.0 - p_ignore) / 2
    ops = rng.choice(np.array([WRITE, READ, IGNORE]), size=(batch, n), p=[p_wr, p_wr, p_ignore])
    ops[:, 0], ops[:, -1] = WRITE, READ
    bits = rng.integers(0, 2, size=(batch, n))
    is_write = ops == WRITE
    last_write = np.maximum.accumulate(np.where(is_write, np.arange(n), 0), axis=1)  # (B, n)
    remembered = np.take_along_axis(bits, last_write, axis=1)
    bits = np.where(ops == READ, remembered, bits)
    out = np.empty((batch, length), dtype=np.int64)
    out[:, 0::2], out[:, 1::2] = ops, ZERO + bits
    return out


def read_mask(tokens: np.ndarray | Tensor) -> np.ndarray | Tensor:
    """True at the bit tokens that follow a read (the deterministic ones), same shape as tokens."""
    if isinstance(tokens, np.ndarray):
        mask = np.zeros(tokens.shape, dtype=bool)
    else:
        mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[..., 1:] = tokens[..., :-1] == READ  # 'r' only sits at instruction (even) positions
    return mask


def labels_for(tokens: Tensor, loss_on: str) -> Tensor:
    """Training labels: the read bits only (``reads``) or every token (``all``)."""
    if loss_on == "all":
        return tokens.clone()
    if loss_on != "reads":
        raise ValueError(f"loss_on={loss_on!r}; choose one of {LOSS_ON}")
    return torch.where(read_mask(tokens), tokens, torch.full_like(tokens, IGNORE_INDEX))


def eval_set(seed: int, length: int, p_ignore: float, n: int) -> np.ndarray:
    """The fixed evaluation sequences of one (length, sparsity) cell, for every PE and seed."""
    words = [seed, EVAL_STREAM, length, int(round(p_ignore * 1e6))]
    return generate(np.random.default_rng(words), n, length, p_ignore)


@dataclass
class FlipFlopStream(IterableDataset):
    """Endless training batches; batch k of rank r is a function of (seed, r, k) only, so every
    PE trained with one seed sees the same sequences in the same order, and resume is exact."""

    seed: int
    length: int
    batch_size: int
    p_ignore: float
    loss_on: str = "reads"
    rank: int = 0
    start: int = 0
    stream: int = TRAIN_STREAM

    def __post_init__(self) -> None:
        super().__init__()

    def batch(self, index: int) -> dict[str, Tensor]:
        rng = np.random.default_rng([self.seed, self.stream, self.rank, index])
        ids = torch.from_numpy(generate(rng, self.batch_size, self.length, self.p_ignore))
        return {"input_ids": ids, "labels": labels_for(ids, self.loss_on),
                "batch_index": torch.tensor(index)}

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            yield self.batch(index)
            index += 1
