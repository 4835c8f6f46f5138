"""Counting (the task CoPE, Golovneva et al. 2024, was shown on): ``ops`` operations, each an
increment ``x_k ++`` of one of ``variables`` variables (k uniform) or a no-op ``pass`` (with
probability ``pass_prob``); then a query ``? x_k`` (k uniform) and its answer, the number of
increments of x_k as one count token:

    <bos> x1 ++ pass x0 ++ pass x1 ++ ? x1 c2

At most ``max_increments`` increments per sequence (a random subset of the drawn ones is kept,
the rest become ``pass``), so the answers are c0..c{max_increments} at every length and longer
sequences add ``pass`` distractors, not counts. An increment is two tokens and a ``pass`` one, so
rows of one size differ in length: each is right-padded to ``sequence_length`` (the widest).
Only the count is scored (role ANSWER, tape/data/synthetic.py). All randomness comes from NumPy
generators seeded by explicit integers.
"""

from __future__ import annotations

import numpy as np

from tape.data.synthetic import (
    ANSWER, EVAL_STREAM, GIVEN, PADDING, VAL_STREAM, as_batch, column, mixed_lengths,
)

BASE_VOCAB: tuple[str, ...] = ("<pad>", "<bos>", "pass", "++", "?")
PAD, BOS, PASS, INCREMENT, QUERY = range(5)
FIRST_VARIABLE = len(BASE_VOCAB)


def first_count(variables: int) -> int:
    return FIRST_VARIABLE + variables


def vocab_size(variables: int, max_increments: int) -> int:
    """The base tokens, x0..x{V-1} and c0..c{max_increments}."""
    return first_count(variables) + max_increments + 1


def sequence_length(ops: int, max_increments: int) -> int:
    """Tokens of the longest ``ops``-operation example: <bos>, ops + increments, '? x_k', the count."""
    return 1 + ops + min(ops, max_increments) + 3


def decode(ids: np.ndarray | list[int], variables: int) -> str:
    """Token ids -> text such as ``<bos> x1 ++ pass ? x1 c1`` (padding dropped)."""
    out = []
    for i in (int(x) for x in ids):
        if i < FIRST_VARIABLE:
            out.append(BASE_VOCAB[i])
        else:
            out.append(f"x{i - FIRST_VARIABLE}" if i < first_count(variables) else f"c{i - first_count(variables)}")
    return " ".join(t for t in out if t != "<pad>")


def check_arguments(ops: int, variables: int, max_increments: int, pass_prob: float) -> None:
    """ValueError naming the argument that makes an example impossible."""
    if ops < 1:
        raise ValueError(f"counting needs ops >= 1 operations, got ops={ops}")
    if variables < 1:
        raise ValueError(f"counting needs variables >= 1, got variables={variables}")
    if max_increments < 1:
        raise ValueError(f"counting needs max_increments >= 1, got max_increments={max_increments}")
    if not 0.0 <= pass_prob <= 1.0:
        raise ValueError(f"pass_prob={pass_prob} is not a probability; use 0 <= pass_prob <= 1")


def capped_increments(rng: np.random.Generator, batch: int, ops: int, pass_prob: float,
                      max_increments: int) -> np.ndarray:
    """(B, ops) bool: each op an increment with probability 1 - pass_prob, then a random subset of
    at most ``max_increments`` of them kept per row."""
    drawn = rng.random((batch, ops)) >= pass_prob
    scores = np.where(drawn, rng.random((batch, ops)), 2.0)  # non-increments rank last
    rank = np.argsort(np.argsort(scores, axis=1), axis=1)
    return drawn & (rank < max_increments)


def compact(ids: np.ndarray, roles: np.ndarray, keep: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept tokens of each row moved left in order, right-padded to ``width``: (B, width) each."""
    order = np.argsort(~keep, axis=1, kind="stable")
    ids, roles = np.take_along_axis(ids, order, axis=1), np.take_along_axis(roles, order, axis=1)
    padded = np.take_along_axis(~keep, order, axis=1)
    return np.where(padded, PAD, ids)[:, :width], np.where(padded, PADDING, roles)[:, :width]


def generate(rng: np.random.Generator, batch: int, ops: int, variables: int, max_increments: int,
             pass_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of ``ops`` operations: (tokens, roles), int64 (batch, sequence_length)."""
    check_arguments(ops, variables, max_increments, pass_prob)
    increment = capped_increments(rng, batch, ops, pass_prob, max_increments)  # (B, ops)
    variable = rng.integers(0, variables, size=(batch, ops), dtype=np.int64)  # (B, ops)
    query = rng.integers(0, variables, size=(batch, 1), dtype=np.int64)  # (B, 1)
    count = (increment & (variable == query)).sum(axis=1, keepdims=True)  # (B, 1)
    first = np.where(increment, FIRST_VARIABLE + variable, PASS)  # 'x_k' or 'pass'
    second = np.where(increment, INCREMENT, PAD)  # '++' or nothing
    op_ids = np.stack([first, second], axis=2).reshape(batch, 2 * ops)  # (B, 2 ops)
    op_keep = np.stack([np.ones_like(increment), increment], axis=2).reshape(batch, 2 * ops)
    ids = np.concatenate([column(batch, BOS), op_ids, column(batch, QUERY), FIRST_VARIABLE + query,
                          first_count(variables) + count], axis=1)  # (B, 2 ops + 4)
    roles = np.concatenate([np.full((batch, 2 * ops + 3), GIVEN), column(batch, ANSWER)], axis=1)
    keep = np.concatenate([np.ones((batch, 1), bool), op_keep, np.ones((batch, 3), bool)], axis=1)
    return compact(ids, roles, keep, sequence_length(ops, max_increments))


def training_set(rng: np.random.Generator, batch: int, min_ops: int, max_ops: int, variables: int,
                 max_increments: int, pass_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of uniform ops in [min_ops, max_ops], right-padded."""
    return mixed_lengths(rng, batch, min_ops, max_ops,
                         lambda r, n, ops: generate(r, n, ops, variables, max_increments, pass_prob), PAD)


def training_batch(rng: np.random.Generator, batch: int, min_ops: int, max_ops: int, variables: int,
                   max_increments: int, pass_prob: float) -> dict:
    return as_batch(*training_set(rng, batch, min_ops, max_ops, variables, max_increments, pass_prob))


def eval_set(seed: int, ops: int, count: int, variables: int, max_increments: int,
             pass_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """The fixed evaluation examples of ``ops`` operations, for every PE and seed."""
    return generate(np.random.default_rng([seed, EVAL_STREAM, ops]), count, ops, variables, max_increments,
                    pass_prob)


def val_set(seed: int, count: int, min_ops: int, max_ops: int, variables: int, max_increments: int,
            pass_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """In-distribution validation examples (a stream apart from training and evaluation)."""
    return training_set(np.random.default_rng([seed, VAL_STREAM]), count, min_ops, max_ops, variables,
                        max_increments, pass_prob)
