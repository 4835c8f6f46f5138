"""Context extension (tape-spec B, D.3; the paper's Table 2 and Fig. 3) end to end:
``python -m pipelines.extend experiment=context_extension/cpu``.

Pretrains (or loads) a RoPE Llama at context C, extends it to ``extend.context`` with each
recipe of ``extend.recipes`` (tape, lora, longlora, theta), and evaluates the base and every
recipe: perplexity per corpus and length (LongLoRA protocol) and passkey accuracy per length.
The run directory runs/<experiment>/llama/<seed>/<time>-<id>/ gets config.yaml, command.txt,
metrics.json (flat, with each stage's wall time), perplexity.csv, passkey.csv, tables.md and
passkey.png. Trained models live in ``models_dir`` and are reused by later runs with identical
settings (see pipelines/context_extension_stages.py).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig

from pipelines.context_extension_data import check_inputs, describe, load_data
from pipelines.context_extension_report import (
    PASSKEY_FIELDS, PPL_FIELDS, passkey_table, perplexity_table, plot_passkey, write_csv,
)
from pipelines.context_extension_stages import (
    DTYPES, base_stage, evaluate_stage, passkey_sizes, recipe_stage,
)
from pipelines.utils import (
    PipelineConfigError, claim_run_dir, instantiate_group, task_wrapper, unknown_choice, write_json_once,
)
from tape.hf.io import load_model
from tape.hf.recipes import RECIPES

log = logging.getLogger("pipelines.extend")


def validate(cfg: DictConfig) -> None:
    """Every impossible setting, before anything loads or trains."""
    C, T = int(cfg.model.context), int(cfg.extend.context)
    if T <= C:
        raise PipelineConfigError(f"extend.context={T} must exceed model.context={C}")
    for recipe in cfg.extend.recipes:
        if recipe not in RECIPES:
            raise PipelineConfigError(f"extend.recipes: unknown recipe {recipe!r}; choose from {list(RECIPES)}")
        if recipe not in cfg.recipes:
            raise PipelineConfigError(f"extend.recipes lists {recipe} but recipes.{recipe} (its options) is missing")
    if "longlora" in cfg.extend.recipes:
        groups = int(cfg.recipes.longlora.s2attn_groups)
        if T % (2 * groups):
            raise PipelineConfigError(
                f"extend.context={T} must split into recipes.longlora.s2attn_groups={groups} groups of "
                f"even size (a multiple of {2 * groups}) for LongLoRA's shifted sparse attention")
    for section in ("base", "extend"):
        s = cfg[section]
        if not 0 <= s.passkey_rows <= s.batch_size:
            raise PipelineConfigError(f"{section}.passkey_rows={s.passkey_rows} must be in [0, {section}.batch_size]")
        if s.steps < 1 or s.grad_accum < 1:
            raise PipelineConfigError(f"{section}.steps and {section}.grad_accum must be >= 1")
    if cfg.model.dtype not in DTYPES:
        raise PipelineConfigError(f"model.dtype={cfg.model.dtype}: choose one of {list(DTYPES)}")
    for n in cfg.eval.perplexity_lengths:
        if n < 2:
            raise PipelineConfigError(f"eval.perplexity_lengths: {n} < 2 tokens")
    check_inputs(cfg)


def _device(cfg: DictConfig) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else str(cfg.device)


class StageLogger:
    """Forward per-step losses to the loggers (CSV, W&B offline) with one global step."""

    def __init__(self, loggers: list[Any]) -> None:
        self.loggers, self.offset = loggers, 0

    def stage(self, name: str, steps: int):
        offset = self.offset
        self.offset += steps

        def log_fn(step: int, values: dict[str, float]) -> None:
            log.info("%s step %d: %s", name, step, " ".join(f"{k}={v:.4g}" for k, v in values.items()))
            for lg in self.loggers:
                lg.log_metrics({f"{name}/{k}": v for k, v in values.items()}, step=offset + step)
                if hasattr(lg, "save"):
                    lg.save()  # the CSV file grows while training runs
        return log_fn


@task_wrapper
def extend(cfg: DictConfig) -> dict[str, Any]:
    """Run every stage; write metrics.json, the CSVs, tables.md and passkey.png."""
    t_start = time.perf_counter()
    validate(cfg)
    run_dir = Path(cfg.paths.output_dir)
    claim_run_dir(run_dir, cfg, "pipelines.extend")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device, dtype = _device(cfg), DTYPES[cfg.model.dtype]
    models_dir = Path(cfg.models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {"task": "context_extension", "scale": cfg.scale, "seed": cfg.seed,
                               "experiment": cfg.experiment_name, "context": cfg.model.context,
                               "target_context": cfg.extend.context, "device": device,
                               "threads": torch.get_num_threads()}
    loggers = StageLogger(instantiate_group(cfg.get("logger")))
    t0 = time.perf_counter()
    data = load_data(cfg)
    sizes = passkey_sizes(cfg, data)
    metrics.update(describe(data), time_data_s=time.perf_counter() - t0)

    base_path, base = base_stage(cfg, data, models_dir, device, loggers.stage("base", cfg.base.steps))
    metrics.update(base_model=str(base_path), base_reused=bool(base.get("reused")),
                   time_base_train_s=0.0 if base.get("reused") else base.get("stage_time_s", 0.0))
    if "train" in base:
        metrics.update({f"base_{k}": v for k, v in base["train"].items()})
    ppl_rows, key_rows = [], []

    def evaluate(method: str, path: Path) -> None:
        t = time.perf_counter()
        model = load_model(path, dtype, device)
        p, k = evaluate_stage(cfg, method, model, data, sizes)
        ppl_rows.extend(p)
        key_rows.extend(k)
        metrics[f"time_eval_{method}_s"] = time.perf_counter() - t
        metrics.update({f"ppl_{r['corpus']}_{r['length']}_{method}": r["perplexity"] for r in p})
        metrics.update({f"passkey_{r['target_tokens']}_{method}": r["accuracy"] for r in k})

    evaluate("base", base_path)
    at_c = [r["accuracy"] for r in key_rows if r["target_tokens"] == cfg.model.context]
    if at_c:
        metrics["base_passkey_at_context"] = at_c[0]
        metrics["base_retrieves"] = at_c[0] >= cfg.eval.min_base_passkey
        if not metrics["base_retrieves"]:
            log.warning("the base model retrieves %.0f%% of passkeys at its context %d (< %.0f%%): the "
                        "extension results measure little", 100 * at_c[0], cfg.model.context,
                        100 * cfg.eval.min_base_passkey)

    for recipe in cfg.extend.recipes:
        path, info = recipe_stage(cfg, recipe, base_path, base["key"], data, models_dir, device,
                                  loggers.stage(recipe, cfg.extend.steps))
        metrics.update({f"{recipe}_model": str(path), f"{recipe}_reused": bool(info.get("reused")),
                        f"{recipe}_trainable_params": info.get("trainable_params"),
                        f"time_train_{recipe}_s": 0.0 if info.get("reused") else info["stage_time_s"]})
        metrics.update({f"{recipe}_{k}": v for k, v in info.get("train", {}).items()})
        evaluate(recipe, path)

    write_csv(ppl_rows, PPL_FIELDS, run_dir / "perplexity.csv")
    write_csv(key_rows, PASSKEY_FIELDS, run_dir / "passkey.csv")
    tables = (f"## Perplexity (lower is better; bold = best extended model)\n\n{perplexity_table(ppl_rows)}\n\n"
              f"## Passkey accuracy ({cfg.eval.passkey_trials} trials; column = max prompt tokens "
              f"(mean))\n\n{passkey_table(key_rows)}\n")
    with open(run_dir / "tables.md", "x") as f:
        f.write(tables)
    plot_passkey(key_rows, run_dir / "passkey.png",
                 f"Passkey retrieval, {cfg.experiment_name} (C={cfg.model.context})", cfg.model.context)
    metrics["wall_time_s"] = time.perf_counter() - t_start
    for lg in loggers.loggers:
        lg.log_metrics({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, float)}, step=loggers.offset)
        lg.finalize("success")
    write_json_once(run_dir / "metrics.json", metrics)
    print(tables)
    return metrics


@hydra.main(version_base="1.3", config_path="../conf", config_name="extend")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar for every stage
    extend(cfg)


if __name__ == "__main__":
    if message := unknown_choice(sys.argv[1:]):
        sys.exit(message)
    main()
