"""Passkey retrieval (tape-spec D.3, the paper's Fig. 3) as an evaluation task.

On any finished run: ``python -m pipelines.evaluate run_dir=runs/... task=passkey``; from code:
``evaluate(model, task_cfg, out_dir, title)`` with ``task_cfg`` as conf/task/passkey.yaml
(``tokenizer`` set). Works for our DecoderLM and for Hugging Face causal LMs (a TAPE Llama
included). It trains nothing: ``pipelines.train task=passkey`` is refused.

Prompt sizes are either ``lengths`` (max prompt tokens, answer and BOS included; the filler is
sized with the tokenizer) or ``filler_chars`` (filler characters, the paper's protocol; the
paper's eight sizes are ``paper_filler_chars``: set ``filler_chars: ${.paper_filler_chars}``).
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict
from torch import nn

from pipelines.config_checks import require_bool
from pipelines.errors import PipelineConfigError
from pipelines.models import check_model_positions
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable, task_tokenizer
from tape.data.passkey import MAX_KEY, garbage_for_tokens, passkey_prompt
from tape.metrics.passkey import passkey_accuracy
from tape.data.tokenizer import TextTokenizer

FIELDS = ["target_tokens", "filler_chars", "n_garbage", "max_tokens", "mean_tokens", "trials", "accuracy"]


def adopt(task_cfg: DictConfig, source: Any, out_dir: Path) -> None:
    """Fill what is null from the evaluated run: its tokenizer; lengths = 1x and 2x its context
    (``check`` raises them to the shortest power of two that holds a passkey prompt)."""
    with open_dict(task_cfg):
        if task_cfg.tokenizer is None:
            task_cfg.tokenizer = source.tokenizer_path()
        if task_cfg.lengths is None and task_cfg.filler_chars is None:
            task_cfg.lengths = [int(source.context), 2 * int(source.context)]
            task_cfg.lengths_from_run = True


def shortest_fit(t: DictConfig, tok: TextTokenizer, bos: bool, at_least: int = 16) -> int:
    """The shortest power of two >= ``at_least`` tokens that holds a passkey prompt."""
    n = 1 << max(at_least - 1, 1).bit_length()
    while True:
        try:
            garbage_for_tokens(tok.encode, n, str(t.answer_prefix), trial_seeds(t), int(bos), t.draws)
            return n
        except ValueError:
            n *= 2


def check(task_cfg: DictConfig) -> None:
    """Every test point can be built with this tokenizer (before any directory is written);
    lengths taken from the run are raised to the shortest that holds a prompt."""
    require_bool(task_cfg, "kv_cache", prefix="task.")
    tok = task_tokenizer(task_cfg)
    bos = bool(task_cfg.bos) and tok.bos_id is not None
    if task_cfg.get("lengths_from_run"):
        base = max(int(task_cfg.lengths[0]), shortest_fit(task_cfg, tok, bos))
        with open_dict(task_cfg):
            task_cfg.lengths = [base, 2 * base]
    sizes(task_cfg, tok, bos)


def positions_needed(task_cfg: DictConfig) -> tuple[int, str] | None:
    """Token lengths are known before tokenizing; character sizes are checked in evaluate."""
    if task_cfg.filler_chars is None and task_cfg.lengths:
        return max(int(n) for n in task_cfg.lengths), "task.lengths"
    return None


def sizes(t: DictConfig, tok: TextTokenizer, bos: bool) -> list[tuple[int | None, int]]:
    """(target tokens or None, filler characters) per test point."""
    if t.draws not in ("official", "python"):
        raise PipelineConfigError(f"task.draws={t.draws}: choose official (as eval_retrieval.py) or python")
    if t.filler_chars is not None:
        return [(None, int(n)) for n in t.filler_chars]
    if not t.lengths:
        raise PipelineConfigError("task.lengths (max prompt tokens) or task.filler_chars must be set")
    out = []
    for n in t.lengths:
        try:
            out.append((int(n), garbage_for_tokens(tok.encode, int(n), str(t.answer_prefix),
                                                   trial_seeds(t), int(bos), t.draws)))
        except ValueError as err:
            fix = shortest_fit(t, tok, bos, int(n) + 1)
            raise PipelineConfigError(f"task.lengths={list(t.lengths)}: {err}; give longer prompts, e.g. "
                                      f"task.lengths=[{fix},{2 * fix}]") from None
    return out


def trial_seeds(t: DictConfig) -> range:
    """The prompt seeds of the evaluation's trials: task.seed .. task.seed + task.trials - 1."""
    return range(int(t.seed), int(t.seed) + int(t.trials))


def rows(model: nn.Module, task_cfg: DictConfig, tok: TextTokenizer | None = None) -> list[dict[str, Any]]:
    """One row per test point: accuracy over ``trials`` prompts and their token counts. ``tok``:
    a tokenizer already loaded (context extension's); default: ``task_cfg.tokenizer``."""
    t = task_cfg
    tok = tok or task_tokenizer(t)
    bos_id = tok.bos_id if t.bos else None
    trials, seed = int(t.trials), int(t.seed)
    out = []
    for target, n_garbage in sizes(t, tok, bos_id is not None):
        longest = max(len(tok.encode(passkey_prompt(n_garbage, seed + i, t.draws).text))
                      for i in range(trials)) + int(bos_id is not None) + len(tok.encode(t.answer_prefix + str(MAX_KEY)))
        check_model_positions(model, longest, "task.filler_chars" if target is None else "task.lengths")
        r = passkey_accuracy(model, tok.encode, n_garbage, trials, seed, str(t.answer_prefix),
                             bos_id=bos_id, draws=t.draws, kv_cache=t.kv_cache)
        out.append({"target_tokens": target, "filler_chars": n_garbage if target is None else None,
                    "n_garbage": n_garbage, "max_tokens": longest, **r})
    return out


def evaluate(model: nn.Module, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Passkey accuracy per prompt size -> out_dir/passkey.csv (a new file) and flat metrics:
    ``passkey_<tokens>`` (or ``passkey_<n>chars``), ``passkey_mean``, ``eval_time_s``."""
    t0 = time.perf_counter()
    results = rows(model, task_cfg)
    with open(Path(out_dir) / "passkey.csv", "x", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    metrics: dict[str, float] = {}
    for r in results:
        name = f"passkey_{r['target_tokens']}" if r["target_tokens"] else f"passkey_{r['n_garbage']}chars"
        metrics[name] = float(r["accuracy"])
        metrics[f"{name}_mean_tokens"] = float(r["mean_tokens"])
    metrics["passkey_mean"] = sum(float(r["accuracy"]) for r in results) / len(results)
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("passkey")
class Passkey(Task):
    """Passkey retrieval accuracy by prompt length; an evaluation task (pipelines.evaluate)."""

    trains = False
    wandb_tables = {"passkey.csv": WandbTable("eval/passkey")}
    adopt = staticmethod(adopt)
    check = staticmethod(check)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
