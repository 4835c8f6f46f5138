"""Data modules: addition (seeded sums), packed local or streamed text (pretraining) and
pre-tokenised rows (fine-tuning). Training streams are seeded per batch index (exact resume)."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator, Mapping, Sequence

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from tape.data.labels import IGNORE_INDEX
from tape.data.addition import VAL_STREAM, VOCAB_SIZE, AdditionStream, bucket_examples, collate
from tape.data.scrolls import collate as scrolls_collate
from tape.data.text import spread_blocks


def stream_position(trainer: L.Trainer | None) -> tuple[int, int, int]:
    """(first batch index, rank, world size) for a seeded training stream. On resume Lightning
    restores global_step before asking for the loader, so the stream continues at the first
    batch the interrupted run had not trained on."""
    if trainer is None:
        return 0, 0, 1
    return trainer.global_step * trainer.accumulate_grad_batches, trainer.global_rank, trainer.world_size


def loader(stream: IterableDataset, trainer: L.Trainer | None = None) -> DataLoader:
    """A training stream's loader: whole batches, made in the main process (a seeded stream
    resumes exactly), grouped into the trainer's optimizer steps (``StepWindows``); pinned on a
    GPU machine so the copy to the device does not block."""
    accumulate = trainer.accumulate_grad_batches if trainer is not None else 1
    return DataLoader(StepWindows(stream, accumulate), batch_size=None, num_workers=0,
                      pin_memory=torch.cuda.is_available())


def scored_targets(labels: Tensor) -> int:
    """Targets a batch's next-token loss scores: labels (B, N), position t predicting t + 1."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


class StepWindows(IterableDataset):
    """A training stream's batches read ``accumulate`` at a time (one optimizer step's; streams
    start at a step's first batch), each carrying ``step_scored``, the scored targets of its
    whole step on this rank (a 0-dim tensor: it reaches the device with the batch), and
    ``step_first`` / ``step_last``. The loss divides by the step's count, so accumulated batches
    weigh as one large batch (tape/lightning/module.py)."""

    def __init__(self, stream: IterableDataset, accumulate: int = 1) -> None:
        super().__init__()
        self.stream, self.accumulate = stream, accumulate

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        batches = iter(self.stream)
        while window := list(itertools.islice(batches, self.accumulate)):
            scored = torch.tensor(sum(scored_targets(b["labels"]) for b in window))
            for i, batch in enumerate(window):
                yield {**batch, "step_scored": scored, "step_first": i == 0, "step_last": i == len(window) - 1}


class AdditionDataModule(L.LightningDataModule):
    """Training batches come from ``AdditionStream`` (batch k is a function of seed, rank, k);
    validation is ``val_examples`` in-distribution sums drawn from a separate stream."""

    vocab_size = VOCAB_SIZE

    def __init__(
        self, max_digits: int, batch_size: int, val_examples: int, seed: int,
        val_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.max_digits, self.batch_size, self.seed = max_digits, batch_size, seed
        self.val_examples = val_examples
        self.val_batch_size = val_batch_size or batch_size

    def train_dataloader(self) -> DataLoader:
        start, rank, _ = stream_position(self.trainer)
        stream = AdditionStream(self.seed, self.max_digits, self.batch_size, rank=rank, start=start)
        return loader(stream, self.trainer)

    def val_dataloader(self) -> DataLoader:
        examples = bucket_examples(self.seed, self.val_examples, self.max_digits, stream=VAL_STREAM)
        return DataLoader(examples, batch_size=self.val_batch_size, shuffle=False, collate_fn=collate)


class TextDataModule(L.LightningDataModule):
    """Causal-LM pretraining on packed text. ``make_stream(rank, world_size, start)`` gives the
    training stream from batch ``start`` on (seeded random windows of local tokens, or a streamed
    corpus); validation is ``val_blocks`` fixed, disjoint windows of ``val_tokens``."""

    def __init__(self, make_stream: Callable[[int, int, int], IterableDataset], val_tokens: np.ndarray,
                 seq_len: int, batch_size: int, val_blocks: int, vocab_size: int) -> None:
        super().__init__()
        self.make_stream, self.val_tokens = make_stream, val_tokens
        self.seq_len, self.batch_size, self.val_blocks = seq_len, batch_size, val_blocks
        self.vocab_size = vocab_size

    def train_dataloader(self) -> DataLoader:
        start, rank, world = stream_position(self.trainer)
        return loader(self.make_stream(rank, world, start), self.trainer)

    def val_dataloader(self) -> DataLoader:
        blocks = spread_blocks(self.val_tokens, self.seq_len, self.val_blocks)  # (M, L)
        rows = [{"input_ids": b, "labels": b} for b in blocks]
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False)


def collate_rows(rows: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, Tensor]:
    """Fine-tuning rows -> {input_ids, labels} (B, N); the padding is on the right, after every
    scored token, so causal attention needs no mask."""
    return {k: v for k, v in scrolls_collate(rows).items() if k != "attention_mask"}


class RowSampleStream(IterableDataset):
    """Endless batches drawn with replacement from fixed, equal-length rows (fine-tuning sets);
    batch k of rank r depends on (seed, r, k) only, so resume is exact."""

    def __init__(self, rows: Sequence[Mapping[str, Sequence[int]]], batch_size: int, seed: int,
                 rank: int = 0, start: int = 0) -> None:
        super().__init__()
        self.rows, self.batch_size, self.seed, self.rank, self.start = rows, batch_size, seed, rank, start

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            rng = np.random.default_rng([self.seed, self.rank, index])
            picks = rng.integers(0, len(self.rows), size=self.batch_size)
            batch = collate_rows([self.rows[i] for i in picks])
            yield {**batch, "batch_index": torch.tensor(index)}
            index += 1


class FineTuneDataModule(L.LightningDataModule):
    """Supervised fine-tuning on pre-tokenised rows ({input_ids, labels, attention_mask}, one
    length): seeded sampling for training, the validation rows in order."""

    def __init__(self, train_rows: Sequence[Mapping[str, Sequence[int]]],
                 val_rows: Sequence[Mapping[str, Sequence[int]]], batch_size: int, seed: int,
                 vocab_size: int) -> None:
        super().__init__()
        if not train_rows or not val_rows:
            raise ValueError(f"fine-tuning needs rows: {len(train_rows)} train, {len(val_rows)} validation")
        self.train_rows, self.val_rows = train_rows, val_rows
        self.batch_size, self.seed, self.vocab_size = batch_size, seed, vocab_size

    def train_dataloader(self) -> DataLoader:
        start, rank, _ = stream_position(self.trainer)
        stream = RowSampleStream(self.train_rows, self.batch_size, self.seed, rank=rank, start=start)
        return loader(stream, self.trainer)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_rows, batch_size=self.batch_size, shuffle=False,
                          collate_fn=collate_rows)


class IndexedBatchStream(IterableDataset):
    """Batches ``batch_fn(k * world_size + rank)`` for k = start, start + 1, ...: each rank reads
    its own share of one seeded stream, and one process reads it in order."""

    def __init__(self, batch_fn: Callable[[int], dict[str, Tensor]], rank: int = 0, world_size: int = 1,
                 start: int = 0) -> None:
        super().__init__()
        self.batch_fn, self.rank, self.world_size, self.start = batch_fn, rank, world_size, start

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            yield self.batch_fn(index * self.world_size + self.rank)
            index += 1


class IndexedBatchDataModule(L.LightningDataModule):
    """Training only, from a function of the batch index (context extension's mixed text and
    passkey batches); on resume the stream continues at the first batch not yet trained on."""

    def __init__(self, batch_fn: Callable[[int], dict[str, Tensor]]) -> None:
        super().__init__()
        self.batch_fn = batch_fn

    def train_dataloader(self) -> DataLoader:
        start, rank, world = stream_position(self.trainer)
        return loader(IndexedBatchStream(self.batch_fn, rank, world, start), self.trainer)
