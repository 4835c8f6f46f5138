"""Parity with a scratchpad (after Ebrahimi, Panchal and Memisevic 2024, "Your context is not an
array"): read n bits, then write the running parity p_i = b_1 xor ... xor b_i one step at a
time, then the answer p_n. Three scratchpad formats (``FORMATS``) separate how step i finds b_i:

* ``standard``: ``<bos> b_1 .. b_n > p_1 .. p_n = p_n``. Step i must fetch b_i by its index
  (n tokens before the position that predicts p_i): position-based addressing, whose offset
  grows with n.
* ``interleaved``: ``<bos> b_1 .. b_n > b_1 p_1 .. b_n p_n = p_n``. b_i is repeated (given)
  right before p_i: no lookup at all, a control.
* ``mnemonics``: ``<bos> m_1 b_1 .. m_n b_n > m_1 p_1 .. m_n p_n = p_n``, with m_i distinct
  anchor tokens drawn at random per sequence and repeated (given) before p_i: step i finds b_i
  as the token after the earlier m_i, content-based addressing, a control.

The repeated bits and anchors have role COPY (given, unscored unless ``score_copies``); the p_i
are STEP, the final p_n is ANSWER (tape/data/synthetic.py). Bits are drawn before anything
else, so ``generate`` (and ``eval_set``) draws the same bit strings in every format from one
seeded generator; training batches make no such promise.
All randomness comes from NumPy generators seeded by explicit integers.
"""

from __future__ import annotations

import numpy as np

from tape.data.synthetic import (
    ANSWER, COPY, EVAL_STREAM, GIVEN, STEP, VAL_STREAM, as_batch, column, interleave, mixed_lengths,
)

BASE_VOCAB: tuple[str, ...] = ("<pad>", "<bos>", ">", "=", "0", "1")
PAD, BOS, SEP, EQUALS, ZERO, ONE = range(6)
FIRST_MNEMONIC = len(BASE_VOCAB)
FORMATS: tuple[str, ...] = ("standard", "interleaved", "mnemonics")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"scratchpad format {fmt!r}; choose one of {list(FORMATS)}")


def vocab_size(fmt: str, mnemonics: int) -> int:
    """The base tokens, plus ``mnemonics`` anchor tokens in the mnemonics format."""
    check_format(fmt)
    return len(BASE_VOCAB) + (mnemonics if fmt == "mnemonics" else 0)


def sequence_length(fmt: str, n: int) -> int:
    """Tokens of an n-bit example: <bos>, input, '>', scratchpad, '=', answer."""
    check_format(fmt)
    return {"standard": 2, "interleaved": 3, "mnemonics": 4}[fmt] * n + 4


def decode(ids: np.ndarray | list[int]) -> str:
    """Token ids -> text such as ``<bos>101>110=0`` (anchors as ``[k]``, padding dropped)."""
    out = []
    for i in (int(x) for x in ids):
        out.append(BASE_VOCAB[i] if i < FIRST_MNEMONIC else f"[{i - FIRST_MNEMONIC}]")
    return "".join(t for t in out if t != "<pad>")


def generate(rng: np.random.Generator, batch: int, n: int, fmt: str,
             mnemonics: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of ``n`` bits in format ``fmt``: (tokens, roles), int64 (batch, T)."""
    check_format(fmt)
    if n < 1:
        raise ValueError(f"parity needs n >= 1 bits, got {n}")
    if fmt == "mnemonics" and mnemonics < n:
        raise ValueError(f"{n} bits need {n} distinct anchors but only mnemonics={mnemonics} exist")
    bits = rng.integers(0, 2, size=(batch, n), dtype=np.int64)
    parity = np.cumsum(bits, axis=1) % 2
    b, p = ZERO + bits, ZERO + parity
    if fmt == "standard":
        given, scratch, scratch_roles = b, p, np.full_like(p, STEP)
    else:
        if fmt == "interleaved":
            anchors = b
        else:  # n distinct anchors per row: the first n of a random permutation of the pool
            anchors = FIRST_MNEMONIC + np.argsort(rng.random((batch, mnemonics)), axis=1)[:, :n]
        given = b if fmt == "interleaved" else interleave(anchors, b)
        scratch = interleave(anchors, p)
        scratch_roles = interleave(np.full_like(p, COPY), np.full_like(p, STEP))
    tokens = np.concatenate([column(batch, BOS), given, column(batch, SEP), scratch,
                             column(batch, EQUALS), p[:, -1:]], axis=1)
    roles = np.concatenate([np.full((batch, 1 + given.shape[1] + 1), GIVEN), scratch_roles,
                            column(batch, GIVEN), column(batch, ANSWER)], axis=1)
    return tokens, roles


def training_set(rng: np.random.Generator, batch: int, min_bits: int, max_bits: int, fmt: str,
                 mnemonics: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` examples of uniform n in [min_bits, max_bits], right-padded."""
    return mixed_lengths(rng, batch, min_bits, max_bits,
                         lambda r, count, n: generate(r, count, n, fmt, mnemonics), PAD)


def training_batch(rng: np.random.Generator, batch: int, min_bits: int, max_bits: int, fmt: str,
                   mnemonics: int = 0, score_copies: bool = False) -> dict:
    return as_batch(*training_set(rng, batch, min_bits, max_bits, fmt, mnemonics), score_copies)


def eval_set(seed: int, n: int, fmt: str, count: int, mnemonics: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed evaluation examples of n bits, for every PE and seed (the same bit strings in
    every format)."""
    return generate(np.random.default_rng([seed, EVAL_STREAM, n]), count, n, fmt, mnemonics)


def val_set(seed: int, count: int, min_bits: int, max_bits: int, fmt: str,
            mnemonics: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """In-distribution validation examples (a stream apart from training and evaluation)."""
    return training_set(np.random.default_rng([seed, VAL_STREAM]), count, min_bits, max_bits, fmt, mnemonics)
