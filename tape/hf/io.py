"""Build, save and reload the Hugging Face Llama models of the context-extension experiment.

Saved models are plain ``save_pretrained`` directories: LoRA adapters are merged first (as the
paper evaluated LoRA, LongLoRA and theta scaling), LongLoRA's training-only shifted sparse
attention is swapped back to SDPA, and TAPE models reload as ``TapeLlamaForCausalLM``.
Directories are written under a temporary name and renamed, so a killed run never leaves a
half-written model that a later run would reuse.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn


def build_llama(vocab_size: int, hidden_size: int, intermediate_size: int, num_layers: int,
                num_heads: int, num_kv_heads: int, context: int, rope_theta: float = 10000.0,
                seed: int = 0, **extra: Any) -> nn.Module:
    """A randomly initialised RoPE ``LlamaForCausalLM`` (untied embeddings, as Llama-2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=context, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        bos_token_id=1, eos_token_id=2, pad_token_id=0, **extra,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def enable_checkpointing(model: nn.Module) -> None:
    """Recompute decoder layers in backward: transformers >= 5.23 names it
    ``activation_checkpointing_enable``, earlier releases ``gradient_checkpointing_enable``."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def mergeable(model: nn.Module) -> nn.Module:
    """The plain model to save or evaluate: peft adapters merged, full attention at inference."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if getattr(model.config, "_attn_implementation", None) not in (None, "sdpa", "eager"):
        model.set_attn_implementation("sdpa")
    return model


def save_model(model: nn.Module, path: str | os.PathLike, meta: dict[str, Any],
               replace: bool = False) -> nn.Module:
    """Merge (see :func:`mergeable`) and save to ``path`` with ``meta`` as ``stage.json``;
    returns the merged model. ``path`` must not exist yet, unless ``replace``: then the new
    model is written in full first and swapped in by renames, so a crash never leaves a partial
    model at ``path``."""
    path = Path(path)
    if path.exists() and not replace:
        raise FileExistsError(f"{path} exists; saved models are never overwritten (pass replace=True "
                              "to retrain over it)")
    model = mergeable(model)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / "stage.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    if path.exists():
        old = path.with_name(f"{path.name}.old-{os.getpid()}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old)
    else:
        tmp.rename(path)
    return model


def is_saved_model(path: str | os.PathLike) -> bool:
    """True for a complete directory written by :func:`save_model`."""
    return (Path(path) / "stage.json").is_file() and (Path(path) / "config.json").is_file()


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> nn.Module:
    """Reload a saved model (a TAPE Llama or a plain Llama, read from config.json)."""
    from transformers import LlamaForCausalLM

    from tape.hf.llama import TapeLlamaForCausalLM

    arch = json.loads((Path(path) / "config.json").read_text()).get("architectures") or []
    cls = TapeLlamaForCausalLM if "TapeLlamaForCausalLM" in arch else LlamaForCausalLM
    return cls.from_pretrained(path, dtype=dtype).to(device).eval()
