"""Data of the context-extension experiment: the tokenizer, the training stream (local books +
passkey samples, or the RedPajama sample from the hub) and the perplexity token files.

Everything that can be missing is checked by :func:`check_inputs` before anything trains, and
the error names the config key and how to get the data or weights.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from pipelines.config_checks import require_packages
from pipelines.errors import PipelineConfigError
from tape.data.passkey import passkey_example
from tape.data.streaming import pack_blocks
from tape.optional import require

LLAMA_WEIGHTS_HINT = (
    "download Llama-2-7B in Hugging Face format (accept Meta's licence at "
    "https://huggingface.co/meta-llama/Llama-2-7b-hf, then `hf download "
    "meta-llama/Llama-2-7b-hf --local-dir /path/to/Llama-2-7b-hf`) and pass "
    "model.pretrained_path=/path/to/Llama-2-7b-hf"
)
LONGLORA_BIN_HINT = (
    "LongLoRA's tokenised test sets (uint16 Llama-2 tokens: pg19/test.bin and "
    "proof-pile/test_sampled_data.bin, linked from https://github.com/dvlab-research/LongLoRA), "
    "or your own: np.array(ids, dtype=np.uint16).tofile(path)"
)


@dataclass
class ExtensionData:
    """What training and evaluation read: text -> ids, the pad id, token streams."""

    encode: Callable[[str], list[int]]
    pad_id: int
    vocab_size: int
    train_rows: Callable[[int, int, int, np.random.Generator], Tensor]  # (count, seq_len) text rows
    eval_tokens: dict[str, np.ndarray]  # corpus name -> flat token ids
    bos_id: int | None = None  # the tokenizer's BOS (passkey prompts start with it)


# ---------------------------------------------------------------------------- checks
def check_inputs(cfg: DictConfig) -> None:
    """Fail at once, naming the key, when weights or data files the config needs are missing."""
    path = cfg.model.pretrained_path
    if cfg.data.source == "hub" and not path:
        raise PipelineConfigError(f"data.source=hub tokenises with the pretrained model's tokenizer: "
                                  f"model.pretrained_path is not set; {LLAMA_WEIGHTS_HINT}")
    if path and not (Path(path) / "config.json").is_file():
        raise PipelineConfigError(f"model.pretrained_path={path}: no Hugging Face model there "
                                  f"(config.json missing); {LLAMA_WEIGHTS_HINT}")
    if cfg.data.source == "books":
        if path:
            _check_books_vocabulary(cfg, Path(path))
        return
    if cfg.data.source != "hub":
        raise PipelineConfigError(f"data.source={cfg.data.source}: choose books or hub")
    for name, file in cfg.data.eval_files.items():
        if not file or not Path(str(file)).is_file():
            raise PipelineConfigError(f"data.eval_files.{name}={file}: token file not found; set "
                                      f"data.eval_files.{name}=<path to a .bin file>: {LONGLORA_BIN_HINT}")
    require_packages("data.source=hub", "datasets")


def _check_books_vocabulary(cfg: DictConfig, path: Path) -> None:
    """The books source feeds ids of its own BPE: a pretrained model must have that vocabulary."""
    import json

    vocab = json.loads((path / "config.json").read_text()).get("vocab_size")
    if vocab is not None and vocab != int(cfg.data.vocab_size):
        raise PipelineConfigError(
            f"model.pretrained_path={path} has a vocabulary of {vocab} tokens, but data.source=books "
            f"feeds it ids of the books BPE (data.vocab_size={cfg.data.vocab_size}), not of its own "
            "tokenizer: extend it on text its tokenizer reads (data.source=hub with data.hub_dataset="
            "<the hub's name or a local copy> and data.eval_files.<name>=<token files>)")


# ---------------------------------------------------------------------------- sources
def _books(cfg: DictConfig) -> ExtensionData:
    from tape.data.corpus import CorpusUnavailable
    from tape.data.text import prepare_text_data, random_blocks

    try:
        data = prepare_text_data(cfg.data.data_dir, cfg.data.vocab_size)
    except CorpusUnavailable as err:
        raise PipelineConfigError(f"data.source=books: {err}") from None
    tok = data.tokenizer()
    train = data.tokens("books_train")
    evals = {}
    for name, split in cfg.data.eval_files.items():
        try:
            evals[name] = data.tokens(str(split))
        except FileNotFoundError as err:
            raise PipelineConfigError(f"data.eval_files.{name}={split}: {err}") from None
    return ExtensionData(
        encode=tok.encode, pad_id=tok.pad_id, vocab_size=tok.vocab_size,
        train_rows=lambda index, count, seq_len, rng: random_blocks(train, seq_len, count, rng),
        eval_tokens=evals, bos_id=tok.bos_id,
    )


def _hub_documents(cfg: DictConfig) -> Iterator[str]:
    """Texts of the hub dataset, streamed; a clear error when the hub cannot be reached."""
    from tape.data.hub import hub_usable

    name = cfg.data.hub_dataset
    how = (f"data.hub_dataset={name} comes from the Hugging Face hub: give this machine network "
           "access (or a datasets cache holding it), or point data.hub_dataset at a local copy")
    if not Path(name).exists() and not hub_usable():  # a local copy needs no hub
        raise PipelineConfigError(f"the hub is not reachable from this machine; {how}")
    datasets = require("datasets", "data.source=hub")
    try:
        stream = datasets.load_dataset(name, split=cfg.data.hub_split, streaming=True)
    except Exception as err:  # the hub client raises many types; all mean "no data"
        raise PipelineConfigError(f"could not load {name}: {err}; {how}") from err
    return (row["text"] for row in stream)


class PackedRows:
    """Documents joined with EOS, tokenised and cut into rows of ``seq_len`` tokens, read in
    order (the paper packed RedPajama the same way): batch ``index`` gets rows
    ``index * count .. (index + 1) * count - 1`` of the stream. The rows of skipped indices
    (other ranks' batches, batches trained before a resume) are read past; an index below the
    last one read (the next stage starting at batch 0) reopens the stream, so every recipe
    trains on the same rows."""

    def __init__(self, open_docs: Callable[[], Iterator[str]], encode: Callable[[str], list[int]],
                 eos_id: int) -> None:
        self.open_docs, self.encode, self.eos_id = open_docs, encode, eos_id
        self.seq_len: int | None = None
        self.next_row = 0
        self.blocks: Iterator[list[int]] = iter(())

    def _open(self) -> None:
        docs = (self.encode(d) for d in self.open_docs())
        self.blocks, self.next_row = pack_blocks(docs, self.seq_len, None, self.eos_id), 0

    def __call__(self, index: int, count: int, seq_len: int, rng: np.random.Generator) -> Tensor:
        if self.seq_len is None:
            self.seq_len = seq_len
            self._open()
        elif seq_len != self.seq_len:
            raise ValueError(f"rows of {seq_len} tokens asked from a stream packed into {self.seq_len}")
        first = index * count
        if first < self.next_row:
            self._open()
        for _ in itertools.islice(self.blocks, first - self.next_row):
            pass
        rows = list(itertools.islice(self.blocks, count))
        self.next_row = first + len(rows)
        if len(rows) < count:
            raise RuntimeError("the training stream ran out of documents")
        return torch.tensor(rows)  # (count, seq_len)


def _hub(cfg: DictConfig) -> ExtensionData:
    from transformers import AutoTokenizer

    from tape.metrics.perplexity import load_token_file

    _hub_documents(cfg)  # fails first, and fast, without network
    tok = AutoTokenizer.from_pretrained(cfg.model.pretrained_path)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    evals = {name: load_token_file(str(path)) for name, path in cfg.data.eval_files.items()}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return ExtensionData(encode=encode, pad_id=pad, vocab_size=len(tok),
                         train_rows=PackedRows(lambda: _hub_documents(cfg), encode, tok.eos_token_id),
                         eval_tokens=evals, bos_id=tok.bos_token_id)


def load_data(cfg: DictConfig) -> ExtensionData:
    """The data of ``cfg.data.source`` (books | hub), after :func:`check_inputs`."""
    check_inputs(cfg)
    return _books(cfg) if cfg.data.source == "books" else _hub(cfg)


# ---------------------------------------------------------------------------- batches
def mixed_batches(data: ExtensionData, seq_len: int, batch_size: int, passkey_rows: int,
                  seed: int, garbage_range: tuple[int, int] = (0, 0)) -> Callable[[int], dict[str, Tensor]]:
    """Batch i: ``batch_size - passkey_rows`` text rows (every token scored) and
    ``passkey_rows`` passkey rows (filler length uniform in ``garbage_range`` characters, only
    the answer scored). Depends on (seed, i) only. Passkey rows use prompt seeds >= 2**31, so
    they never repeat an evaluation prompt (seeds 0, 1, ...)."""

    def batch(index: int) -> dict[str, Tensor]:
        rng = np.random.default_rng([seed, index])
        ids = data.train_rows(index, batch_size - passkey_rows, seq_len, rng)  # (B - P, N)
        rows_ids, rows_labels = [ids], [ids.clone()]
        for _ in range(passkey_rows):
            n_garbage = int(rng.integers(garbage_range[0], garbage_range[1] + 1))
            x, y = passkey_example(data.encode, n_garbage, int(rng.integers(2**31, 2**62)), seq_len,
                                   data.pad_id)
            rows_ids.append(x[None])
            rows_labels.append(y[None])
        passkey = torch.zeros(batch_size, dtype=torch.bool)
        passkey[batch_size - passkey_rows:] = True
        return {"input_ids": torch.cat(rows_ids), "labels": torch.cat(rows_labels), "passkey": passkey}

    return batch


def describe(data: ExtensionData) -> dict[str, Any]:
    """Sizes for metrics.json."""
    return {"vocab_size": data.vocab_size, **{f"eval_tokens_{k}": int(len(v)) for k, v in data.eval_tokens.items()}}


def trained_tokenizer(c: DictConfig) -> str:
    """The tokenizer of a context-extension run (config ``c``): the books BPE or the base model's."""
    from pipelines.run_source import run_books

    if c.data.source == "books":
        return str(run_books(c.data.data_dir, c.data.vocab_size).tokenizer_path)
    return str(c.model.pretrained_path)


def heldout_files(c: DictConfig) -> dict[str, str]:
    """The evaluation token files of a context-extension run (config ``c``), by corpus."""
    from pipelines.run_source import run_books

    if c.data.source == "books":
        books = run_books(c.data.data_dir, c.data.vocab_size)
        return {str(k): str(books.tokens_path(str(v))) for k, v in c.data.eval_files.items()}
    return {str(k): str(v) for k, v in c.data.eval_files.items()}
