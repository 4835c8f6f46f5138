"""The flip-flop data module: seeded training stream, fixed in-distribution validation set."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from tape.data.flipflop import VAL_STREAM, VOCAB_SIZE, FlipFlopStream, generate, labels_for
from tape.lightning.datamodule import loader, stream_position


class FlipFlopDataModule(L.LightningDataModule):
    """Training batches from ``FlipFlopStream`` (a function of seed, rank and batch index: the
    same order for every PE); validation scores the read bits of ``val_sequences`` sequences."""

    vocab_size = VOCAB_SIZE

    def __init__(self, seq_len: int, batch_size: int, p_ignore: float, val_sequences: int,
                 seed: int, loss_on: str = "reads") -> None:
        super().__init__()
        self.seq_len, self.batch_size, self.p_ignore = seq_len, batch_size, p_ignore
        self.val_sequences, self.seed, self.loss_on = val_sequences, seed, loss_on

    def train_dataloader(self) -> DataLoader:
        start, rank, _ = stream_position(self.trainer)
        return loader(FlipFlopStream(self.seed, self.seq_len, self.batch_size, self.p_ignore,
                                     self.loss_on, rank=rank, start=start), self.trainer)

    def val_dataloader(self) -> DataLoader:
        rng = np.random.default_rng([self.seed, VAL_STREAM])
        ids = torch.from_numpy(generate(rng, self.val_sequences, self.seq_len, self.p_ignore))
        rows = [{"input_ids": x, "labels": labels_for(x, "reads")} for x in ids]
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False)
