"""Tokenised text corpora on disk and the packed-block training stream of causal-LM pretraining.

:func:`prepare_text_data` trains the BPE on the training documents of ``books`` and writes, once,
``<data_dir>/books-bpe<vocab>-h<pct>/``: ``tokenizer.json``, ``books_train.bin``,
``books_heldout.bin``, ``stdlib.bin`` and ``meta.json``. Token files are flat uint16 arrays
(LongLoRA's ``.bin`` format, read by ``tape.metrics.perplexity.load_token_file``), with BOS in
front of every document and no EOS (tape-spec D.2's C4 pretraining). The directory is built
under a temporary name and renamed, so concurrent sweep jobs never see half a directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from tape.data.corpus import Document, load_corpus, split_documents
from tape.data.tokenizer import BPETokenizer, train_bpe

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""2: a document's literal "<s>", "</s>" or "<pad>" is encoded as text (1: as the special id).
A directory of an older format is re-encoded in place with its own tokenizer.json."""


@dataclass(frozen=True)
class TextData:
    """Paths of one prepared vocabulary and its token files."""

    root: Path

    @property
    def tokenizer_path(self) -> Path:
        return self.root / "tokenizer.json"

    def tokens_path(self, split: str) -> Path:
        """``books_train``, ``books_heldout`` or ``stdlib``."""
        path = self.root / f"{split}.bin"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; choose one of {sorted(p.stem for p in self.root.glob('*.bin'))}")
        return path

    def tokenizer(self) -> BPETokenizer:
        return BPETokenizer.load(self.tokenizer_path)

    def tokens(self, split: str) -> np.memmap:
        return np.memmap(self.tokens_path(split), dtype=np.uint16, mode="r")


def write_token_file(docs: Sequence[Document], tokenizer: BPETokenizer, path: Path) -> int:
    """BOS + tokens of every document, concatenated, as uint16. Returns the token count."""
    if tokenizer.vocab_size > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"vocab_size={tokenizer.vocab_size} does not fit uint16 token files")
    ids = [np.asarray([tokenizer.bos_id, *row], dtype=np.uint16)
           for row in tokenizer.encode_batch([d.text for d in docs])]
    flat = np.concatenate(ids)
    flat.tofile(path)
    return int(flat.size)


def prepare_text_data(
    data_dir: str | os.PathLike, vocab_size: int = 4096, heldout_percent: int = 10,
    load: Callable[[str], list[Document]] = load_corpus,
) -> TextData:
    """Build (or reuse) the tokenizer and token files; see the module docstring. ``load`` maps a
    corpus name to its documents (tests pass small invented corpora)."""
    root = Path(data_dir) / f"books-bpe{vocab_size}-h{heldout_percent}"
    if (root / "meta.json").is_file():
        reencode_if_older(TextData(root), load)
        return TextData(root)
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    train, heldout = split_documents(load("books"), heldout_percent)
    tokenizer = train_bpe((d.text for d in train), vocab_size)
    tokenizer.save(tmp / "tokenizer.json")
    meta = {"format": FORMAT_VERSION, "vocab_size": vocab_size, "heldout_percent": heldout_percent,
            "splits": {}}
    for split, docs in (("books_train", train), ("books_heldout", heldout),
                        ("stdlib", load("stdlib"))):
        n = write_token_file(docs, tokenizer, tmp / f"{split}.bin")
        meta["splits"][split] = {"documents": [d.name for d in docs], "tokens": n}
    meta["build_seconds"] = round(time.perf_counter() - t0, 1)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    try:
        tmp.rename(root)
    except OSError:  # another process finished first: use its copy (same inputs, same bytes)
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / "meta.json").is_file():
            raise
    return TextData(root)


def reencode_if_older(data: TextData, load: Callable[[str], list[Document]] = load_corpus) -> None:
    """Rewrite the token files of a directory built by an older ``FORMAT_VERSION`` from the same
    documents with its own tokenizer.json: the vocabulary, and every model trained on it, stays
    valid. Each file (then meta.json) is replaced whole, never left half written."""
    meta_path = data.root / "meta.json"
    meta = json.loads(meta_path.read_text())
    if meta.get("format", 1) >= FORMAT_VERSION:
        return
    log.warning("re-encoding %s (data format %s -> %s: literal special-token text stays text)",
                data.root, meta.get("format", 1), FORMAT_VERSION)
    tokenizer = data.tokenizer()
    corpora: dict[str, dict[str, Document]] = {}
    for split, info in meta["splits"].items():
        corpus = "stdlib" if split == "stdlib" else "books"
        docs = corpora.setdefault(corpus, {d.name: d for d in load(corpus)})
        missing = [name for name in info["documents"] if name not in docs]
        if missing:
            raise RuntimeError(f"{data.root} has data format {meta.get('format', 1)} and must be re-encoded, "
                               f"but the installed {corpus!r} corpus lacks its documents {missing[:3]}: "
                               "delete that directory to rebuild it")
        tmp = data.root / f"{split}.bin.tmp-{os.getpid()}"
        info["tokens"] = write_token_file([docs[name] for name in info["documents"]], tokenizer, tmp)
        os.replace(tmp, data.root / f"{split}.bin")
    meta["format"] = FORMAT_VERSION
    tmp = meta_path.with_name(f"meta.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, meta_path)


def random_blocks(tokens: np.ndarray, block_len: int, count: int, rng: np.random.Generator) -> Tensor:
    """``count`` windows of ``block_len`` tokens at uniformly random offsets: (count, block_len)."""
    if len(tokens) < block_len:
        raise ValueError(f"{len(tokens)} tokens cannot fill a block of {block_len}")
    starts = rng.integers(0, len(tokens) - block_len + 1, size=count)
    return torch.from_numpy(np.stack([np.asarray(tokens[s : s + block_len], dtype=np.int64) for s in starts]))


def spread_blocks(tokens: np.ndarray, block_len: int, count: int) -> Tensor:
    """``count`` non-overlapping windows spread evenly over the stream (a fixed validation set)."""
    n_blocks = len(tokens) // block_len
    if n_blocks < 1:
        raise ValueError(f"{len(tokens)} tokens cannot fill a block of {block_len}")
    picks = np.linspace(0, n_blocks - 1, min(count, n_blocks)).round().astype(int)
    return torch.from_numpy(np.stack([np.asarray(tokens[i * block_len : (i + 1) * block_len], dtype=np.int64)
                                      for i in picks]))


class TokenBlockStream(IterableDataset):
    """Endless batches of ``block_len``-token windows; batch k of rank r depends on (seed, r, k)
    only, so a resumed run sees exactly what an uninterrupted one would. Every token is a label."""

    def __init__(self, tokens: np.ndarray, block_len: int, batch_size: int, seed: int,
                 rank: int = 0, start: int = 0) -> None:
        super().__init__()
        self.tokens, self.block_len, self.batch_size = tokens, block_len, batch_size
        self.seed, self.rank, self.start = seed, rank, start

    def batch(self, index: int) -> dict[str, Tensor]:
        rng = np.random.default_rng([self.seed, self.rank, index])
        ids = random_blocks(self.tokens, self.block_len, self.batch_size, rng)  # (B, L)
        return {"input_ids": ids, "labels": ids.clone(), "batch_index": torch.tensor(index)}

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        index = self.start
        while True:
            yield self.batch(index)
            index += 1
