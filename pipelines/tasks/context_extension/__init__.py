"""Context extension (tape-spec B, D.3; the paper's Table 2 and Fig. 3) end to end:
``python -m pipelines.train experiment=context_extension/cpu``.

Pretrains (or loads) a RoPE Llama at context C, extends it to ``extend.context`` with each
named recipe of ``extend.recipes`` (tape = the official TAPE variant, tape_mix, lora, longlora,
theta; ``recipes.<name>`` gives the base recipe and its options), then evaluates the base and
every recipe on rank 0: perplexity per corpus and length (LongLoRA protocol) and passkey
accuracy per length. Every training stage is a Lightning fit with the ``trainer`` preset (see
stages.py). The run directory runs/<experiment>/llama/<seed>/<time>-<id>/ gets config.yaml,
command.txt, metrics.json (flat, with each stage's wall time), perplexity.csv, passkey.csv,
tables.md and passkey.png. Trained models live in ``models_dir`` and are reused by later runs
with identical settings.

Unlike the other tasks this one runs several fits, so it sets ``runs_itself`` and
``pipelines.train`` hands it the whole run (``run(cfg)``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from pipelines.tasks.context_extension.data import (
    check_inputs, describe, heldout_files, load_data, trained_tokenizer,
)
from pipelines.tasks.context_extension.report import (
    PASSKEY_FIELDS, PPL_FIELDS, passkey_table, perplexity_table, plot_passkey,
)
from pipelines.tasks.context_extension.stages import (
    DTYPES, base_stage, evaluate_stage, passkey_check, recipe_spec, recipe_stage,
)
from pipelines import wandb_log
from pipelines.config_checks import is_number, require_bool, require_int
from pipelines.errors import PipelineConfigError
from pipelines.precision import training_precision
from pipelines.result_files import write_csv, write_json_once
from pipelines.run_dirs import claim_run_dir, is_rank_zero
from pipelines.tasks import register
from pipelines.tasks.base import Task
from tape.hf.io import load_model
from tape.hf.recipes import RECIPES
from tape.schedule import optim_problems
from tape.typecheck import type_problems

log = logging.getLogger("pipelines.context_extension")
MIXED = ("16-mixed", "bf16-mixed")


def _check_precision(cfg: DictConfig) -> None:
    precision = str(cfg.trainer.precision)
    if precision.endswith("-true") and not precision.startswith(("32", "64")):
        raise PipelineConfigError(
            f"trainer.precision={precision} would train the weights in low precision (Adam steps of "
            "lr 2e-5 vanish below half a bf16 ulp); use trainer.precision=bf16-mixed (autocast, fp32 "
            "weights and optimizer state) and model.frozen_dtype=float16 (a fp16 checkpoint's own dtype) or "
            "bfloat16 to store frozen weights small")
    training_precision(cfg)  # e.g. 64-true: trainable weights are fp32
    frozen = cfg.model.frozen_dtype
    if frozen not in DTYPES:
        raise PipelineConfigError(f"model.frozen_dtype={frozen}: choose one of {list(DTYPES)}")
    if frozen != "float32" and precision not in MIXED:
        raise PipelineConfigError(
            f"model.frozen_dtype={frozen} stores frozen weights in low precision, which only autocast "
            f"can multiply with fp32 activations: set trainer.precision=bf16-mixed (got {precision}) "
            "or model.frozen_dtype=float32")
    strategy = cfg.trainer.get("strategy")
    target = str(strategy.get("_target_", "")) if isinstance(strategy, DictConfig) else str(strategy or "")
    if frozen != "float32" and "fsdp" in target.lower():
        raise PipelineConfigError(
            f"trainer=fsdp shards units of one dtype: model.frozen_dtype={frozen} mixes {frozen} frozen and "
            "fp32 trainable weights in a unit; set model.frozen_dtype=float32 with trainer=fsdp")
    if cfg.eval.dtype not in DTYPES:
        raise PipelineConfigError(f"eval.dtype={cfg.eval.dtype}: choose one of {list(DTYPES)}")


# The integer keys of the training sections (base.*, extend.*) and the least each may be;
# passkey_rows is bounded by batch_size in validate().
SECTION_INTS = {
    "base": {"steps": 1, "batch_size": 1, "grad_accum": 1, "passkey_rows": 0, "passkey_min_tokens": 1,
             "warmup_steps": 0, "log_every": 1, "checkpoint_every": 1},
    "extend": {"context": 1, "steps": 1, "batch_size": 1, "grad_accum": 1, "passkey_rows": 0,
               "warmup_steps": 0, "log_every": 1, "checkpoint_every": 1},
}
OPTIM_KEYS = ("lr", "betas", "weight_decay", "warmup_steps", "schedule", "min_lr_ratio")  # as optim.*


def check_section(cfg: DictConfig, section: str) -> None:
    """The value types and ranges of ``base.*`` or ``extend.*`` (``extend.steps=abc``,
    ``base.schedule=cosin``), named as on the command line before anything trains."""
    s = cfg[section]
    require_int(s, *SECTION_INTS[section], prefix=f"{section}.")
    for key, least in SECTION_INTS[section].items():
        if s[key] < least:
            raise PipelineConfigError(f"{section}.{key}={s[key]} must be >= {least}")
    values = OmegaConf.to_container(s, resolve=True)
    optim = {k: values[k] for k in OPTIM_KEYS if k in values}
    betas = optim.get("betas", [0.9, 0.95])
    if not (isinstance(betas, list) and len(betas) == 2 and all(is_number(b) for b in betas)):
        raise PipelineConfigError(f"{section}.betas={betas!r} must be two numbers in [0, 1), e.g. "
                                  f"{section}.betas=[0.9,0.95]")
    problems = type_problems(optim_problems, optim) or optim_problems(**optim)
    if problems:  # e.g. base.schedule=cosin, named before a stage trains
        raise PipelineConfigError("; ".join(f"{section}.{p}" for p in problems))
    for key in ("passkey_weight", "grad_clip"):
        value = values.get(key)
        if key == "grad_clip" and value is None:
            continue  # no clipping
        if not (is_number(value) and value >= 0):  # nan too
            raise PipelineConfigError(f"{section}.{key}={value!r} must be a number >= 0"
                                      + (" (or null: no clipping)" if key == "grad_clip" else ""))
    if section == "extend":
        if not isinstance(values.get("gradient_checkpointing"), bool):
            raise PipelineConfigError(f"extend.gradient_checkpointing={values.get('gradient_checkpointing')!r} "
                                      "must be true or false")
        recipes = values.get("recipes")
        if not isinstance(recipes, list) or not all(isinstance(r, str) for r in recipes):
            raise PipelineConfigError(f"extend.recipes={recipes!r} must be a list of names under recipes.*, "
                                      f"e.g. extend.recipes=[tape,lora]")


def validate(cfg: DictConfig) -> None:
    """Every impossible setting, before anything loads or trains."""
    require_int(cfg, "model.context")
    for section in ("base", "extend"):
        check_section(cfg, section)
    C, T = int(cfg.model.context), int(cfg.extend.context)
    if T <= C:
        raise PipelineConfigError(f"extend.context={T} must exceed model.context={C}")
    for name in cfg.extend.recipes:
        if name not in cfg.recipes:
            raise PipelineConfigError(f"extend.recipes lists {name} but recipes.{name} (its base recipe and "
                                      f"options) is missing; defined: {list(cfg.recipes)}")
        recipe, options = recipe_spec(cfg, name)
        if recipe not in RECIPES:
            raise PipelineConfigError(f"recipes.{name}.recipe={recipe!r}: unknown recipe; choose from {list(RECIPES)}")
        if recipe == "longlora" and T % (2 * int(options.get("s2attn_groups", 4))):
            groups = int(options.get("s2attn_groups", 4))
            raise PipelineConfigError(
                f"extend.context={T} must split into recipes.{name}.s2attn_groups={groups} groups of "
                f"even size (a multiple of {2 * groups}) for LongLoRA's shifted sparse attention")
    for section in ("base", "extend"):
        s = cfg[section]
        if not 0 <= s.passkey_rows <= s.batch_size:
            raise PipelineConfigError(f"{section}.passkey_rows={s.passkey_rows} must be in [0, {section}.batch_size]")
    if cfg.base.passkey_rows and not cfg.model.pretrained_path and cfg.base.passkey_min_tokens > C:
        raise PipelineConfigError(f"base.passkey_min_tokens={cfg.base.passkey_min_tokens} must be <= "
                                  f"model.context={C} (base passkey prompts span base.passkey_min_tokens .. "
                                  "model.context tokens)")
    _check_precision(cfg)
    require_bool(cfg, "eval.passkey_kv_cache")
    if cfg.get("ckpt_path"):
        raise PipelineConfigError(
            f"ckpt_path={cfg.ckpt_path}: context extension resumes by itself; rerun the same command "
            "(a killed stage continues from its last checkpoint, finished stages are reused)")
    for n in cfg.eval.perplexity_lengths:
        if isinstance(n, bool) or not isinstance(n, int):
            raise PipelineConfigError(f"eval.perplexity_lengths: {n!r} is not an integer (tokens)")
        if n < 2:
            raise PipelineConfigError(f"eval.perplexity_lengths: {n} < 2 tokens")
    check_inputs(cfg)


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
    ppl_rows, key_rows = [], []
    dtype, device = DTYPES[cfg.eval.dtype], eval_device(cfg)
    for method, path in trained.items():
        t = time.perf_counter()
        model = load_model(path, dtype, device)
        p, k = evaluate_stage(cfg, method, model, data)
        del model
        ppl_rows.extend(p)
        key_rows.extend(k)
        metrics[f"time_eval_{method}_s"] = time.perf_counter() - t
        metrics.update({f"ppl_{r['corpus']}_{r['length']}_{method}": r["perplexity"] for r in p})
        metrics.update({f"passkey_{r['target_tokens']}_{method}": r["accuracy"] for r in k})
        if method == "base":
            metrics.update(_base_check(cfg, k))
    write_csv(ppl_rows, PPL_FIELDS, run_dir / "perplexity.csv")
    write_csv(key_rows, PASSKEY_FIELDS, run_dir / "passkey.csv")
    tables = (f"## Perplexity (lower is better; bold = best extended model)\n\n{perplexity_table(ppl_rows)}\n\n"
              f"## Passkey accuracy ({cfg.eval.passkey_trials} trials; column = max prompt tokens "
              f"(mean))\n\n{passkey_table(key_rows)}\n")
    with open(run_dir / "tables.md", "x") as f:
        f.write(tables)
    plot_passkey(key_rows, run_dir / "passkey.png",
                 f"Passkey retrieval, {cfg.experiment_name} (C={cfg.model.context})", cfg.model.context)
    print(tables)
    return metrics


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


@register("context_extension")
class ContextExtension(Task):
    """Pretrain (or load) a base Llama, extend its context with each recipe, evaluate them all."""

    runs_itself = True
    validate = staticmethod(validate)
    run = staticmethod(run)

    def trained_tokenizer(self, run_cfg: DictConfig) -> str:
        return trained_tokenizer(run_cfg)

    def heldout_files(self, run_cfg: DictConfig, out_dir: Path) -> dict[str, str]:
        return heldout_files(run_cfg)
