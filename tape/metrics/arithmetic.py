"""Addition accuracy over a grid of operand lengths (tape-spec D.1 evaluation protocol).

For each cell (len_a, len_b) the model greedily completes ``examples_per_cell`` prompts with the
KV cache. An example is correct when the generated tokens, cut to the gold answer's length and
with everything after the first EOS replaced by PAD, equal the gold answer plus EOS (exact match
of the whole answer). The paper's number is the mean over all cells of the cell accuracies.
Beside it, digit accuracy: the share of the gold answer's digits generated right at their place
(the partial credit that length generalisation often shows first, as in McLeish et al. 2024).
Grids are stored as tidy rows (len_a, len_b, n, correct, digits, digits_correct) so partial
grids can be merged; grids written before digit accuracy existed lack the last two columns.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import Tensor, nn

from tape.data.addition import DIGIT_IDS, EOS, PAD, VOCAB_SIZE, AdditionExample, cell_examples, decode, parse_sum
from tape.model.generate import greedy_generate


@dataclass(frozen=True)
class Cell:
    """One grid cell: ``correct`` of ``n`` examples with these operand lengths were right."""

    len_a: int
    len_b: int
    n: int
    correct: int
    digits: int | None = None  # gold answer digits over the n examples (None: not recorded)
    digits_correct: int | None = None  # of those, generated right at their place

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def digit_accuracy(self) -> float | None:
        return self.digits_correct / self.digits if self.digits else None


def exact_match(generated: Tensor, gold: Sequence[Sequence[int]]) -> list[bool]:
    """generated (B, K) new tokens, K >= every gold length; gold[i] ends with EOS.
    Row i is right iff its first len(gold[i]) tokens, PAD after the first EOS, equal gold[i]."""
    return [_cut_at_eos(row, len(target)) == list(target)
            for row, target in zip(generated.tolist(), gold)]


def _cut_at_eos(row: list[int], length: int) -> list[int]:
    """The first ``length`` tokens with everything after the first EOS replaced by PAD."""
    pred = row[:length]
    if EOS in pred:
        cut = pred.index(EOS) + 1
        pred = pred[:cut] + [PAD] * (len(pred) - cut)
    return pred


def digits_right(generated: Tensor, gold: Sequence[Sequence[int]]) -> list[int]:
    """generated (B, K) as for exact_match; per row, how many of gold[i]'s digits (all but its
    final EOS) the row has at the same place."""
    return [sum(p == t for p, t in zip(_cut_at_eos(row, len(target)), target[:-1]))
            for row, target in zip(generated.tolist(), gold)]


@torch.no_grad()
def evaluate_grid(
    model: nn.Module,
    max_digits: int,
    examples_per_cell: int,
    seed: int,
    batch_size: int = 512,
    device: torch.device | str | None = None,
) -> list[Cell]:
    """Score ``model`` (a DecoderLM) on every cell of [1..max_digits]^2.

    Cells with the same prompt length (len_a + len_b + 2) are decoded together, so batches need
    no padding; each batch generates as many tokens as its longest gold answer.
    """
    if max_digits < 1 or examples_per_cell < 1:
        raise ValueError(
            f"evaluate_grid(max_digits={max_digits}, examples_per_cell={examples_per_cell}): both "
            "must be >= 1 (the grid is [1..max_digits]^2 with examples_per_cell sums per cell)"
        )
    device = torch.device(device) if device is not None else next(model.parameters()).device
    by_length: dict[int, list[tuple[int, int, AdditionExample]]] = defaultdict(list)
    for la in range(1, max_digits + 1):
        for lb in range(1, max_digits + 1):
            for ex in cell_examples(seed, la, lb, examples_per_cell):
                by_length[la + lb].append((la, lb, ex))
    correct: dict[tuple[int, int], int] = defaultdict(int)
    digits: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])  # [gold, right]
    for _, items in sorted(by_length.items()):
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            prompts = torch.tensor([ex.prompt_ids() for _, _, ex in chunk], device=device)  # (B, P)
            gold = [ex.answer_ids() for _, _, ex in chunk]
            k = max(len(g) for g in gold)
            ids = model.generate(prompts, max_new_tokens=k, eos_token_id=EOS)  # (B, P + k)
            new = ids[:, prompts.shape[1] :]
            for (la, lb, _), ok, right, g in zip(chunk, exact_match(new, gold), digits_right(new, gold), gold):
                correct[(la, lb)] += int(ok)
                digits[(la, lb)][0] += len(g) - 1
                digits[(la, lb)][1] += right
    return [
        Cell(la, lb, examples_per_cell, correct[(la, lb)], *digits[(la, lb)])
        for la in range(1, max_digits + 1)
        for lb in range(1, max_digits + 1)
    ]


def summarize(cells: Iterable[Cell], train_digits: int) -> dict[str, float]:
    """Mean cell accuracy in % over all cells (the paper's number), over the training region
    (both operands <= train_digits) and over the rest (NaN when the grid has no such cells);
    the same three means of the cells' digit accuracies when every cell recorded its digits."""
    cells = list(cells)
    if not cells:
        raise ValueError("summarize() got an empty grid")

    def mean(group: list[Cell]) -> float:
        return 100.0 * sum(c.accuracy for c in group) / len(group) if group else float("nan")

    def digit_mean(group: list[Cell]) -> float:
        return 100.0 * sum(c.digit_accuracy for c in group) / len(group) if group else float("nan")

    inside = [c for c in cells if c.len_a <= train_digits and c.len_b <= train_digits]
    outside = [c for c in cells if not (c.len_a <= train_digits and c.len_b <= train_digits)]
    out = {
        "mean_accuracy": mean(cells),
        "in_distribution_accuracy": mean(inside),
        "ood_accuracy": mean(outside),
        "n_cells": float(len(cells)),
        "n_examples": float(sum(c.n for c in cells)),
    }
    if all(c.digits for c in cells):
        out |= {"digit_accuracy": digit_mean(cells), "in_distribution_digit_accuracy": digit_mean(inside),
                "ood_digit_accuracy": digit_mean(outside)}
    return out


GRID_FIELDS = ("len_a", "len_b", "n", "correct")
DIGIT_FIELDS = ("digits", "digits_correct")


def write_grid_csv(cells: Iterable[Cell], path: str | Path) -> None:
    """Tidy CSV, one row per cell (with the digit columns when every cell has them). Refuses to
    overwrite an existing file."""
    cells = list(cells)
    fields = GRID_FIELDS + (DIGIT_FIELDS if all(c.digits is not None for c in cells) else ())
    with open(path, "x", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for c in cells:
            writer.writerow([getattr(c, k) for k in fields])


def read_grid_csv(path: str | Path) -> list[Cell]:
    """Cells of a grid CSV, with or without the digit columns."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = tuple(reader.fieldnames or ())
        if fields not in (GRID_FIELDS, GRID_FIELDS + DIGIT_FIELDS):
            raise ValueError(f"{path}: expected columns {GRID_FIELDS} (then optionally "
                             f"{DIGIT_FIELDS}), got {reader.fieldnames}")
        return [Cell(*(int(row[k]) for k in fields)) for row in reader]


def merge_grids(*grids: Iterable[Cell]) -> list[Cell]:
    """Join partial grids (e.g. evaluated by separate jobs); a cell present twice is an error."""
    merged: dict[tuple[int, int], Cell] = {}
    for grid in grids:
        for c in grid:
            if (c.len_a, c.len_b) in merged:
                raise ValueError(f"cell (len_a={c.len_a}, len_b={c.len_b}) appears in two grids")
            merged[(c.len_a, c.len_b)] = c
    return [merged[key] for key in sorted(merged)]


class DigitsThenEos:
    """Greedy choice restricted to what an answer can be: a digit first, then digits or EOS,
    and EOS after ``max_digits`` digits (for ``greedy_generate``'s ``choose``; batch of one)."""

    def __init__(self, max_digits: int) -> None:
        self.max_digits, self.step = max_digits, 0

    def __call__(self, logits: Tensor) -> Tensor:  # (B, V) -> (B,)
        if logits.shape[-1] < VOCAB_SIZE:
            raise ValueError(f"the model has {logits.shape[-1]} output tokens, fewer than the addition "
                             f"vocabulary's {VOCAB_SIZE}: it is not an addition model")
        allowed = list(DIGIT_IDS) if self.step < self.max_digits else []
        if self.step > 0:
            allowed.append(EOS)
        self.step += 1
        masked = torch.full_like(logits, float("-inf"))
        masked[:, allowed] = logits[:, allowed]
        return masked.argmax(-1)


@torch.no_grad()
def solve(model: torch.nn.Module, prompt: str) -> str:
    """The model's answer to ``prompt`` ("12+34=", normal notation) in normal digit order ("46").

    The model is given the reversed prompt it was trained on ("21+43="); its reversed answer is
    read back to front. Decoding is greedy over digits and EOS only (at most one digit more than
    the longer operand), so the answer is always a number, right or wrong."""
    example = parse_sum(prompt)
    max_digits = max(example.len_a, example.len_b) + 1  # the longest possible sum
    device = next(model.parameters()).device
    ids = torch.tensor([example.prompt_ids()], device=device)  # (1, P)
    out = greedy_generate(model, ids, max_digits + 1, eos_token_id=EOS, choose=DigitsThenEos(max_digits))
    new = out[0, ids.shape[1]:].tolist()
    digits = new[: new.index(EOS)] if EOS in new else new
    return decode(digits)[::-1]
