"""What the variable-length synthetic tasks (parity with a scratchpad, MQAR) share: token roles,
right padding, labels from roles, a seeded stream of batches and teacher-forced scoring.

Every generator returns ``tokens`` and ``roles`` of one shape: a role says what a token is to
the loss and the evaluation (``GIVEN``: read, never scored; ``STEP``: a scratchpad result;
``ANSWER``: the final answer; ``COPY``: a token the sequence repeats from its input, given unless
the task scores copies; ``PADDING``: right padding). Rows of different lengths are padded on the
right, after every scored token, so causal attention needs no mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from tape.data.labels import IGNORE_INDEX

PADDING, GIVEN, STEP, ANSWER, COPY = -1, 0, 1, 2, 3
TRAIN_STREAM, VAL_STREAM, EVAL_STREAM = 0, 1, 2


def interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(B, n) and (B, n) -> (B, 2n): a_1 b_1 a_2 b_2 ..."""
    a, b = np.broadcast_arrays(a, b)
    out = np.empty((*a.shape[:-1], 2 * a.shape[-1]), dtype=np.int64)
    out[..., 0::2], out[..., 1::2] = a, b
    return out


def column(batch: int, value: int, width: int = 1) -> np.ndarray:
    """A (batch, width) block of one value."""
    return np.full((batch, width), value, dtype=np.int64)


def pad_right(parts: Sequence[tuple[np.ndarray, np.ndarray]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of (tokens, roles), each (B_i, T_i) -> one (sum B_i, max T_i) pair, right-padded
    with ``pad`` (role PADDING)."""
    width = max(t.shape[1] for t, _ in parts)
    tokens = np.concatenate([np.pad(t, ((0, 0), (0, width - t.shape[1])), constant_values=pad) for t, _ in parts])
    roles = np.concatenate([np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=PADDING)
                            for _, r in parts])
    return tokens, roles


def mixed_lengths(rng: np.random.Generator, batch: int, low: int, high: int,
                  make: Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]],
                  pad: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` rows whose size parameter (bits, pairs) is uniform in [low, high]: the sizes are
    drawn first, then ``make(rng, count, size)`` for each size in increasing order, rows shuffled
    back into the order of the draws; right-padded to the longest."""
    sizes = rng.integers(low, high + 1, size=batch)
    parts, order = [], []
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        parts.append(make(rng, len(rows), int(size)))
        order.append(rows)
    tokens, roles = pad_right(parts, pad)
    back = np.empty(batch, dtype=np.int64)
    back[np.concatenate(order)] = np.arange(batch)
    return tokens[back], roles[back]


def scored_roles(score_copies: bool = False) -> tuple[int, ...]:
    """The roles the loss (and the exact match) covers."""
    return (STEP, ANSWER, COPY) if score_copies else (STEP, ANSWER)


def labels_for(tokens: np.ndarray | Tensor, roles: np.ndarray | Tensor, score_copies: bool = False) -> Tensor:
    """Causal-LM labels (CausalLMModule scores logits[t] against labels[t + 1]): the token at
    every scored role, IGNORE_INDEX elsewhere."""
    tokens, roles = torch.as_tensor(tokens, dtype=torch.int64), torch.as_tensor(roles)
    scored = torch.isin(roles, torch.tensor(scored_roles(score_copies), dtype=roles.dtype))
    return torch.where(scored, tokens, torch.full_like(tokens, IGNORE_INDEX))


def as_batch(tokens: np.ndarray, roles: np.ndarray, score_copies: bool = False) -> dict[str, Tensor]:
    ids = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
    return {"input_ids": ids, "labels": labels_for(ids, roles, score_copies)}


def as_rows(batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    """A batch -> rows for a plain DataLoader (the validation set)."""
    return [{"input_ids": x, "labels": y} for x, y in zip(batch["input_ids"], batch["labels"])]


@dataclass
class SeededBatches(IterableDataset):
    """Endless training batches ``make(rng)``; batch k of rank r draws from a generator seeded
    by (seed, stream, r, k) only, so every PE trained with one seed sees the same sequences in
    the same order, and resume is exact."""

    make: Callable[[np.random.Generator], dict[str, Tensor]]
    seed: int
    rank: int = 0
    start: int = 0
    stream: int = TRAIN_STREAM

    def __post_init__(self) -> None:
        super().__init__()

    def batch(self, index: int) -> dict[str, Tensor]:
        rng = np.random.default_rng([self.seed, self.stream, self.rank, index])
        return {**self.make(rng), "batch_index": torch.tensor(index)}

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            yield self.batch(index)
            index += 1


@torch.no_grad()
def teacher_forced_hits(model: Any, tokens: np.ndarray, batch_size: int) -> np.ndarray:
    """(B, T) bool: whether the model's argmax at position t - 1 is tokens[t] (column 0, which
    nothing predicts, is False). Teacher forcing: every scored token right <=> greedy decoding,
    with the given tokens forced, reproduces the whole scored part."""
    device = next(model.parameters()).device
    out = np.zeros(tokens.shape, dtype=bool)
    for start in range(0, len(tokens), batch_size):
        ids = torch.from_numpy(np.ascontiguousarray(tokens[start:start + batch_size])).to(device)
        pred = model(ids).logits[:, :-1].argmax(-1)  # (b, T-1): position t predicts t+1
        out[start:start + len(ids), 1:] = (pred == ids[:, 1:]).cpu().numpy()
    return out
