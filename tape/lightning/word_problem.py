"""The group word problem's data module: seeded training stream, fixed in-distribution
validation set (every prefix product scored)."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader

from tape.data.word_problem import WordProblemStream, get_group, training_batch, val_set
from tape.lightning.datamodule import loader, stream_position


class WordProblemDataModule(L.LightningDataModule):
    """Training batches from ``WordProblemStream`` (a function of seed, rank and batch index: the
    same order for every PE); validation scores every prefix product of ``val_sequences`` words,
    so val/token_accuracy and val/exact_match are the token and sequence accuracy at seq_len."""

    def __init__(self, group: str, seq_len: int, batch_size: int, val_sequences: int, seed: int,
                 bos: bool = True) -> None:
        super().__init__()
        self.group = get_group(group)
        self.vocab_size = self.group.vocab_size
        self.seq_len, self.batch_size, self.val_sequences = seq_len, batch_size, val_sequences
        self.seed, self.bos = seed, bos

    def train_dataloader(self) -> DataLoader:
        start, rank, _ = stream_position(self.trainer)
        return loader(WordProblemStream(self.seed, self.group.name, self.seq_len, self.batch_size,
                                        self.bos, rank=rank, start=start), self.trainer)

    def val_dataloader(self) -> DataLoader:
        tokens, targets = val_set(self.seed, self.group, self.seq_len, self.val_sequences)
        batch = training_batch(self.group, tokens, targets, self.bos)
        rows = [{"input_ids": x, "labels": y} for x, y in zip(batch["input_ids"], batch["labels"])]
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False)
