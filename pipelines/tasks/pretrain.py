"""Causal-LM pretraining from scratch (tape-spec D.2), with held-out perplexity at 1x, 2x, 4x
the training length so length extrapolation shows before any fine-tuning.

Two text sources (``task.corpus``):
- ``books`` (cpu/smoke): the local books corpus with a BPE trained on it (tape/data/text.py),
  built once under ``task.data_dir``; held-out = whole held-out books.
- ``stream`` (paper): C4 ``en`` streamed with ``datasets`` from ``task.text_source`` (hub or
  local shards), the Llama tokenizer from ``task.tokenizer_path``; held-out = the first
  ``task.heldout_tokens`` tokens of its validation split.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from omegaconf import DictConfig

from pipelines.config_checks import require_int, require_packages
from pipelines.errors import PipelineConfigError
from pipelines.models import check_position_range, model_config
from pipelines.result_files import write_csv
from pipelines.tasks import register
from pipelines.tasks.base import Task

if TYPE_CHECKING:  # torch-based; imported where used, after the config checks
    from tape.data.text import TextData, TokenBlockStream
    from tape.lightning import TextDataModule

CORPORA = ("books", "stream")
BUILD_NOTICE_S = 2.0  # data preparation longer than this announces itself
log = logging.getLogger("pipelines.pretrain")


def validate(cfg: DictConfig) -> None:
    """Impossible settings, before any data is built or any step trained."""
    t = cfg.task
    if t.corpus not in CORPORA:
        raise PipelineConfigError(f"task.corpus={t.corpus!r}; choose one of {list(CORPORA)}")
    ints = ("seq_len", "batch_size", "val_blocks", "eval_stride")
    if t.eval_max_windows is not None:  # null scores every window
        ints = (*ints, "eval_max_windows")
    require_int(cfg, *(f"task.{key}" for key in (*ints, "vocab_size")))
    for key in ints:
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if int(t.seq_len) < 2:
        raise PipelineConfigError("task.seq_len must be >= 2 (a block predicts its next tokens)")
    mults = list(t.eval_multipliers)
    if not mults or any(int(m) < 1 for m in mults):
        raise PipelineConfigError(f"task.eval_multipliers={mults} must be a non-empty list of ints >= 1")
    mc = model_config(cfg)
    if mc.vocab_size != int(t.vocab_size):
        raise PipelineConfigError(
            f"model.vocab_size={mc.vocab_size} differs from the tokenizer's task.vocab_size="
            f"{t.vocab_size}; leave model.vocab_size at ${{task.vocab_size}}"
        )
    check_position_range(mc, *positions_needed(t))
    if t.corpus == "stream":
        require_packages("task.corpus=stream", "datasets")


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest perplexity window, and the key that sets it."""
    return max(int(m) for m in task_cfg.eval_multipliers) * int(task_cfg.seq_len), "task.eval_multipliers"


# ---------------------------------------------------------------------------- text sources
def _books(t: DictConfig) -> TextData:
    from tape.data.text import prepare_text_data

    # Said only when it takes a while (the first build: about a minute on 2 cores).
    notice = threading.Timer(BUILD_NOTICE_S, log.info, args=(
        "books corpus: building the tokenizer and token files under task.data_dir=%s (once; "
        "about a minute on 2 cores, reused after) ...", t.data_dir))
    t0 = time.perf_counter()
    notice.start()
    try:
        data = prepare_text_data(t.data_dir, int(t.vocab_size), int(t.heldout_percent))
    except FileNotFoundError as err:
        raise PipelineConfigError(f"task.corpus=books: {err}") from err
    finally:
        notice.cancel()
    if time.perf_counter() - t0 > BUILD_NOTICE_S:
        log.info("books corpus ready in %.1f s", time.perf_counter() - t0)
    return data


def tokenizer_dir(t: DictConfig) -> Path:
    """``task.tokenizer_path``, a directory, or an error saying how to get Llama-2's."""
    path = Path(str(t.tokenizer_path)) if t.get("tokenizer_path") else None
    if path is None or not path.is_dir():
        raise PipelineConfigError(
            f"task.corpus=stream needs task.tokenizer_path (got {path}): a local Hugging Face "
            "tokenizer directory; the paper used Llama-2's (hf download "
            "meta-llama/Llama-2-7b-hf tokenizer.model tokenizer.json tokenizer_config.json "
            "--local-dir <dir>, after accepting the licence on the model's page)"
        )
    return path


def hf_tokenizer(t: DictConfig) -> Any:
    """The Hugging Face tokenizer of a streamed corpus (``task.tokenizer_path``), checked."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir(t)))
    if len(tok) > int(t.vocab_size):
        raise PipelineConfigError(f"the tokenizer at task.tokenizer_path has {len(tok)} tokens, "
                                  f"more than task.vocab_size={t.vocab_size}")
    return tok


def _stream_heldout(t: DictConfig, encode: Callable[[str], Sequence[int]], bos_id: int | None) -> np.ndarray:
    from tape.data.streaming import open_text_stream

    need, parts = int(t.heldout_tokens), []
    for row in open_text_stream(str(t.text_source), split="validation"):
        parts.append(([bos_id] if bos_id is not None else []) + list(encode(row["text"])))
        need -= len(parts[-1])
        if need <= 0:
            break
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


def heldout_tokens(t: DictConfig) -> np.ndarray:
    """The held-out token stream that validation and the perplexity evaluation read."""
    if t.corpus == "books":
        return _books(t).tokens("books_heldout")
    tok = hf_tokenizer(t)
    return _stream_heldout(t, partial(tok.encode, add_special_tokens=False), tok.bos_token_id)


def bos_token(t: DictConfig) -> int | None:
    """The [BOS] id that starts every document of the run's text (books BPE or task.tokenizer_path)."""
    if t.corpus == "books":
        return _books(t).tokenizer().bos_id
    return hf_tokenizer(t).bos_token_id


def trained_tokenizer(t: DictConfig) -> str:
    """The tokenizer of a run with text settings ``t``: the books BPE or task.tokenizer_path."""
    from pipelines.run_source import run_books

    if t.corpus == "books":
        return str(run_books(t.data_dir, t.vocab_size, t.heldout_percent).tokenizer_path)
    return str(t.tokenizer_path)


def heldout_files(t: DictConfig, out_dir: Path) -> dict[str, str]:
    """The held-out token file (uint16) of a run with text settings ``t``; a streamed corpus's
    held-out tokens are written once into ``out_dir``."""
    from pipelines.run_source import run_books

    if t.corpus == "books":
        return {"heldout": str(run_books(t.data_dir, t.vocab_size, t.heldout_percent).tokens_path("books_heldout"))}
    tokens = heldout_tokens(t)
    if tokens.max() > np.iinfo(np.uint16).max:
        raise PipelineConfigError("the run's vocabulary does not fit uint16 token files; "
                                  "pass +task.corpora.<name>=<token file> and task.token_dtype")
    path = out_dir / "heldout.bin"
    tokens.astype(np.uint16).tofile(path)
    return {"heldout": str(path)}


def datamodule(cfg: DictConfig) -> TextDataModule:
    from tape.data.text import TokenBlockStream
    from tape.lightning import TextDataModule

    t = cfg.task
    seq_len, batch_size = int(t.seq_len), int(t.batch_size)
    common = dict(seq_len=seq_len, batch_size=batch_size, val_blocks=int(t.val_blocks),
                  vocab_size=int(t.vocab_size))
    if t.corpus == "books":
        data = _books(t)
        train = data.tokens("books_train")

        def blocks(rank: int, world: int, start: int) -> TokenBlockStream:
            return TokenBlockStream(train, seq_len, batch_size, cfg.seed, rank=rank, start=start)

        return TextDataModule(blocks, data.tokens("books_heldout"), **common)
    from tape.data.streaming import PackedTextStream, check_text_source, open_text_stream

    tokenizer_dir(t)
    try:  # every split readable, or one message now (not after the hub client's retries)
        check_text_source(str(t.text_source))
    except FileNotFoundError as err:
        raise PipelineConfigError(str(err)) from None
    tok = hf_tokenizer(t)
    encode = partial(tok.encode, add_special_tokens=False)
    source = open_text_stream(str(t.text_source), split="train")  # fails now, before training

    def packed(rank: int, world: int, start: int) -> PackedTextStream:
        return PackedTextStream(source, encode, tok.bos_token_id, seq_len, batch_size,
                                seed=cfg.seed, rank=rank, world_size=world, start=start)

    return TextDataModule(packed, _stream_heldout(t, encode, tok.bos_token_id), **common)


# ---------------------------------------------------------------------------- evaluation
def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Held-out perplexity at each multiple of the training length -> perplexity.csv + metrics."""
    from tape.metrics.perplexity import sliding_window_perplexity

    t0 = time.perf_counter()
    tokens = heldout_tokens(task_cfg)
    metrics: dict[str, float] = {}
    rows = []
    for mult in task_cfg.eval_multipliers:
        length = int(mult) * int(task_cfg.seq_len)
        out = sliding_window_perplexity(
            model, tokens, length, stride=int(task_cfg.eval_stride),
            batch_size=max(1, int(task_cfg.eval_batch_tokens) // length),
            max_windows=None if task_cfg.eval_max_windows is None else int(task_cfg.eval_max_windows),
        )
        metrics[f"ppl_{mult}x"] = out["perplexity"]
        rows.append({"multiplier": int(mult), "length": length, **out})
    write_csv(rows, list(rows[0]), out_dir / "perplexity.csv")
    ids = _heldout_blocks(model, tokens, int(task_cfg.seq_len))
    metrics.update(_e_movement(model, ids))
    metrics.update(_shift_robustness(model, ids, bos_token(task_cfg)))
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


def _heldout_blocks(model: Any, tokens: Any, seq_len: int, blocks: int = 8) -> Any:
    """The first ``blocks`` held-out blocks of the training length as ids (B, seq_len) on the
    model's device, for the per-layer measurements; None without a block or a torch model."""
    import torch

    data = np.asarray(tokens, dtype=np.int64)
    n = min(blocks, len(data) // seq_len)
    if n == 0 or not hasattr(model, "parameters"):
        return None
    return torch.as_tensor(data[: n * seq_len].reshape(n, seq_len)).to(next(model.parameters()).device)


def _e_movement(model: Any, ids: Any) -> dict[str, float]:
    """TAPE only: how far E moved from its RoPE table per layer on held-out blocks ``ids``
    (tape/metrics/e_movement.py; claim C2 reports it)."""
    from tape.metrics.e_movement import e_movement

    return {} if ids is None else e_movement(model, ids)


def _shift_robustness(model: Any, ids: Any, bos_id: int | None) -> dict[str, float]:
    """Table 8's measurements on held-out blocks ``ids``: how far each layer's attention and
    positional dot products move with three [BOS] tokens prepended or the position ids started
    at 3 (tape/metrics/shift_robustness.py). Our decoder only."""
    from tape.metrics.shift_robustness import shift_robustness
    from tape.model import DecoderLM

    if ids is None or bos_id is None or not isinstance(model, DecoderLM):
        return {}
    return shift_robustness(model, ids, bos_id)


@register("pretrain")
class Pretrain(Task):
    """From-scratch language-model pretraining, perplexity by evaluation length."""

    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)

    def trained_tokenizer(self, run_cfg: DictConfig) -> str:
        return trained_tokenizer(run_cfg.task)

    def heldout_files(self, run_cfg: DictConfig, out_dir: Path) -> dict[str, str]:
        return heldout_files(run_cfg.task, out_dir)
