"""Perplexity with LongLoRA's protocol (tape-spec D.3, the paper's Table 2) as an evaluation task.

On any finished run: ``python -m pipelines.evaluate run_dir=runs/... task=perplexity`` (the
run's held-out text by default); from code: ``evaluate(model, task_cfg, out_dir, title)`` with
``task_cfg`` as conf/task/perplexity.yaml (``corpora`` and ``lengths`` set). Windows of each
length start at ``range(0, n - L, stride)``; every token of a window after its first is scored.
Works for our DecoderLM and for Hugging Face causal LMs. It trains nothing.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from pipelines.errors import PipelineConfigError
from pipelines.models import check_model_positions
from pipelines.result_files import Row
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable
from tape.metrics.perplexity import load_token_file, sliding_window_perplexity

FIELDS = ["corpus", "length", "perplexity", "nll", "windows", "scored_tokens"]
log = logging.getLogger("pipelines.evaluate")


def adopt(task_cfg: DictConfig, source: Any, out_dir: Path) -> None:
    """Fill what is null from the evaluated run: its held-out text; lengths = 1x, 2x, 4x its context."""
    with open_dict(task_cfg):
        if not task_cfg.corpora:
            task_cfg.corpora = source.heldout_corpora(out_dir)
        if task_cfg.lengths is None:
            task_cfg.lengths = [m * source.context for m in (1, 2, 4)]
        run_task = source.run_cfg.task if source.run_cfg is not None else {}
        if "eval_max_windows" in run_task:  # a pretraining run (null: every window): for protocol_note
            task_cfg.run_eval = {"max_windows": run_task.get("eval_max_windows"),
                                 "stride": run_task.get("eval_stride")}


def protocol_note(task_cfg: DictConfig, results: list[dict[str, Any]]) -> str:
    """Why these numbers differ from a pretraining run's own ppl_<m>x ("" when they should not)."""
    own = task_cfg.get("run_eval")
    if not own or (task_cfg.max_windows, task_cfg.stride) == (own.max_windows, own.stride):
        return ""
    counts = sorted({int(r["windows"]) for r in results})
    windows = "every window" if task_cfg.max_windows is None else f"{task_cfg.max_windows} windows"
    own_windows = "every window" if own.max_windows is None else f"{own.max_windows} evenly spread windows"
    own_value = "null" if own.max_windows is None else own.max_windows
    return (f"protocol: {windows} at stride {task_cfg.stride} ({counts[0]}-{counts[-1]} a length); the "
            f"run's own ppl_<m>x used {own_windows} at stride {own.stride}, so "
            f"the two differ by design (task.max_windows={own_value} task.stride={own.stride} "
            "reproduces them)")


def positions_needed(task_cfg: DictConfig) -> tuple[int, str] | None:
    return (max(int(n) for n in task_cfg.lengths), "task.lengths") if task_cfg.lengths else None


def rows(model: nn.Module, task_cfg: DictConfig,
         tokens: Mapping[str, np.ndarray] | None = None) -> list[dict[str, Any]]:
    """One row per (corpus, length): perplexity, mean NLL, windows and scored tokens. ``tokens``:
    corpus name -> token ids already in memory (context extension's); default: ``task_cfg.corpora``."""
    t = task_cfg
    if not (t.corpora or tokens) or not t.lengths:
        raise PipelineConfigError("task.corpora (name: token file) and task.lengths must be set")
    lengths = [int(n) for n in t.lengths]
    if min(lengths) < 2:
        raise PipelineConfigError(f"task.lengths={lengths}: a window needs at least 2 tokens")
    check_model_positions(model, max(lengths), "task.lengths")
    out = []
    corpora = dict(tokens) if tokens is not None else {c: _load(c, p, t) for c, p in t.corpora.items()}
    vocab = _vocab_size(model)
    for corpus, ids in corpora.items():
        if vocab is not None and len(ids) and int(ids.max()) >= vocab:
            raise PipelineConfigError(
                f"task.corpora.{corpus}: token id {int(ids.max())} is outside the model's vocabulary "
                f"of {vocab}: the file was tokenised by another tokenizer (or read as another "
                f"task.token_dtype than {t.token_dtype}); give a file of this model's token ids")
    for corpus, ids in corpora.items():
        for length in lengths:
            try:
                r = sliding_window_perplexity(model, ids, length, int(t.stride), int(t.batch_size),
                                              None if t.max_windows is None else int(t.max_windows))
            except ValueError as err:
                raise PipelineConfigError(f"task.corpora.{corpus} at task.lengths {length}: {err}") from None
            out.append({"corpus": str(corpus), "length": length, **r})
    return out


def _vocab_size(model: nn.Module) -> int | None:
    """Rows of the model's input embedding (ours: ``embed``; Hugging Face: get_input_embeddings)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(model, "embed", None)
    return embed.num_embeddings if isinstance(embed, nn.Embedding) else None


def _load(corpus: str, path: Any, t: DictConfig) -> np.ndarray:
    try:
        return load_token_file(str(path), str(t.token_dtype))
    except FileNotFoundError as err:
        raise PipelineConfigError(f"task.corpora.{corpus}: {err}") from None


def with_corpus(rows: list[Row], cfg: DictConfig) -> list[Row]:
    """Perplexity rows with their corpus (pretraining names it in task.corpus, not per row)."""
    corpus = OmegaConf.select(cfg, "task.corpus")
    return [r if "corpus" in r or corpus is None else {"corpus": corpus, **r} for r in rows]


def evaluate(model: nn.Module, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Perplexity per corpus and length -> out_dir/perplexity.csv (a new file) and flat metrics
    ``ppl_<corpus>_<length>`` and ``eval_time_s``."""
    t0 = time.perf_counter()
    results = rows(model, task_cfg)
    with open(Path(out_dir) / "perplexity.csv", "x", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    metrics: dict[str, Any] = {f"ppl_{r['corpus']}_{r['length']}": float(r["perplexity"]) for r in results}
    if note := protocol_note(task_cfg, results):
        log.info("%s", note)
        metrics["protocol"] = note
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("perplexity")
class Perplexity(Task):
    """Sliding-window perplexity by corpus and length; an evaluation task (pipelines.evaluate)."""

    trains = False
    wandb_tables = {"perplexity.csv": WandbTable("eval/perplexity", prepare=with_corpus)}
    adopt = staticmethod(adopt)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
