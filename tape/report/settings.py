"""Which runs may be pooled: a run's *setting* is its resolved config.yaml minus the seed and the
keys that do not change the experiment (NOT_SETTINGS, the one place they are listed). Runs are
pooled as seeds only when their settings are equal; any other run is shown apart, with the keys
that differ named (DESIGN.md "Evidence").
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

# Dotted config keys (a key covers everything under it) that never change what a run measures:
# the pooling dimension itself, where outputs go, logging and progress display, how a run was
# resumed (a resumed run replays the uninterrupted one exactly) and CPU threading.
NOT_SETTINGS: tuple[str, ...] = (
    "seed",
    "paths", "hydra", "logger", "callbacks",
    "ckpt_path", "evaluate",
    "trainer.default_root_dir", "trainer.enable_progress_bar", "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "threads", "reuse_models", "models_dir",
)
MAX_SHOWN = 3  # differing keys named in a label; the rest are counted


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"trainer": {"max_steps": 6}} -> {"trainer.max_steps": 6}; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _ignored(key: str, ignore: Iterable[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in ignore)


def setting_values(config: Mapping[str, Any], ignore: Iterable[str] = NOT_SETTINGS) -> dict[str, Any]:
    """The flattened config without the keys in ``ignore``."""
    ignore = tuple(ignore)
    return {k: v for k, v in flatten(config).items() if not _ignored(k, ignore)}


def setting_hash(config: Mapping[str, Any], ignore: Iterable[str] = NOT_SETTINGS) -> str:
    """12 hex digits naming the setting; equal for runs that differ only in ignored keys."""
    text = json.dumps(setting_values(config, ignore), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def differences(config: Mapping[str, Any], reference: Mapping[str, Any],
                ignore: Iterable[str] = NOT_SETTINGS) -> dict[str, Any]:
    """The keys where ``config``'s setting differs from ``reference``'s, with ``config``'s values
    (a key ``reference`` has and ``config`` lacks shows as None)."""
    a, b = setting_values(config, ignore), setting_values(reference, ignore)
    return {k: a.get(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def describe(diff: Mapping[str, Any]) -> str:
    """``trainer.max_steps=600, optim.lr=0.003`` (at most MAX_SHOWN keys, then "+N more")."""
    shown = [f"{k}={v}" for k, v in list(diff.items())[:MAX_SHOWN]]
    more = len(diff) - MAX_SHOWN
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "") if diff else "same setting"
