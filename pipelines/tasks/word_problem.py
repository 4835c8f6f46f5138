"""The group word problem (claim C5): read g_1 .. g_N, output every prefix product g_1 ... g_t.
Config checks, data module, and token / sequence accuracy by length -> word_problem.csv and
metrics ``token_accuracy_<m>x``, ``sequence_accuracy_<m>x`` (%) and ``token_accuracy`` (= 1x);
token accuracy at every prefix length -> word_problem_positions.csv.

Groups: ``parity`` (Z2), ``s3`` (non-abelian, solvable), ``a5`` (non-solvable); see
tape/data/word_problem.py. The vocabulary (the group's elements, <pad>, <bos>) depends on the
group, so ``task.vocab_size: null`` is filled in by :func:`prepare` before validation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, open_dict

from pipelines.config_checks import require_multipliers
from pipelines.errors import PipelineConfigError
from pipelines.models import check_model_vocab, check_position_range, model_config
from pipelines.result_files import write_csv
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable
from tape.data.word_problem import GROUPS, Group, eval_set, get_group, model_inputs

if TYPE_CHECKING:
    from tape.lightning.word_problem import WordProblemDataModule


def _group(t: DictConfig) -> Group:
    if t.group not in GROUPS:
        raise PipelineConfigError(f"task.group={t.group!r} is not a known group; choose one of {list(GROUPS)}")
    return get_group(str(t.group))


def prepare(cfg: DictConfig) -> None:
    """Fill ``task.vocab_size: null`` with the group's vocabulary (elements, <pad>, <bos>), and
    tell the tokens-per-second callback the group's pad id (element 0 is the identity, not pad)."""
    if cfg.task.group not in GROUPS:
        return
    group = get_group(str(cfg.task.group))
    with open_dict(cfg):
        if cfg.task.get("vocab_size") is None:
            cfg.task.vocab_size = group.vocab_size
        if cfg.get("callbacks") and cfg.callbacks.get("tokens_per_second"):
            cfg.callbacks.tokens_per_second.pad_id = group.pad


def positions_needed(task_cfg: DictConfig) -> tuple[int, str]:
    """Tokens of the longest test word (with its <bos>), and the key that sets it."""
    mults = [int(m) for m in task_cfg.eval_multipliers]
    return max(mults) * int(task_cfg.seq_len) + int(bool(task_cfg.bos)), "task.eval_multipliers"


def validate(cfg: DictConfig) -> None:
    """Every impossible word-problem setting, before anything trains."""
    t = cfg.task
    group = _group(t)
    for key in ("seq_len", "batch_size", "val_sequences", "eval_sequences", "eval_batch_size"):
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if not isinstance(t.bos, bool):
        raise PipelineConfigError(f"task.bos={t.bos!r} must be true or false")
    mults = require_multipliers(t, "eval_multipliers", "[1,2,4]")
    if 1 not in mults:
        raise PipelineConfigError(f"task.eval_multipliers={mults} must include 1 (token_accuracy is the 1x value)")
    if t.vocab_size is None:
        raise PipelineConfigError("task.vocab_size is null: pipelines.train fills it from task.group "
                                  f"({group.vocab_size} for {group.name}); leave it null there")
    if int(t.vocab_size) < group.vocab_size:
        raise PipelineConfigError(f"task.vocab_size={t.vocab_size} is smaller than the {group.name} "
                                  f"vocabulary ({group.order} elements, <pad>, <bos>: {group.vocab_size}); "
                                  "leave it null")
    mc = model_config(cfg)
    check_model_vocab(mc, group.vocab_size, f"{group.name} vocabulary")
    check_position_range(mc, int(t.seq_len) + int(t.bos) + 1, "task.seq_len")  # + the answer slot
    check_position_range(mc, *positions_needed(t))


def datamodule(cfg: DictConfig) -> WordProblemDataModule:
    from tape.lightning.word_problem import WordProblemDataModule  # Lightning: after the checks

    t = cfg.task
    return WordProblemDataModule(str(t.group), int(t.seq_len), int(t.batch_size), int(t.val_sequences),
                                 int(cfg.seed), bool(t.bos))


@torch.no_grad()
def predict(model: Any, group: Group, tokens: np.ndarray, bos: bool, batch_size: int) -> np.ndarray:
    """The model's prefix product (argmax over the group's elements) at every position, (B, N)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(tokens), batch_size):
        ids = model_inputs(group, tokens[start:start + batch_size], bos).to(device)
        logits = model(ids).logits[:, int(bos):, :group.order]  # <pad> and <bos> are never answers
        out.append(logits.argmax(-1).cpu().numpy())
    return np.concatenate(out)


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Token and sequence accuracy (%) at every length multiple -> word_problem.csv + metrics, and
    token accuracy at every prefix length -> word_problem_positions.csv (where a model stops)."""
    t0 = time.perf_counter()
    group = get_group(str(task_cfg.group))
    bos = bool(task_cfg.bos)
    was_training = model.training
    model.eval()
    rows, by_position, metrics = [], [], {}
    for mult in (int(m) for m in task_cfg.eval_multipliers):
        length = mult * int(task_cfg.seq_len)
        tokens, targets = eval_set(int(task_cfg.eval_seed), group, length, int(task_cfg.eval_sequences))
        hits = predict(model, group, tokens, bos, int(task_cfg.eval_batch_size)) == targets  # (B, N)
        token_acc, seq_acc = 100.0 * float(hits.mean()), 100.0 * float(hits.all(axis=1).mean())
        metrics[f"token_accuracy_{mult}x"] = token_acc
        metrics[f"sequence_accuracy_{mult}x"] = seq_acc
        rows.append({"multiplier": mult, "length": length, "token_accuracy": token_acc,
                     "sequence_accuracy": seq_acc})
        by_position += [{"multiplier": mult, "position": t + 1, "token_accuracy": 100.0 * float(acc)}
                        for t, acc in enumerate(hits.mean(axis=0))]  # position t + 1: g_1 ... g_{t+1}
    metrics["token_accuracy"] = metrics["token_accuracy_1x"]
    model.train(was_training)
    write_csv(rows, list(rows[0]), out_dir / "word_problem.csv")
    write_csv(by_position, list(by_position[0]), out_dir / "word_problem_positions.csv")
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("word_problem")
class WordProblem(Task):
    """Group word problems: prefix products by length."""

    wandb_tables = {"word_problem.csv": WandbTable("eval/word_problem"),
                    "word_problem_positions.csv": WandbTable("eval/word_problem_positions")}
    prepare = staticmethod(prepare)
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
    positions_needed = staticmethod(positions_needed)
