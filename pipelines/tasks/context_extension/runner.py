"""The context-extension run: train every stage (all processes), then evaluate on rank 0 and
write the run's files (see the package docstring)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import DictConfig
from torch import nn

from pipelines import wandb_log
from pipelines.result_files import write_csv, write_json_once
from pipelines.run_dirs import claim_run_dir, is_rank_zero
from pipelines.tasks.context_extension.checks import validate
from pipelines.tasks.context_extension.data import describe, load_data
from pipelines.tasks.context_extension.report import (
    PASSKEY_FIELDS, PPL_FIELDS, multiple_choice_table, paired_table, passkey_table, perplexity_table,
    plot_passkey,
)
from pipelines.tasks.context_extension.stages import (
    base_stage, evaluate_stage, passkey_check, recipe_stage,
)
from pipelines.tasks.multiple_choice import FIELDS as MC_FIELDS, metric_name, summary, write_records
from tape.hf import switch_off_maps
from tape.hf.io import load_model
from tape.hf_names import DTYPES

log = logging.getLogger("pipelines.context_extension")


def eval_device(cfg: DictConfig) -> str:
    """Evaluation runs on the GPU when the trainer preset may use one and there is one."""
    gpu = str(cfg.trainer.accelerator) in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    return "cuda" if gpu else "cpu"


def run(cfg: DictConfig) -> dict[str, Any]:
    """Every stage: train (all processes), then evaluate on rank 0; write metrics.json, the
    CSVs, tables.md and passkey.png. Returns the metrics (empty on the other ranks)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar for every stage
    t_start = time.perf_counter()
    validate(cfg)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    t0 = time.perf_counter()
    data = load_data(cfg)  # missing data fails here, before the run directory is claimed
    passkey_check(cfg, data)  # so does a passkey length too short for any prompt
    time_data = time.perf_counter() - t0
    run_dir = Path(cfg.paths.output_dir)
    if is_rank_zero():
        claim_run_dir(run_dir, cfg, "pipelines.train")
    models_dir = Path(cfg.models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {"task": "context_extension", "scale": cfg.scale, "seed": cfg.seed,
                               "experiment": cfg.experiment_name, "context": cfg.model.context,
                               "target_context": cfg.extend.context, "device": eval_device(cfg),
                               "precision": str(cfg.trainer.precision), "threads": torch.get_num_threads()}
    loggers = wandb_log.open_loggers(cfg)  # W&B gets the full resolved config
    metrics.update(describe(data), time_data_s=time_data)

    base_path, base = base_stage(cfg, data, models_dir, loggers)
    metrics.update(base_model=str(base_path), base_reused=bool(base.get("reused")),
                   time_base_train_s=0.0 if base.get("reused") else base.get("stage_time_s", 0.0))
    metrics.update({f"base_{k}": v for k, v in base.get("train", {}).items()})
    trained = {"base": base_path}
    for name in cfg.extend.recipes:
        path, info = recipe_stage(cfg, name, base_path, base["key"], data, models_dir, loggers)
        trained[name] = path
        metrics.update({f"{name}_model": str(path), f"{name}_reused": bool(info.get("reused")),
                        f"{name}_trainable_params": info.get("trainable_params"),
                        f"time_train_{name}_s": 0.0 if info.get("reused") else info["stage_time_s"]})
        metrics.update({f"{name}_{k}": v for k, v in info.get("train", {}).items()})
    if not is_rank_zero():
        return {}  # rank 0 evaluates the saved models
    metrics.update(evaluate_all(cfg, trained, data, run_dir))
    metrics["wall_time_s"] = time.perf_counter() - t_start
    for lg in loggers:
        lg.log_metrics({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, float)}, step=0)
    wandb_log.log_results(loggers, run_dir, cfg)  # perplexity and passkey tables, passkey.png
    for lg in loggers:
        lg.finalize("success")
    write_json_once(run_dir / "metrics.json", metrics)
    return metrics


def evaluate_all(cfg: DictConfig, trained: dict[str, Path], data: Any, run_dir: Path) -> dict[str, Any]:
    """Evaluate every saved model (base first); write the CSVs, tables.md and passkey.png."""
    metrics: dict[str, Any] = {}
    ppl_rows, key_rows, choice_rows, choice_records = [], [], [], {}
    dtype, device = DTYPES[cfg.eval.dtype], eval_device(cfg)
    t = time.perf_counter()
    for method, model in scored_models(cfg, trained, dtype, device):
        p, k, c = evaluate_stage(cfg, method, model, data)
        del model  # before the next model loads
        ppl_rows.extend(p)
        key_rows.extend(k)
        choice_records[method] = c
        choice_rows.extend({"method": method, **r} for r in summary(c))
        metrics[f"time_eval_{method}_s"] = time.perf_counter() - t
        metrics.update({f"ppl_{r['corpus']}_{r['length']}_{method}": r["perplexity"] for r in p})
        metrics.update({f"passkey_{r['target_tokens']}_{method}": r["accuracy"] for r in k})
        metrics.update({f"{metric_name(r, 'acc')}_{method}": r["acc"] for r in choice_rows if r["method"] == method})
        if method == "base":
            metrics.update(_base_check(cfg, k))
        t = time.perf_counter()
    write_csv(ppl_rows, PPL_FIELDS, run_dir / "perplexity.csv")
    write_csv(key_rows, PASSKEY_FIELDS, run_dir / "passkey.csv")
    tables = (f"## Perplexity (lower is better; bold = best extended model)\n\n{perplexity_table(ppl_rows)}\n\n"
              f"## Passkey accuracy ({cfg.eval.passkey_trials} trials; column = max prompt tokens "
              f"(mean))\n\n{passkey_table(key_rows)}\n")
    if choice_rows:
        write_csv(choice_rows, ["method", *MC_FIELDS], run_dir / "multiple_choice.csv")
        write_records([r for c in choice_records.values() for r in c], run_dir / "multiple_choice_items.jsonl")
        tables += f"\n## MMLU / ARC accuracy (%, ± standard error; Table 9)\n\n{multiple_choice_table(choice_rows)}\n"
        if "base" in choice_records and len(choice_records) > 1:
            tables += ("\n## MMLU / ARC, each model - base on the same items (points [95 % CI], McNemar p)"
                       f"\n\n{paired_table(choice_records, 'base')}\n")
    with open(run_dir / "tables.md", "x") as f:
        f.write(tables)
    plot_passkey(key_rows, run_dir / "passkey.png",
                 f"Passkey retrieval, {cfg.experiment_name} (C={cfg.model.context})", cfg.model.context)
    print(tables)
    return metrics


def scored_models(cfg: DictConfig, trained: dict[str, Path], dtype: torch.dtype,
                  device: str) -> Iterator[tuple[str, nn.Module]]:
    """(method, model) in scoring order: each saved model, loaded once, and right after a recipe
    named in eval.maps_off the same model with TAPE's maps switched off (``<name>_maps_off``)."""
    off = set(cfg.eval.get("maps_off") or ())
    for name, path in trained.items():
        model = load_model(path, dtype, device)
        yield name, model
        if name in off:
            switch_off_maps(model)
            yield f"{name}_maps_off", model
        del model


def _base_check(cfg: DictConfig, key_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the base retrieves at its own context (else the extension measures little): the
    longest passkey length whose prompts fit that context (filler-character lengths, the paper
    preset's, never hit it exactly); none when no length fits."""
    within = [r for r in key_rows if r["target_tokens"] <= cfg.model.context]
    if not within:
        return {}
    row = max(within, key=lambda r: r["target_tokens"])
    ok = row["accuracy"] >= cfg.eval.min_base_passkey
    if not ok:
        log.warning("the base model retrieves %.0f%% of passkeys at %d tokens, within its context %d "
                    "(< %.0f%%): the extension results measure little", 100 * row["accuracy"],
                    row["target_tokens"], cfg.model.context, 100 * cfg.eval.min_base_passkey)
    return {"base_passkey_at_context": row["accuracy"], "base_passkey_tokens": row["target_tokens"],
            "base_retrieves": ok}
