"""Data modules: addition (seeded sums), packed local text and streamed text (pretraining)."""

from __future__ import annotations

from typing import Any, Callable

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from tape.data.addition import VAL_STREAM, VOCAB_SIZE, AdditionStream, bucket_examples, collate
from tape.data.text import TokenBlockStream, spread_blocks


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
        trainer = self.trainer
        # On resume Lightning restores global_step before asking for this loader, so the stream
        # continues at the first batch the interrupted run had not trained on.
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        rank = trainer.global_rank if trainer else 0
        stream = AdditionStream(self.seed, self.max_digits, self.batch_size, rank=rank, start=start)
        return DataLoader(stream, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        examples = bucket_examples(self.seed, self.val_examples, self.max_digits, stream=VAL_STREAM)
        return DataLoader(examples, batch_size=self.val_batch_size, shuffle=False, collate_fn=collate)


class TextDataModule(L.LightningDataModule):
    """Causal-LM pretraining on packed text: training batches are seeded random windows of
    ``seq_len`` tokens from ``train_tokens`` (batch k is a function of seed, rank, k, so resume is
    exact); validation is ``val_blocks`` fixed, disjoint windows of ``val_tokens``."""

    def __init__(self, train_tokens: np.ndarray, val_tokens: np.ndarray, seq_len: int,
                 batch_size: int, val_blocks: int, seed: int, vocab_size: int) -> None:
        super().__init__()
        self.train_tokens, self.val_tokens = train_tokens, val_tokens
        self.seq_len, self.batch_size, self.val_blocks = seq_len, batch_size, val_blocks
        self.seed, self.vocab_size = seed, vocab_size

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        rank = trainer.global_rank if trainer else 0
        stream = TokenBlockStream(self.train_tokens, self.seq_len, self.batch_size, self.seed,
                                  rank=rank, start=start)
        return DataLoader(stream, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        blocks = spread_blocks(self.val_tokens, self.seq_len, self.val_blocks)  # (M, L)
        rows = [{"input_ids": b, "labels": b} for b in blocks]
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False)


class StreamTextDataModule(L.LightningDataModule):
    """Paper-scale pretraining: packed blocks from a streamed corpus (``PackedTextStream``);
    validation is fixed blocks of held-out tokens, as in :class:`TextDataModule`."""

    def __init__(self, make_stream: Callable[[int, int, int], Any], val_tokens: np.ndarray,
                 seq_len: int, batch_size: int, val_blocks: int, vocab_size: int) -> None:
        super().__init__()
        self.make_stream, self.val_tokens = make_stream, val_tokens
        self.seq_len, self.batch_size, self.val_blocks = seq_len, batch_size, val_blocks
        self.vocab_size = vocab_size

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        return DataLoader(self.make_stream(rank, world, start), batch_size=None, num_workers=0)

    val_dataloader = TextDataModule.val_dataloader
