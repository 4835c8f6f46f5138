"""The group word problem: read g_1 .. g_N, output every prefix product g_1 g_2 ... g_t.

Groups are permutation groups with a fixed element ordering, the identity first:

* ``parity``: Z2 as the permutations of 2 points (0 = identity = even, 1 = the swap = odd); the
  prefix product is the running parity, the trivial (abelian) case;
* ``s3``: the 6 permutations of 3 points in lexicographic order (non-abelian, solvable);
* ``a5``: the 60 even permutations of 5 points in lexicographic order (the smallest
  non-solvable group: its word problem is NC1-complete, Barrington 1989).

An element id indexes ``Group.perms``; ``a * b`` is the composition ``a after b``,
``(a * b)(x) = a(b(x))``, tabulated in ``Group.table``. A sequence's tokens are element ids
drawn uniformly; its targets are the prefix products (element ids), one per token, so the loss
and the accuracy cover every position. The vocabulary is the group's elements, then ``<pad>``
(the slot after the last element that carries its answer in training) and ``<bos>``.
All randomness comes from NumPy generators seeded by explicit integers.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from tape.data.labels import IGNORE_INDEX

GROUPS: tuple[str, ...] = ("parity", "s3", "a5")
TRAIN_STREAM, VAL_STREAM, EVAL_STREAM = 0, 1, 2


@dataclass(frozen=True, eq=False)
class Group:
    """A finite permutation group: ``perms`` (n, points) with the identity at id 0, the
    multiplication table ``table[a, b] = a * b`` and ``inverse[a]``."""

    name: str
    perms: np.ndarray
    table: np.ndarray
    inverse: np.ndarray

    @property
    def order(self) -> int:
        return len(self.perms)

    @property
    def identity(self) -> int:
        return 0

    @property
    def pad(self) -> int:
        return self.order

    @property
    def bos(self) -> int:
        return self.order + 1

    @property
    def vocab_size(self) -> int:
        """Element ids, <pad> and <bos>."""
        return self.order + 2

    def decode(self, ids: np.ndarray | list[int]) -> list[str]:
        """Token ids -> one-line permutation images such as ``102`` (and <pad>, <bos>)."""
        return ["<pad>" if i == self.pad else "<bos>" if i == self.bos
                else "".join(map(str, self.perms[int(i)])) for i in ids]


def is_even(perm: tuple[int, ...] | np.ndarray) -> bool:
    """True when the permutation has an even number of inversions."""
    p = list(perm)
    return sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p))) % 2 == 0


def permutation_group(name: str, perms: list[tuple[int, ...]]) -> Group:
    """Tabulate the group of the given permutations (closed under composition, identity first)."""
    arr = np.array(perms, dtype=np.int64)
    index = {tuple(p): i for i, p in enumerate(perms)}
    if len(index) != len(perms) or tuple(arr[0]) != tuple(range(arr.shape[1])):
        raise ValueError(f"group {name}: the permutations must be distinct, the identity first")
    n = len(perms)
    table = np.empty((n, n), dtype=np.int64)
    for a in range(n):
        for b in range(n):
            composed = tuple(arr[a][arr[b]])  # (a * b)(x) = a(b(x))
            if composed not in index:
                raise ValueError(f"group {name} is not closed: {perms[a]} * {perms[b]} = {composed}")
            table[a, b] = index[composed]
    inverse = np.argmax(table == 0, axis=1)
    for frozen in (arr, table, inverse):
        frozen.setflags(write=False)
    return Group(name, arr, table, inverse)


@functools.cache
def get_group(name: str) -> Group:
    """The group called ``name`` (one of GROUPS)."""
    if name == "parity":
        return permutation_group(name, list(itertools.permutations(range(2))))
    if name == "s3":
        return permutation_group(name, list(itertools.permutations(range(3))))
    if name == "a5":
        return permutation_group(name, [p for p in itertools.permutations(range(5)) if is_even(p)])
    raise ValueError(f"unknown group {name!r}; choose one of {list(GROUPS)}")


def multiply(group: Group, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    """Elementwise ``a * b`` of element ids (broadcasting)."""
    return group.table[a, b]


def prefix_products(group: Group, tokens: np.ndarray) -> np.ndarray:
    """(..., N) element ids -> (..., N): position t holds tokens[0] * ... * tokens[t]."""
    tokens = np.asarray(tokens, dtype=np.int64)
    out = np.empty_like(tokens)
    if tokens.shape[-1] == 0:
        return out
    acc = tokens[..., 0]
    out[..., 0] = acc
    for t in range(1, tokens.shape[-1]):
        acc = group.table[acc, tokens[..., t]]
        out[..., t] = acc
    return out


def generate(rng: np.random.Generator, group: Group, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` words of ``length`` uniform elements: (tokens, prefix products), int64 (batch, length)."""
    if length < 1:
        raise ValueError(f"word length {length} must be >= 1")
    tokens = rng.integers(0, group.order, size=(batch, length), dtype=np.int64)
    return tokens, prefix_products(group, tokens)


def model_inputs(group: Group, tokens: np.ndarray | Tensor, bos: bool) -> Tensor:
    """What the model reads at evaluation: ``[<bos>] g_1 .. g_N``; the answer for g_t is read
    from the logits at g_t's position (index t - 1 + bos)."""
    ids = torch.as_tensor(tokens, dtype=torch.int64)
    if bos:
        ids = torch.cat([torch.full_like(ids[..., :1], group.bos), ids], dim=-1)
    return ids


def training_batch(group: Group, tokens: np.ndarray | Tensor, targets: np.ndarray | Tensor,
                   bos: bool) -> dict[str, Tensor]:
    """The causal-LM format of tape.lightning.CausalLMModule (the logits at position t are
    scored against labels[t + 1]): ``input_ids = [<bos>] g_1 .. g_N <pad>`` and labels that put
    prefix product t right after g_t's position, so every one of the N products is scored. The
    trailing <pad> is never attended to by a scored position (causal attention)."""
    ids = model_inputs(group, tokens, bos)
    ids = torch.cat([ids, torch.full_like(ids[..., :1], group.pad)], dim=-1)
    targets = torch.as_tensor(targets, dtype=torch.int64)
    skip = torch.full((*targets.shape[:-1], 1 + int(bos)), IGNORE_INDEX, dtype=torch.int64)
    return {"input_ids": ids, "labels": torch.cat([skip, targets], dim=-1)}


def eval_set(seed: int, group: Group, length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed evaluation words of one (group, length) cell, for every PE and seed."""
    words = [seed, EVAL_STREAM, GROUPS.index(group.name), length]
    return generate(np.random.default_rng(words), group, n, length)


def val_set(seed: int, group: Group, length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """In-distribution validation words (a stream apart from training and evaluation)."""
    return generate(np.random.default_rng([seed, VAL_STREAM]), group, n, length)


@dataclass
class WordProblemStream(IterableDataset):
    """Endless training batches; batch k of rank r is a function of (seed, r, k) only, so every
    PE trained with one seed sees the same words in the same order, and resume is exact."""

    seed: int
    group_name: str
    length: int
    batch_size: int
    bos: bool = True
    rank: int = 0
    start: int = 0
    stream: int = TRAIN_STREAM

    def __post_init__(self) -> None:
        super().__init__()
        self.group = get_group(self.group_name)

    def batch(self, index: int) -> dict[str, Tensor]:
        rng = np.random.default_rng([self.seed, self.stream, self.rank, index])
        tokens, targets = generate(rng, self.group, self.batch_size, self.length)
        return {**training_batch(self.group, tokens, targets, self.bos), "batch_index": torch.tensor(index)}

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            yield self.batch(index)
            index += 1
