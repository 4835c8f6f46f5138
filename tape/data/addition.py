"""Multi-digit addition data (tape-spec D.1): a character vocabulary, a seeded generator, batches.

Every number is written least-significant digit first ("reverse_all"): 12 + 39 = 51 becomes the
text ``21+93=15`` followed by EOS. Operands have exact digit counts; training samples a length
bucket (len_a, len_b) uniformly from [1..n]^2 per example. The loss covers only the answer (the
tokens after '='). All randomness comes from NumPy generators seeded by explicit integers, so the
same seed gives the same bytes on every machine (the Abacus code called ``random.seed()`` without
an argument, ecosystem.md section 8).
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from tape.data.labels import IGNORE_INDEX

# Vocabulary of the arithmetic repo (tape-spec D.1; there spaces map to PAD and unknown chars to UNK,
# here ``encode`` refuses a character outside it).
VOCAB: tuple[str, ...] = ("<pad>", "<unk>", "<bos>", "<eos>", *"0123456789", "+", "-", "x", "=")
PAD, UNK, BOS, EOS = 0, 1, 2, 3
TOKEN_ID: dict[str, int] = {s: i for i, s in enumerate(VOCAB)}
PLUS, EQUALS = TOKEN_ID["+"], TOKEN_ID["="]
VOCAB_SIZE = len(VOCAB)  # 18

# Independent random streams derived from one user seed (NumPy SeedSequence entropy words).
TRAIN_STREAM, VAL_STREAM, GRID_STREAM, SAMPLE_STREAM, RANK_STREAM = 0, 1, 2, 3, 4


def encode(text: str) -> list[int]:
    """Characters -> token ids (space -> PAD); a character outside the vocabulary is an error,
    never a silent ``<unk>``, so a typo in a prompt cannot turn into a different question."""
    if not isinstance(text, str):
        raise TypeError(f"encode() takes a str, got {type(text).__name__} {text!r}")
    for pos, ch in enumerate(text):
        if ch != " " and ch not in TOKEN_ID:
            raise ValueError(
                f"encode({text!r}): character {ch!r} at position {pos} is not in the addition "
                f"vocabulary (digits 0-9, '+', '-', 'x', '=' and space)"
            )
    return [PAD if ch == " " else TOKEN_ID[ch] for ch in text]


def decode(ids: Sequence[int]) -> str:
    """Token ids -> text; special tokens print as their names (``<eos>``), unknown ids as ``<?>``."""
    return "".join(VOCAB[i] if 0 <= i < VOCAB_SIZE else "<?>" for i in ids)


@dataclass(frozen=True)
class AdditionExample:
    """One sum a + b with its operand digit counts; the text is built from it."""

    a: int
    b: int

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                hint = f"; for digits in a string pass int({value!r})" if isinstance(value, str) else ""
                raise TypeError(f"AdditionExample({name}={value!r}): operands must be non-negative "
                                f"integers, got {type(value).__name__}{hint}")
            if value < 0:
                raise ValueError(
                    f"AdditionExample({name}={value}): operands must be non-negative integers "
                    "(the task adds digit strings; it has no sign)"
                )
            object.__setattr__(self, name, int(value))  # numpy ints -> int, so str() is digits

    @property
    def len_a(self) -> int:
        return len(str(self.a))

    @property
    def len_b(self) -> int:
        return len(str(self.b))

    @property
    def prompt(self) -> str:
        """Reversed a, '+', reversed b, '=': what the model is given at evaluation."""
        return f"{str(self.a)[::-1]}+{str(self.b)[::-1]}="

    @property
    def answer(self) -> str:
        """Reversed a + b (least-significant digit first), without EOS."""
        return str(self.a + self.b)[::-1]

    def prompt_ids(self) -> list[int]:
        return encode(self.prompt)

    def answer_ids(self) -> list[int]:
        """The answer digits followed by EOS: exactly what must be generated."""
        return encode(self.answer) + [EOS]

    def token_ids(self) -> list[int]:
        return self.prompt_ids() + self.answer_ids()


def max_sequence_length(max_digits: int) -> int:
    """Tokens in the longest example with operands of up to ``max_digits`` digits:
    a (n) + '+' + b (n) + '=' + answer (n + 1) + EOS = 3n + 4."""
    return 3 * max_digits + 4


def random_operand(rng: np.random.Generator, digits: int) -> int:
    """A uniformly random integer with exactly ``digits`` decimal digits (0..9 when digits = 1)."""
    if digits < 1:
        raise ValueError(f"an operand needs at least one digit, got digits={digits}")
    if digits == 1:
        return int(rng.integers(0, 10))
    first = int(rng.integers(1, 10))
    rest = rng.integers(0, 10, size=digits - 1)
    return int(str(first) + "".join(map(str, rest.tolist())))


def bucket_examples(
    seed: int | Sequence[int], count: int, max_digits: int, stream: int = TRAIN_STREAM
) -> list[AdditionExample]:
    """``count`` examples; each draws (len_a, len_b) uniformly from [1..max_digits]^2, then operands
    with exactly those digit counts. Deterministic in (seed, stream)."""
    if max_digits < 1:
        raise ValueError(f"max_digits={max_digits} must be >= 1")
    words = [*(seed if isinstance(seed, Sequence) else [seed]), stream]
    rng = np.random.default_rng(words)
    out = []
    for _ in range(count):
        len_a, len_b = (int(x) for x in rng.integers(1, max_digits + 1, size=2))
        out.append(AdditionExample(random_operand(rng, len_a), random_operand(rng, len_b)))
    return out


def cell_examples(seed: int, len_a: int, len_b: int, count: int) -> list[AdditionExample]:
    """``count`` examples with exactly len_a and len_b digits: one cell of the evaluation grid.
    Each cell has its own stream, so a cell's examples do not depend on the grid's size."""
    rng = np.random.default_rng([seed, GRID_STREAM, len_a, len_b])
    return [
        AdditionExample(random_operand(rng, len_a), random_operand(rng, len_b)) for _ in range(count)
    ]


def collate(examples: Sequence[AdditionExample]) -> dict[str, Tensor]:
    """Right-padded batch: input_ids (B, N) and labels (B, N), labels = input ids on the answer
    tokens (after '='), IGNORE_INDEX on the prompt and on padding. The model's logits at t are
    scored against labels at t + 1 (the usual causal shift)."""
    rows = [ex.token_ids() for ex in examples]
    n = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), n), PAD, dtype=torch.long)
    labels = torch.full((len(rows), n), IGNORE_INDEX, dtype=torch.long)
    for i, (ex, row) in enumerate(zip(examples, rows)):
        input_ids[i, : len(row)] = torch.tensor(row)
        start = len(ex.prompt)  # first answer token
        labels[i, start : len(row)] = input_ids[i, start : len(row)]
    return {"input_ids": input_ids, "labels": labels}


class AdditionStream(IterableDataset):
    """An endless stream of training batches. Batch k of rank r is a function of (seed, r, k)
    only, so a run resumed at batch k sees exactly the batches an uninterrupted run would."""

    def __init__(
        self, seed: int, max_digits: int, batch_size: int, rank: int = 0, start: int = 0
    ) -> None:
        super().__init__()
        self.seed, self.max_digits, self.batch_size = seed, max_digits, batch_size
        self.rank, self.start = rank, start

    def batch(self, index: int) -> dict[str, Tensor]:
        # Rank 0 keeps the words single-device runs always used. SeedSequence pads entropy with
        # zeros to four words, so [seed, 1, 0, 0] (rank 1, batch 0) drew the validation set's
        # [seed, 1]: other ranks take a stream word of their own.
        words = [self.seed, self.rank, index] if self.rank == 0 else [self.seed, RANK_STREAM, self.rank, index]
        examples = bucket_examples(words, self.batch_size, self.max_digits)
        out = collate(examples)
        out["batch_index"] = torch.tensor(index)
        return out

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            yield self.batch(index)
            index += 1


# ---------------------------------------------------------------------------- asking a model
PROMPT_CHARS = frozenset("0123456789+=")
_SUM = re.compile(r"([0-9]+)\+([0-9]+)=")
DIGIT_IDS = tuple(TOKEN_ID[d] for d in "0123456789")  # == conf/task/addition.yaml digit_ids (tested)


def parse_sum(prompt: str) -> AdditionExample:
    """A sum as a person writes it, ``"12+34="`` (most significant digit first), as an example;
    anything that is not digits, one '+' and a final '=' is an error naming the problem."""
    if not isinstance(prompt, str):
        raise TypeError(f"a prompt is a str such as '12+34=', got {type(prompt).__name__} {prompt!r}")
    for pos, ch in enumerate(prompt):
        if ch not in PROMPT_CHARS:
            raise ValueError(f"prompt {prompt!r}: character {ch!r} at position {pos} is not allowed; "
                             "a prompt is digits, one '+' and a final '=', e.g. '12+34='")
    match = _SUM.fullmatch(prompt)
    if match is None:
        raise ValueError(f"prompt {prompt!r} is not of the form <digits>+<digits>= (e.g. '12+34='): "
                         "it needs one '+' between two numbers and one '=' at the end")
    return AdditionExample(int(match[1]), int(match[2]))


