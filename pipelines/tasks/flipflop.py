"""The flip-flop task (Liu et al. 2023): config checks, data module, read error by length and
sparsity -> flipflop.csv and metrics ``read_error_<sparsity>_<m>x`` (%), ``read_error_<m>x``
(mean over sparsities) and ``read_error_ood`` (mean over ``task.primary_multipliers``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from pipelines.config_checks import is_number, require_int, require_multipliers
from pipelines.errors import PipelineConfigError
from pipelines.models import check_model_vocab, check_position_range, model_config
from pipelines.result_files import write_csv
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable
from tape.data.flipflop import LOSS_ON, VOCAB_SIZE, eval_set, read_mask

if TYPE_CHECKING:
    from tape.lightning.flipflop import FlipFlopDataModule


def validate(cfg: DictConfig) -> None:
    """Every impossible flip-flop setting, before anything trains."""
    t = cfg.task
    require_int(t, "seq_len", "batch_size", "val_sequences", "eval_sequences", "eval_batch_size", "eval_seed",
                prefix="task.")
    for key in ("batch_size", "val_sequences", "eval_sequences", "eval_batch_size"):
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    if int(t.seq_len) < 4 or int(t.seq_len) % 2:
        raise PipelineConfigError(f"task.seq_len={t.seq_len} must be even and >= 4 "
                                  "(instruction-bit pairs, a write first and a read last)")
    if t.loss_on not in LOSS_ON:
        raise PipelineConfigError(f"task.loss_on={t.loss_on!r}; choose one of {list(LOSS_ON)}")
    if not OmegaConf.is_dict(t.get("eval_p_ignore")) or not t.eval_p_ignore:
        raise PipelineConfigError(f"task.eval_p_ignore={t.get('eval_p_ignore')!r} must map each test sparsity's "
                                  "name to its P(ignore), e.g. task.eval_p_ignore={sparse:0.98,dense:0.1}")
    for key, value in {"p_ignore": t.p_ignore, **{f"eval_p_ignore.{k}": v for k, v in t.eval_p_ignore.items()}}.items():
        if not (is_number(value) and 0.0 <= value < 1.0):
            raise PipelineConfigError(f"task.{key}={value!r} must be a number in [0, 1)")
    mults = require_multipliers(t, "eval_multipliers", "[1,2,3,4]")
    if not set(require_multipliers(t, "primary_multipliers", "[2,3]")) <= set(mults):
        raise PipelineConfigError(f"task.primary_multipliers={list(t.primary_multipliers)} must be "
                                  f"among task.eval_multipliers={mults}")
    mc = model_config(cfg)
    check_model_vocab(mc, VOCAB_SIZE, "flip-flop vocabulary")
    check_position_range(mc, max(mults) * int(t.seq_len), "task.eval_multipliers")


def datamodule(cfg: DictConfig) -> FlipFlopDataModule:
    from tape.lightning.flipflop import FlipFlopDataModule  # Lightning: after the checks

    t = cfg.task
    return FlipFlopDataModule(int(t.seq_len), int(t.batch_size), float(t.p_ignore),
                              int(t.val_sequences), int(cfg.seed), str(t.loss_on))


@torch.no_grad()
def read_errors(model: Any, tokens: np.ndarray, batch_size: int) -> tuple[int, int]:
    """(reads, wrong reads) of a teacher-forced pass: a read is right when the argmax after
    ``r`` is its bit."""
    device = next(model.parameters()).device
    reads = wrong = 0
    for start in range(0, len(tokens), batch_size):
        ids = torch.from_numpy(tokens[start:start + batch_size]).to(device)  # (B, N)
        pred = model(ids).logits[:, :-1].argmax(-1)  # (B, N-1): position t predicts t+1
        mask = read_mask(ids)[:, 1:]
        reads += int(mask.sum())
        wrong += int((pred[mask] != ids[:, 1:][mask]).sum())
    return reads, wrong


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
    """Read error (%) at every length multiple and sparsity -> flipflop.csv + metrics."""
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    rows, metrics = [], {}
    for mult in (int(m) for m in task_cfg.eval_multipliers):
        length = mult * int(task_cfg.seq_len)
        for name, p in task_cfg.eval_p_ignore.items():
            tokens = eval_set(int(task_cfg.eval_seed), length, float(p), int(task_cfg.eval_sequences))
            reads, wrong = read_errors(model, tokens, int(task_cfg.eval_batch_size))
            error = 100.0 * wrong / reads
            metrics[f"read_error_{name}_{mult}x"] = error
            rows.append({"sparsity": name, "p_ignore": float(p), "multiplier": mult, "length": length,
                         "sequences": len(tokens), "reads": reads, "errors": wrong, "error": error})
        metrics[f"read_error_{mult}x"] = float(np.mean([r["error"] for r in rows if r["multiplier"] == mult]))
    primary = [int(m) for m in task_cfg.primary_multipliers]
    metrics["read_error_ood"] = float(np.mean([metrics[f"read_error_{m}x"] for m in primary]))
    model.train(was_training)
    write_csv(rows, list(rows[0]), out_dir / "flipflop.csv")
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("flipflop")
class FlipFlop(Task):
    """Flip-flop language modelling: read error by length and sparsity."""

    wandb_tables = {"flipflop.csv": WandbTable("eval/flipflop")}
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)
