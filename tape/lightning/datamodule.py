"""AdditionDataModule: the endless seeded training stream and a fixed validation set."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader

from tape.data.addition import VAL_STREAM, VOCAB_SIZE, AdditionStream, bucket_examples, collate


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
