"""Distributed-training helpers that the trainer presets instantiate (conf/trainer/fsdp.yaml)."""

from __future__ import annotations

import importlib
from typing import Sequence

from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def module_wrap_policy(classes: Sequence[str]) -> ModuleWrapPolicy:
    """FSDP's auto-wrap policy: one shard unit per module of any of ``classes`` (dotted paths,
    e.g. our decoder ``Block`` and Hugging Face's ``LlamaDecoderLayer``). A callable policy,
    not a list: Hydra hands lists to FSDP as a ListConfig, which FSDP cannot call."""
    if not classes:
        raise ValueError("module_wrap_policy needs at least one class path")
    return ModuleWrapPolicy({import_class(path) for path in classes})


def import_class(path: str) -> type:
    """The class at a dotted path (``package.module.Class``), with an error naming the path."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"auto_wrap_policy: cannot import {path!r}: {err}") from None
