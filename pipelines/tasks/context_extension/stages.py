"""The stages of the context-extension experiment, each skippable when its output exists:

1. ``base_stage``: pretrain a small RoPE Llama at ``model.context`` (text + passkey rows), or
   use ``model.pretrained_path``;
2. ``recipe_stage``: load the base, apply one named recipe for ``extend.context``, fine-tune,
   merge, save;
3. ``evaluate_stage``: perplexity per corpus and length, passkey accuracy per length, and MMLU /
   ARC accuracy when ``eval.multiple_choice_dir`` names their files.

Each training stage is one Lightning ``fit`` of :class:`~tape.lightning.HFCausalLMModule` with
the ``trainer`` preset (cpu, gpu, ddp, fsdp, num_nodes); its step counts, accumulation and
clipping come from the stage's section (``base`` or ``extend``). Trained models are saved under
``models_dir/<stage>-<hash of every setting that shaped it>/`` (written atomically): a later run
with the same settings reuses them (``reuse_models=true``), so a killed run resumes at the first
unfinished stage; inside a stage, ``<dir>.work/checkpoints/last.ckpt`` (every
``checkpoint_every`` steps) resumes training where it stopped. ``reuse_models=false`` trains
every stage from its start and replaces the saved model after success. Run results always go to
the new run's own directory.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf
from torch import nn

from pipelines.callbacks import OneLineModelSummary
from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import CONF_DIR
from pipelines.run_dirs import is_rank_zero
from pipelines.tasks.context_extension.checks import multiple_choice_task_config, plain, recipe_spec
from pipelines.tasks.context_extension.data import ExtensionData, mixed_batches
from tape.data.passkey import garbage_for_tokens
from tape.hf.io import build_llama, enable_checkpointing, is_saved_model, load_model, save_model
from tape.hf_names import DTYPES
from tape.lightning import HFCausalLMModule, IndexedBatchDataModule
from tape.lightning.distributed import trained_model

log = logging.getLogger("pipelines.context_extension")
# model.* keys that shape the base model (the shared model block of conf/config.yaml is ignored)
LLAMA_KEYS = ("context", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
              "rope_theta")
UNSHAPING = ("log_every", "checkpoint_every")  # section keys that do not change the trained model


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of JSON-serialisable settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _train_data(cfg: DictConfig) -> dict[str, Any]:
    """The data settings that shape training (not the evaluation files)."""
    return {k: v for k, v in plain(cfg.data).items() if k != "eval_files"}


def _section(section: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in plain(section).items() if k not in UNSHAPING}


def _hardware(cfg: DictConfig) -> dict[str, Any]:
    """Trainer settings that change the numbers: autocast, and the world size (batches are per
    process, so more processes train on more rows per step)."""
    t = cfg.trainer
    return {"precision": str(t.precision), "devices": str(t.devices), "num_nodes": int(t.get("num_nodes") or 1)}


def barrier() -> None:
    """Wait for every process (no-op in a single process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _reuse(path: Path, cfg: DictConfig, name: str, loggers: list[Any]) -> dict[str, Any] | None:
    """The stage info of an identical stage trained earlier, its training curves replayed to
    this run's loggers (so a run that reuses models still shows them); None = train it."""
    if not (cfg.reuse_models and is_saved_model(path)):
        return None
    log.info("reusing %s", path)
    info = json.loads((path / "stage.json").read_text())
    for point in info.get("history", []):
        values = {f"{name}/{k}": v for k, v in point.items() if k != "step"}
        for lg in loggers:
            lg.log_metrics(values, step=int(point["step"]))
    return {**info, "reused": True}


# ---------------------------------------------------------------------------- training
def make_trainer(cfg: DictConfig, section: DictConfig, work: Path, loggers: list[Any]) -> L.Trainer:
    """The ``trainer`` preset with the stage's steps, accumulation, clipping and checkpoints
    (``<work>/checkpoints/last.ckpt`` every ``checkpoint_every`` steps); no validation loop."""
    every = int(section.checkpoint_every)
    checkpoint = ModelCheckpoint(dirpath=work / "checkpoints", save_last=True, save_top_k=0,
                                 every_n_train_steps=every)
    return hydra.utils.instantiate(
        cfg.trainer, default_root_dir=str(work), max_steps=int(section.steps),
        accumulate_grad_batches=int(section.grad_accum), gradient_clip_val=section.grad_clip or None,
        log_every_n_steps=int(section.log_every), val_check_interval=None, check_val_every_n_epoch=None,
        limit_val_batches=0, num_sanity_val_steps=0, enable_progress_bar=False,
        logger=loggers or False, callbacks=[checkpoint, OneLineModelSummary()])


def train_stage(cfg: DictConfig, name: str, build: Callable[[], nn.Module], section: DictConfig,
                seq_len: int, garbage: tuple[int, int], data: ExtensionData, path: Path,
                meta: dict[str, Any], loggers: list[Any]) -> dict[str, Any]:
    """Fit ``build()`` on the mixed batches as one Lightning run, save it (merged) at ``path``
    on rank 0, and return its stage info. Resumes from ``<path>.work`` when a killed run left
    a checkpoint there (unless reuse_models=false)."""
    work = path.with_name(f"{path.name}.work")
    last = work / "checkpoints" / "last.ckpt"
    if not cfg.reuse_models and is_rank_zero():
        shutil.rmtree(work, ignore_errors=True)  # every stage from its start
    resume = last if cfg.reuse_models and last.is_file() else None  # every rank decides alike
    model = build()
    h = section
    module = HFCausalLMModule(model, stage=name, lr=h.lr, betas=tuple(h.betas), weight_decay=h.weight_decay,
                              warmup_steps=h.warmup_steps, schedule=h.schedule, min_lr_ratio=h.min_lr_ratio,
                              total_steps=h.steps, passkey_weight=h.passkey_weight, log_every=h.log_every)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_params = sum(p.numel() for p in model.parameters())
    batches = mixed_batches(data, seq_len, h.batch_size, h.passkey_rows, cfg.seed, garbage)
    trainer = make_trainer(cfg, section, work, loggers)
    if resume:
        log.info("%s: resuming from %s", name, resume)
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=IndexedBatchDataModule(batches), ckpt_path=resume)
    elapsed = time.perf_counter() - t0
    if trainer.interrupted:
        raise RuntimeError(f"training stage {name} was interrupted; rerun the same command to resume it")
    start = module.start_step
    stats = {k.split("/", 1)[1]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(f"{name}/")}
    stats.update(steps=trainer.global_step, train_time_s=elapsed,
                 steps_per_s=(trainer.global_step - start) / max(elapsed, 1e-9))
    info = {**meta, "train": stats, "trainable_params": trainable, "n_params": n_params, "stage_time_s": elapsed,
            "resumed_from": str(resume) if resume else None, "world_size": trainer.world_size, "reused": False,
            "history": module.history}
    full = trained_model(trainer, module, build, work / "full.ckpt")
    if full is not None:
        save_model(full, path, info, replace=not cfg.reuse_models)
        shutil.rmtree(work, ignore_errors=True)
    del trainer, module, model, full
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the next stage loads its own copy of the base
    barrier()  # the other ranks load this model in the next stage
    return info


def set_dtypes(model: nn.Module, frozen_dtype: torch.dtype) -> nn.Module:
    """Trainable parameters fp32 (AdamW's state follows them), frozen ones ``frozen_dtype``."""
    for p in model.parameters():
        p.data = p.data.float() if p.requires_grad else p.data.to(frozen_dtype)
    return model


def base_stage(cfg: DictConfig, data: ExtensionData, models_dir: Path,
               loggers: list[Any]) -> tuple[Path, dict[str, Any]]:
    """The base model's directory and its stage info (training losses, times, key)."""
    if cfg.model.pretrained_path:
        return Path(cfg.model.pretrained_path), {"pretrained": True, "key": str(cfg.model.pretrained_path)}
    m = cfg.model
    settings = {"model": {k: plain(m[k]) for k in LLAMA_KEYS}, "data": _train_data(cfg),
                "base": _section(cfg.base), "seed": cfg.seed, "garbage": base_garbage_range(cfg, data),
                "hardware": _hardware(cfg)}
    key = settings_key(settings)
    path = models_dir / f"base-{key}"
    if (info := _reuse(path, cfg, "base", loggers)) is not None:
        return path, info

    def build() -> nn.Module:
        return build_llama(data.vocab_size, m.hidden_size, m.intermediate_size, m.num_layers, m.num_heads,
                           m.num_kv_heads, m.context, m.rope_theta, seed=cfg.seed)

    meta = {"key": key, "settings": settings}
    return path, train_stage(cfg, "base", build, cfg.base, m.context, settings["garbage"], data, path,
                             meta, loggers)


def base_garbage_range(cfg: DictConfig, data: ExtensionData) -> tuple[int, int]:
    """Filler characters of the passkey rows of pretraining: prompts of
    base.passkey_min_tokens .. model.context tokens."""
    if not cfg.base.passkey_rows:
        return (0, 0)
    return (_garbage(data, cfg.base.passkey_min_tokens, "base.passkey_min_tokens"),
            _garbage(data, cfg.model.context, "model.context"))


def recipe_stage(cfg: DictConfig, name: str, base_path: Path, base_key: str, data: ExtensionData,
                 models_dir: Path, loggers: list[Any]) -> tuple[Path, dict[str, Any]]:
    """Apply the named recipe to the base for extend.context, fine-tune, merge and save."""
    from tape.hf.recipes import apply_recipe

    recipe, options = recipe_spec(cfg, name)
    settings = {"base": base_key, "recipe": recipe, "options": options, "extend": _section(cfg.extend),
                "data": _train_data(cfg), "seed": cfg.seed, "context": cfg.model.context,
                "frozen_dtype": cfg.model.frozen_dtype, "hardware": _hardware(cfg)}
    key = settings_key(settings)
    path = models_dir / f"{name}-{key}"
    if (info := _reuse(path, cfg, name, loggers)) is not None:
        return path, info
    frozen = DTYPES[cfg.model.frozen_dtype]

    def build() -> nn.Module:
        model = load_model(base_path, frozen)  # a 7B base is loaded once, in the frozen dtype
        torch.manual_seed(cfg.seed)  # TAPE's fresh maps and LoRA's A matrices
        model = apply_recipe(model, recipe, target_context=cfg.extend.context,
                             original_context=cfg.model.context, **options)
        if cfg.extend.gradient_checkpointing:
            enable_checkpointing(model)
        return set_dtypes(model.train(), frozen)

    garbage = (0, _garbage(data, cfg.extend.context, "extend.context")) if cfg.extend.passkey_rows else (0, 0)
    meta = {"key": key, "settings": settings}
    return path, train_stage(cfg, name, build, cfg.extend, cfg.extend.context, garbage, data, path, meta, loggers)


def _garbage(data: ExtensionData, tokens: int, key: str) -> int:
    try:
        return garbage_for_tokens(data.encode, tokens)
    except ValueError as err:
        raise PipelineConfigError(f"{key}: {err}; raise {key}") from None


def passkey_check(cfg: DictConfig, data: ExtensionData) -> None:
    """Fail before training when an evaluation passkey length cannot hold a prompt, with the
    same settings (BOS, answer prefix) that the evaluation uses."""
    from pipelines.tasks import passkey

    key_cfg = passkey_task_config(cfg)
    if key_cfg.get("lengths"):
        try:
            passkey.sizes(key_cfg, _tokenizer(data), data.bos_id is not None and bool(key_cfg.bos))
        except PipelineConfigError as err:
            raise PipelineConfigError(str(err).replace("task.lengths", "eval.passkey_lengths")) from None


def passkey_task_config(cfg: DictConfig) -> DictConfig:
    """task=passkey's settings from the ``eval`` section."""
    e = cfg.eval
    sizes = ({"filler_chars": list(e.passkey_filler_chars)} if e.get("passkey_filler_chars")
             else {"lengths": list(e.passkey_lengths)})
    return task_config("passkey", trials=e.passkey_trials, seed=e.passkey_seed, draws=e.passkey_draws,
                       bos=e.passkey_bos, answer_prefix=e.passkey_answer_prefix,
                       kv_cache=e.passkey_kv_cache, **sizes)


def _tokenizer(data: ExtensionData) -> Any:
    from tape.data.tokenizer import TextTokenizer

    return TextTokenizer(data.encode, data.bos_id, "context extension")


# ---------------------------------------------------------------------------- evaluation
def evaluate_stage(cfg: DictConfig, method: str, model: nn.Module, data: ExtensionData
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(perplexity rows, passkey rows, MMLU / ARC item records) of one model, through the
    task=perplexity, task=passkey and task=multiple_choice evaluations (the same code as
    ``pipelines.evaluate ... task=passkey``); no MMLU / ARC records without eval.multiple_choice_dir."""
    from pipelines.tasks import multiple_choice, passkey, perplexity

    e = cfg.eval
    ppl = []
    if data.eval_tokens:  # no data.eval_files: passkey retrieval only
        ppl_cfg = task_config("perplexity", lengths=list(e.perplexity_lengths), stride=e.stride,
                              max_windows=e.max_windows, batch_size=e.batch_size)
        ppl = [{"method": method, **r} for r in perplexity.rows(model, ppl_cfg, data.eval_tokens)]
    for r in ppl:
        log.info("%s %s L=%d ppl %.3f", method, r["corpus"], r["length"], r["perplexity"])
    keys = []
    for r in passkey.rows(model, passkey_task_config(cfg), _tokenizer(data)):  # a filler size in characters is labelled by its longest prompt
        keys.append({**r, "method": method, "target_tokens": r["target_tokens"] or r["max_tokens"]})
        log.info("%s passkey <=%d tokens: %.2f", method, keys[-1]["target_tokens"], r["accuracy"])
    choice = []
    if (mc_cfg := multiple_choice_task_config(cfg)) is not None:
        choice = [{"method": method, **r} for r in multiple_choice.records(model, mc_cfg, _tokenizer(data))]
    for r in multiple_choice.summary(choice):
        log.info("%s %s %s acc %.2f", method, r["benchmark"], r["group"], r["acc"])
    return ppl, keys, choice


def task_config(name: str, **values: Any) -> DictConfig:
    """conf/task/<name>.yaml with ``values`` set: an evaluation task's settings from code."""
    return OmegaConf.merge(OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml"), values)
