"""Selective copy (the task CoPE, Golovneva et al. 2024, was shown on): ``length`` slots, ``items``
of them holding data tokens at random slots, the rest blank; then a separator; then the data
tokens again in their order of appearance:

    <bos> . d0 . . d2 . d1 . > d0 d2 d1

Data tokens are drawn with repeats from ``tokens`` data tokens. Only the copied tokens after
``>`` are scored (role ANSWER, tape/data/synthetic.py). Writing the i-th copy means finding the
i-th non-blank slot, so it needs counting non-blank tokens, not token positions; longer
sequences (more blanks, the same items) test it out of distribution. All randomness comes from
NumPy generators seeded by explicit integers.
"""

from __future__ import annotations

import numpy as np

from tape.data.synthetic import (
    ANSWER, EVAL_STREAM, GIVEN, VAL_STREAM, as_batch, column, mixed_lengths,
)

BASE_VOCAB: tuple[str, ...] = ("<pad>", "<bos>", ".", ">")
PAD, BOS, BLANK, SEP = range(4)
FIRST_DATA = len(BASE_VOCAB)


def vocab_size(tokens: int) -> int:
    return FIRST_DATA + tokens


def sequence_length(length: int, items: int) -> int:
    """Tokens of an example: <bos>, ``length`` slots, '>', ``items`` copies."""
    return length + items + 2


def decode(ids: np.ndarray | list[int]) -> str:
    """Token ids -> text such as ``<bos> . d0 . d2 > d0 d2`` (padding dropped)."""
    out = [BASE_VOCAB[i] if i < FIRST_DATA else f"d{i - FIRST_DATA}" for i in (int(x) for x in ids)]
    return " ".join(t for t in out if t != "<pad>")


def check_arguments(length: int, items: int, tokens: int) -> None:
    """ValueError naming the argument that makes an example impossible."""
    if items < 1:
        raise ValueError(f"selective copy needs items >= 1, got items={items}")
    if length < items:
        raise ValueError(f"length={length} slots cannot hold items={items} data tokens; use length >= items")
    if tokens < 1:
        raise ValueError(f"selective copy needs tokens >= 1 data tokens, got tokens={tokens}")


def generate(rng: np.random.Generator, batch: int, length: int, items: int,
             tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of ``length`` slots and ``items`` data tokens: (tokens, roles), int64
    (batch, length + items + 2)."""
    check_arguments(length, items, tokens)
    slots = np.sort(np.argsort(rng.random((batch, length)), axis=1)[:, :items], axis=1)  # (B, items), increasing
    data = FIRST_DATA + rng.integers(0, tokens, size=(batch, items), dtype=np.int64)  # (B, items), in slot order
    body = np.full((batch, length), BLANK, dtype=np.int64)
    np.put_along_axis(body, slots, data, axis=1)
    ids = np.concatenate([column(batch, BOS), body, column(batch, SEP), data], axis=1)
    roles = np.concatenate([np.full((batch, length + 2), GIVEN), np.full((batch, items), ANSWER)], axis=1)
    return ids, roles


def training_set(rng: np.random.Generator, batch: int, min_length: int, max_length: int, items: int,
                 tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of uniform length in [min_length, max_length], right-padded."""
    return mixed_lengths(rng, batch, min_length, max_length,
                         lambda r, count, n: generate(r, count, n, items, tokens), PAD)


def training_batch(rng: np.random.Generator, batch: int, min_length: int, max_length: int, items: int,
                   tokens: int) -> dict:
    return as_batch(*training_set(rng, batch, min_length, max_length, items, tokens))


def eval_set(seed: int, length: int, count: int, items: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed evaluation examples of ``length`` slots, for every PE and seed."""
    return generate(np.random.default_rng([seed, EVAL_STREAM, length]), count, length, items, tokens)


def val_set(seed: int, count: int, min_length: int, max_length: int, items: int,
            tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """In-distribution validation examples (a stream apart from training and evaluation)."""
    return training_set(np.random.default_rng([seed, VAL_STREAM]), count, min_length, max_length, items, tokens)
