"""Paper-scale pretraining text streamed with ``datasets`` (C4 ``en``, tape-spec D.2).

Documents are tokenised with BOS in front and no EOS, concatenated, and cut into ``seq_len``
blocks (labels = inputs), as the official ``train.py`` did. The stream is shuffled with a buffer
and seed ``seed + start`` (the official code reseeded with the resumed step the same way), so a
resumed run continues on a fresh shuffle rather than replaying the exact batches.

Sources: the hub dataset ``allenai/c4`` (config ``en``, streamed: nothing is downloaded up front)
or a local directory of C4 ``*.json.gz`` / ``*.jsonl`` shards with a ``text`` field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from tape.optional import require

HUB_C4 = ("allenai/c4", "en")


def pack_blocks(docs: Iterable[Sequence[int]], seq_len: int, bos_id: int | None,
                eos_id: int | None = None) -> Iterator[list[int]]:
    """Concatenate documents, each with BOS before it and EOS after it where those ids are given,
    and yield consecutive ``seq_len`` blocks; the tail that does not fill a block is dropped.
    Pretraining puts BOS before each document (as the official C4 stream); context extension
    puts EOS after each (as LongLoRA packed RedPajama)."""
    buf: list[int] = []
    for ids in docs:
        if bos_id is not None:
            buf.append(bos_id)
        buf.extend(ids)
        if eos_id is not None:
            buf.append(eos_id)
        while len(buf) >= seq_len:
            yield buf[:seq_len]
            buf = buf[seq_len:]


def _shards(path: Path, split: str) -> list[str]:
    """The ``split`` shards under a local directory: C4's c4-<split>.*.json.gz, or *.jsonl."""
    files = [p for p in sorted(path.rglob("*")) if p.name.endswith((".json.gz", ".jsonl", ".json"))]
    files = [str(p) for p in files if f"-{split}." in p.name or f"{split}." in p.name]
    if not files:
        raise FileNotFoundError(f"no {split} shards (*{split}*.json.gz / *.jsonl, as C4's "
                                f"c4-{split}.00000-of-01024.json.gz) under {path}")
    return files


def check_text_source(source: str, splits: Sequence[str] = ("train", "validation")) -> None:
    """Fail at once, with what to do, when ``open_text_stream`` could not read every split: a
    directory without a split's shards, or the hub unreachable (not after the client's retries)."""
    from tape.data.hub import hub_usable

    path = Path(source)
    try:
        if path.is_dir():
            for split in splits:
                _shards(path, split)
        elif source != HUB_C4[0]:
            raise FileNotFoundError(f"{source} is neither a directory of shards nor {HUB_C4[0]}")
        elif not hub_usable():
            raise FileNotFoundError("the Hugging Face hub is not reachable from this machine (or "
                                    "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)")
    except FileNotFoundError as err:
        raise FileNotFoundError(_unavailable(source, err)) from None


def _unavailable(source: str, err: Exception) -> str:
    return (f"pretraining text unavailable from task.text_source={source!r} ({type(err).__name__}: "
            f"{err}). Paper scale streams C4 en from the hub (task.text_source=allenai/c4, needs "
            "network) or reads local shards (task.text_source=/path/to/c4/en with *.json.gz files)")


def open_text_stream(source: str, split: str = "train") -> Any:
    """A streaming ``datasets.IterableDataset`` of documents: a local shard directory, or C4 from
    the hub when ``source`` is ``allenai/c4``. Fails with what to do when neither works."""
    path = Path(source)
    if not path.is_dir():
        check_text_source(source)  # the hub reachable, at once (a directory's shards: below)
    datasets = require("datasets", "streaming pretraining text (task.corpus=stream)")
    try:
        if path.is_dir():
            return datasets.load_dataset("json", data_files=_shards(path, split), split="train", streaming=True)
        return datasets.load_dataset(*HUB_C4, split=split, streaming=True)
    except Exception as err:  # the hub failing after all, unreadable files: one clear message
        raise FileNotFoundError(_unavailable(source, err)) from err


class PackedTextStream(IterableDataset):
    """Endless-as-the-source batches {input_ids, labels, batch_index} of packed blocks."""

    def __init__(self, dataset: Any, encode: Callable[[str], Sequence[int]], bos_id: int | None,
                 seq_len: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                 start: int = 0, shuffle_buffer: int = 10_000) -> None:
        super().__init__()
        self.dataset, self.encode, self.bos_id = dataset, encode, bos_id
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size, self.start, self.shuffle_buffer = rank, world_size, start, shuffle_buffer

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        data = self.dataset.shuffle(seed=self.seed + self.start, buffer_size=self.shuffle_buffer)
        texts = (row["text"] for i, row in enumerate(data) if i % self.world_size == self.rank)
        blocks = pack_blocks((self.encode(t) for t in texts), self.seq_len, self.bos_id)
        index, rows = self.start, []
        for block in blocks:
            rows.append(block)
            if len(rows) == self.batch_size:
                ids = torch.tensor(rows)  # (B, L)
                yield {"input_ids": ids, "labels": ids.clone(), "batch_index": torch.tensor(index)}
                index, rows = index + 1, []
