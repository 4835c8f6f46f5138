"""MMLU and ARC accuracy (the paper's Table 9) as an evaluation task.

On any finished run or model directory: ``python -m pipelines.evaluate run_dir=<run> task=multiple_choice
task.data_dir=<dir>`` (a context-extension run with ``stage=``). Writes ``multiple_choice.csv``
(per benchmark and group: items, acc, acc_norm and their standard errors) and
``multiple_choice_items.jsonl`` (per item: its log-likelihoods and outcomes, so that two models
can be compared item by item). It trains nothing.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict
from torch import nn

from pipelines.config_checks import require_bool
from pipelines.errors import PipelineConfigError
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable, task_tokenizer
from tape.data.multiple_choice import (BENCHMARKS, MMLU_GROUPS, Item, MultipleChoiceDataError, prompt,
                                       read_items, shots_for)
from tape.data.tokenizer import TextTokenizer
from tape.metrics.multiple_choice import accuracy, score

FIELDS = ["benchmark", "group", "shots", "items", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr"]


def adopt(task_cfg: DictConfig, source: Any, out_dir: Path) -> None:
    """The evaluated run's tokenizer when task.tokenizer is null."""
    with open_dict(task_cfg):
        if task_cfg.tokenizer is None:
            task_cfg.tokenizer = source.tokenizer_path()


def check(task_cfg: DictConfig) -> None:
    """Settings and data files are usable (before any directory is written)."""
    t = task_cfg
    require_bool(t, "bos", prefix="task.")
    if not t.data_dir:
        raise PipelineConfigError(
            "task.data_dir is not set: a directory of <benchmark>/test.jsonl files; write one with "
            "`python -m tape.data.multiple_choice --out data/multiple_choice` (needs the hub)")
    unknown = [b for b in t.benchmarks if b not in BENCHMARKS]
    if unknown or not t.benchmarks:
        raise PipelineConfigError(f"task.benchmarks={list(t.benchmarks)}: choose from {', '.join(BENCHMARKS)}")
    for b in t.benchmarks:
        k = t.shots.get(b, 0)
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise PipelineConfigError(f"task.shots.{b}={k!r}: a number of examples >= 0")
    for key in ("max_items", "max_tokens"):
        value = t.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise PipelineConfigError(f"task.{key}={value!r}: a positive integer or null")
    for b in t.benchmarks:
        _data(t, b)  # missing or malformed files are named now


def _data(t: DictConfig, benchmark: str) -> tuple[list[Item], list[Item]]:
    """(scored items, few-shot pool) of one benchmark; data problems become config errors."""
    try:
        items = read_items(t.data_dir, benchmark, "test")
        pool = read_items(t.data_dir, benchmark, "fewshot") if t.shots.get(benchmark, 0) else []
    except MultipleChoiceDataError as err:
        raise PipelineConfigError(f"task.data_dir={t.data_dir}: {err}") from None
    if t.max_items is not None and len(items) > t.max_items:
        step = len(items) / t.max_items  # evenly spread: MMLU's file is sorted by subject
        items = [items[int(i * step)] for i in range(t.max_items)]
    return items, pool


def groups(benchmark: str) -> list[str]:
    """The rows a benchmark reports: MMLU's four groups and all; "all" elsewhere."""
    return [*MMLU_GROUPS, "all"] if benchmark == "mmlu" else ["all"]


def records(model: nn.Module, task_cfg: DictConfig, tok: TextTokenizer | None = None) -> list[dict[str, Any]]:
    """One record per scored item: benchmark, index, subject, group, answer, shots, each choice's
    log-likelihood, both outcomes and its tokens. ``tok``: a tokenizer already loaded (context
    extension's); default: ``task_cfg.tokenizer``."""
    t = task_cfg
    check(t)
    tok = tok or task_tokenizer(t)
    bos_id = tok.bos_id if t.bos else None
    device = next(model.parameters()).device
    out = []
    for benchmark in t.benchmarks:
        items, pool = _data(t, benchmark)
        k = int(t.shots.get(benchmark, 0))
        for n, item in enumerate(items):
            try:
                shots = shots_for(item, pool, k)
            except MultipleChoiceDataError as err:
                raise PipelineConfigError(f"task.shots.{benchmark}={k}: {err}") from None
            s = score(model, tok.encode, prompt(benchmark, item, shots), item.answer, device,
                      bos_id=bos_id, max_tokens=t.max_tokens)
            out.append({"benchmark": benchmark, "item": n, "subject": item.subject, "group": item.group,
                        "answer": item.answer, "shots": k, "loglikelihoods": s.loglikelihoods,
                        "correct": s.correct, "correct_norm": s.correct_norm, "tokens": s.tokens})
    return out


def in_group(record: dict[str, Any], group: str) -> bool:
    return group == "all" or record["group"] == group


def summary(scored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per benchmark and group of ``records``: items, acc and acc_norm (%) with their
    standard errors."""
    out = []
    for benchmark in dict.fromkeys(r["benchmark"] for r in scored):
        mine = [r for r in scored if r["benchmark"] == benchmark]
        for group in groups(benchmark):
            chosen = [r for r in mine if in_group(r, group)]
            if chosen:
                acc, acc_se = accuracy([r["correct"] for r in chosen])
                norm, norm_se = accuracy([r["correct_norm"] for r in chosen])
                out.append({"benchmark": benchmark, "group": group, "shots": chosen[0]["shots"],
                            "items": len(chosen), "acc": acc, "acc_stderr": acc_se, "acc_norm": norm,
                            "acc_norm_stderr": norm_se})
    return out


def write_records(scored: list[dict[str, Any]], path: Path) -> None:
    """The records as JSON lines in a new file."""
    with open(path, "x", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in scored)


def metric_name(row: dict[str, Any], measure: str) -> str:
    """``mc_<benchmark>[_<group>]_<measure>``; the group is left out for "all"."""
    group = "" if row["group"] == "all" else f"_{row['group']}"
    return f"mc_{row['benchmark']}{group}_{measure}"


def evaluate(model: nn.Module, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Accuracy per benchmark and group -> multiple_choice.csv, per item -> _items.jsonl, and
    flat metrics ``mc_<benchmark>[_<group>]_{acc,acc_norm}`` (%), ``eval_time_s``."""
    t0 = time.perf_counter()
    scored = records(model, task_cfg)
    write_records(scored, Path(out_dir) / "multiple_choice_items.jsonl")
    results = summary(scored)
    with open(Path(out_dir) / "multiple_choice.csv", "x", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(results)
    metrics = {metric_name(r, m): r[m] for r in results for m in ("acc", "acc_norm")}
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("multiple_choice")
class MultipleChoice(Task):
    """MMLU / ARC accuracy by log-likelihood; an evaluation task (pipelines.evaluate)."""

    trains = False
    wandb_tables = {"multiple_choice.csv": WandbTable("eval/multiple_choice")}
    adopt = staticmethod(adopt)
    check = staticmethod(check)
    evaluate = staticmethod(evaluate)
