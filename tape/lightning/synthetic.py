"""The data module of the variable-length synthetic tasks (parity with a scratchpad, MQAR): a
seeded training stream and a fixed in-distribution validation set, both from a batch function."""

from __future__ import annotations

from typing import Callable

import lightning as L
import numpy as np
from torch import Tensor
from torch.utils.data import DataLoader

from tape.data.synthetic import SeededBatches, as_rows
from tape.lightning.datamodule import loader, stream_position


class SyntheticDataModule(L.LightningDataModule):
    """Training batches ``make(rng, batch_size)`` from ``SeededBatches`` (a function of seed,
    rank and batch index: the same order for every PE); validation is ``make(rng, val_sequences)``
    once, from the validation stream, so val/token_accuracy and val/exact_match cover the scored
    tokens of in-distribution sequences."""

    def __init__(self, make: Callable[[np.random.Generator, int], dict[str, Tensor]],
                 val_batch: Callable[[], dict[str, Tensor]], batch_size: int, seed: int,
                 vocab_size: int) -> None:
        super().__init__()
        self.make, self.val_batch, self.batch_size, self.seed = make, val_batch, batch_size, seed
        self.vocab_size = vocab_size

    def train_dataloader(self) -> DataLoader:
        start, rank, _ = stream_position(self.trainer)
        return loader(SeededBatches(lambda rng: self.make(rng, self.batch_size), self.seed,
                                    rank=rank, start=start), self.trainer)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(as_rows(self.val_batch()), batch_size=self.batch_size, shuffle=False)
