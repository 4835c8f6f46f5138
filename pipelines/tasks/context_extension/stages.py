"""The stages of the context-extension experiment, each skippable when its output exists:

1. ``base_stage``: pretrain a small RoPE Llama at ``model.context`` (text + passkey rows), or
   use ``model.pretrained_path``;
2. ``recipe_stage``: load the base, apply one recipe for ``extend.context``, fine-tune, merge,
   save;
3. ``evaluate_stage``: perplexity per corpus and length, passkey accuracy per length.

Trained models are saved under ``models_dir/<stage>-<hash of every setting that shaped it>/``
(written atomically): a later run with the same settings reuses them (``reuse_models=true``),
so a killed run resumes at the first unfinished stage. Run results always go to the new run's
own directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from pipelines.context_extension_data import ExtensionData, mixed_batches
from pipelines.utils import PipelineConfigError
from tape.data.passkey import garbage_for_tokens, passkey_accuracy
from tape.hf.io import build_llama, is_saved_model, load_model, save_model
from tape.hf.train_loop import train_loop
from tape.metrics.perplexity import sliding_window_perplexity

log = logging.getLogger("pipelines.extend")
LogFn = Callable[[int, dict[str, float]], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of JSON-serialisable settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _train_data(cfg: DictConfig) -> dict[str, Any]:
    """The data settings that shape training (not the evaluation files)."""
    return {k: v for k, v in _plain(cfg.data).items() if k != "eval_files"}


def _train(cfg: DictConfig, model: nn.Module, data: ExtensionData, section: DictConfig,
           seq_len: int, garbage_range: tuple[int, int], device: str, log_fn: LogFn) -> dict[str, Any]:
    batches = mixed_batches(data, seq_len, section.batch_size, section.passkey_rows, cfg.seed, garbage_range)
    return train_loop(model, batches, section.steps, section.lr, section.warmup_steps, section.schedule,
                      section.min_lr_ratio, section.weight_decay, betas=tuple(section.betas), grad_clip=section.grad_clip,
                      grad_accum=section.grad_accum, passkey_weight=section.passkey_weight,
                      device=device, log=log_fn, log_every=section.log_every)


def _reuse(path: Path, cfg: DictConfig) -> dict[str, Any] | None:
    if cfg.reuse_models and is_saved_model(path):
        log.info("reusing %s", path)
        return {**json.loads((path / "stage.json").read_text()), "reused": True}
    return None


def base_stage(cfg: DictConfig, data: ExtensionData, models_dir: Path, device: str,
               log_fn: LogFn) -> tuple[Path, dict[str, Any]]:
    """The base model's directory and its stage info (training losses, times, key)."""
    if cfg.model.pretrained_path:
        return Path(cfg.model.pretrained_path), {"pretrained": True, "key": str(cfg.model.pretrained_path)}
    settings = {"model": _plain(cfg.model), "data": _train_data(cfg), "base": _plain(cfg.base),
                "seed": cfg.seed, "garbage": base_garbage_range(cfg, data)}
    key = settings_key(settings)
    path = models_dir / f"base-{key}"
    if (info := _reuse(path, cfg)) is not None:
        return path, info
    m = cfg.model
    model = build_llama(data.vocab_size, m.hidden_size, m.intermediate_size, m.num_layers, m.num_heads,
                        m.num_kv_heads, m.context, m.rope_theta, seed=cfg.seed).to(device)
    t0 = time.perf_counter()
    stats = _train(cfg, model, data, cfg.base, m.context, settings["garbage"], device, log_fn)
    info = {"key": key, "settings": settings, "train": stats, "n_params": model.num_parameters(),
            "stage_time_s": time.perf_counter() - t0, "reused": False}
    save_model(model, path, info)
    return path, info


def base_garbage_range(cfg: DictConfig, data: ExtensionData) -> tuple[int, int]:
    """Filler characters of the passkey rows of pretraining: prompts of
    base.passkey_min_tokens .. model.context tokens."""
    if not cfg.base.passkey_rows:
        return (0, 0)
    return (_garbage(data, cfg.base.passkey_min_tokens, "base.passkey_min_tokens"),
            _garbage(data, cfg.model.context, "model.context"))


def recipe_stage(cfg: DictConfig, recipe: str, base_path: Path, base_key: str, data: ExtensionData,
                 models_dir: Path, device: str, log_fn: LogFn) -> tuple[Path, dict[str, Any]]:
    """Apply ``recipe`` to the base for extend.context, fine-tune, merge and save."""
    from tape.hf.recipes import apply_recipe, trainable_parameters

    options = _plain(cfg.recipes[recipe])
    settings = {"base": base_key, "recipe": recipe, "options": options, "extend": _plain(cfg.extend),
                "data": _train_data(cfg), "seed": cfg.seed, "context": cfg.model.context}
    key = settings_key(settings)
    path = models_dir / f"{recipe}-{key}"
    if (info := _reuse(path, cfg)) is not None:
        return path, info
    dtype = DTYPES[cfg.model.dtype]
    model = load_model(base_path, dtype, device)
    torch.manual_seed(cfg.seed)  # TAPE's fresh maps and LoRA's A matrices
    model = apply_recipe(model, recipe, target_context=cfg.extend.context,
                         original_context=cfg.model.context, **options)
    if cfg.extend.gradient_checkpointing:  # transformers 5 name, else the older one
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    trainable = trainable_parameters(model)
    t0 = time.perf_counter()
    garbage = (0, _garbage(data, cfg.extend.context, "extend.context")) if cfg.extend.passkey_rows else (0, 0)
    stats = _train(cfg, model, data, cfg.extend, cfg.extend.context, garbage, device, log_fn)
    info = {"key": key, "settings": settings, "train": stats, "trainable_params": sum(trainable.values()),
            "stage_time_s": time.perf_counter() - t0, "reused": False}
    save_model(model, path, info)
    return path, info


def _garbage(data: ExtensionData, tokens: int, key: str) -> int:
    try:
        return garbage_for_tokens(data.encode, tokens)
    except ValueError as err:
        raise PipelineConfigError(f"{key}: {err}; raise {key}") from None


def passkey_sizes(cfg: DictConfig, data: ExtensionData) -> dict[int, int]:
    """Target prompt length (tokens) -> filler characters."""
    return {int(n): _garbage(data, int(n), "eval.passkey_lengths") for n in cfg.eval.passkey_lengths}


def evaluate_stage(cfg: DictConfig, method: str, model: nn.Module, data: ExtensionData,
                   sizes: dict[int, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(perplexity rows, passkey rows) of one model."""
    e = cfg.eval
    ppl, keys = [], []
    for corpus, tokens in data.eval_tokens.items():
        for length in e.perplexity_lengths:
            r = sliding_window_perplexity(model, tokens, int(length), e.stride, e.batch_size, e.max_windows)
            ppl.append({"method": method, "corpus": corpus, "length": int(length), **r})
            log.info("%s %s L=%d ppl %.3f", method, corpus, length, r["perplexity"])
    for target, n_garbage in sizes.items():
        r = passkey_accuracy(model, data.encode, n_garbage, e.passkey_trials, e.passkey_seed)
        keys.append({"method": method, "target_tokens": target, "n_garbage": n_garbage, **r})
        log.info("%s passkey <=%d tokens: %.2f", method, target, r["accuracy"])
    return ppl, keys
