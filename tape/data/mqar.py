"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"): read P key-value pairs,
then every key once more in a random order, each followed by its value:

    <bos> k_1 v_1 .. k_P v_P > q_1 a_1 .. q_P a_P

Keys are distinct within a sequence (drawn from ``keys`` key tokens), values are drawn
independently (from ``values`` value tokens), and a_j is the value paired with the key q_j.
Only the a_j are scored (role ANSWER, tape/data/synthetic.py): finding the query among the
keys is content-based addressing, whatever the positions, so MQAR is the control that needs
no position lookup. All randomness comes from NumPy generators seeded by explicit integers.
"""

from __future__ import annotations

import numpy as np

from tape.data.synthetic import (
    ANSWER, EVAL_STREAM, GIVEN, VAL_STREAM, as_batch, column, interleave, mixed_lengths,
)

BASE_VOCAB: tuple[str, ...] = ("<pad>", "<bos>", ">")
PAD, BOS, SEP = range(3)
FIRST_KEY = len(BASE_VOCAB)


def first_value(keys: int) -> int:
    return FIRST_KEY + keys


def vocab_size(keys: int, values: int) -> int:
    return FIRST_KEY + keys + values


def sequence_length(pairs: int) -> int:
    """Tokens of a P-pair example: <bos>, 2P of pairs, '>', 2P of queries and answers."""
    return 4 * pairs + 2


def decode(ids: np.ndarray | list[int], keys: int) -> str:
    """Token ids -> text such as ``<bos> k3 v0 > k3 v0`` (padding dropped)."""
    out = []
    for i in (int(x) for x in ids):
        if i < FIRST_KEY:
            out.append(BASE_VOCAB[i])
        else:
            out.append(f"k{i - FIRST_KEY}" if i < first_value(keys) else f"v{i - first_value(keys)}")
    return " ".join(t for t in out if t != "<pad>")


def generate(rng: np.random.Generator, batch: int, pairs: int, keys: int,
             values: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of ``pairs`` pairs: (tokens, roles), int64 (batch, 4 * pairs + 2)."""
    if pairs < 1:
        raise ValueError(f"MQAR needs pairs >= 1, got {pairs}")
    if keys < pairs:
        raise ValueError(f"{pairs} pairs need {pairs} distinct keys but only keys={keys} exist")
    if values < 1:
        raise ValueError(f"MQAR needs values >= 1, got {values}")
    k = np.argsort(rng.random((batch, keys)), axis=1)[:, :pairs]  # distinct keys per row
    v = rng.integers(0, values, size=(batch, pairs), dtype=np.int64)
    order = np.argsort(rng.random((batch, pairs)), axis=1)  # each key queried once
    q, a = np.take_along_axis(k, order, axis=1), np.take_along_axis(v, order, axis=1)
    fv = first_value(keys)
    tokens = np.concatenate([column(batch, BOS), interleave(FIRST_KEY + k, fv + v), column(batch, SEP),
                             interleave(FIRST_KEY + q, fv + a)], axis=1)
    roles = np.concatenate([np.full((batch, 2 * pairs + 2), GIVEN),
                            interleave(np.full_like(q, GIVEN), np.full_like(a, ANSWER))], axis=1)
    return tokens, roles


def training_set(rng: np.random.Generator, batch: int, min_pairs: int, max_pairs: int, keys: int,
                 values: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of uniform P in [min_pairs, max_pairs], right-padded."""
    return mixed_lengths(rng, batch, min_pairs, max_pairs,
                         lambda r, count, p: generate(r, count, p, keys, values), PAD)


def training_batch(rng: np.random.Generator, batch: int, min_pairs: int, max_pairs: int, keys: int,
                   values: int) -> dict:
    return as_batch(*training_set(rng, batch, min_pairs, max_pairs, keys, values))


def eval_set(seed: int, pairs: int, count: int, keys: int, values: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed evaluation examples of ``pairs`` pairs, for every PE and seed."""
    return generate(np.random.default_rng([seed, EVAL_STREAM, pairs]), count, pairs, keys, values)


def val_set(seed: int, count: int, min_pairs: int, max_pairs: int, keys: int,
            values: int) -> tuple[np.ndarray, np.ndarray]:
    """In-distribution validation examples (a stream apart from training and evaluation)."""
    return training_set(np.random.default_rng([seed, VAL_STREAM]), count, min_pairs, max_pairs, keys, values)
