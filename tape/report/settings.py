"""Which runs may be pooled: a run's *setting* is its resolved config.yaml minus the seed and the
keys that do not change the experiment (NOT_SETTINGS, the one place they are listed). Runs are
pooled as seeds only when their settings are equal; any other run is shown apart, with the keys
that differ named (docs/DESIGN.md "Evidence").
"""

from __future__ import annotations

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
    "task.eval.min_base_passkey",  # a reporting threshold: it flags a run, never changes one
    "task.data_dir", "data.data_dir",  # where this checkout keeps the local corpus, not which corpus
    "task.pretrained_run",  # each seed's own pretraining run; its model and PE stay in model.*, pe.*
)
MAX_SHOWN = 3  # differing keys named in a label; the rest are counted

_NO_YARN = {"pe.rope_yarn_factor": 1.0, "pe.rope_yarn_original_length": None}
ADDED_OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "tape": {"pe.tape_equivariant": True, "pe.tape_tensorial": True, "pe.tape_position_size": None, **_NO_YARN},
    **{pe: _NO_YARN for pe in ("rope", "prope", "xpos", "randpe")},
}
"""Per PE (``pe.name``), options added after runs were recorded, with the value those runs had in
effect (the behaviour before the option existed), and options an ablation varies, with their
default (TAPE's PE-MLP width). A config without the key has that value: its run pools with runs
that set it so, never with runs that set it otherwise (an ablation), and a comparison arm or plan
step that does not name the key asks for it."""


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
    """The flattened config without the keys in ``ignore``, with the ``ADDED_OPTIONS`` its PE
    lacks at their former values."""
    ignore = tuple(ignore)
    pe = config.get("pe")
    added = ADDED_OPTIONS.get(pe.get("name") if isinstance(pe, Mapping) else pe, {})
    flat = {**added, **flatten(config)}
    return {k: v for k, v in flat.items() if not _ignored(k, ignore)}


def differences(config: Mapping[str, Any], reference: Mapping[str, Any],
                ignore: Iterable[str] = NOT_SETTINGS) -> dict[str, Any]:
    """The keys both settings have where ``config``'s value differs from ``reference``'s, with
    ``config``'s values. A key only one of them has is an option added (or dropped) since the
    older run, whose default kept the old behaviour: it does not count as a difference."""
    return setting_differences(setting_values(config, ignore), setting_values(reference, ignore))


def setting_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``differences`` of two settings already flattened (``setting_values``)."""
    return {k: a[k] for k in sorted(a.keys() & b.keys()) if a[k] != b[k]}


def same_setting(config: Mapping[str, Any], reference: Mapping[str, Any],
                 ignore: Iterable[str] = NOT_SETTINGS) -> bool:
    """Whether two runs measure the same thing (and may be pooled as seeds)."""
    return not differences(config, reference, ignore)


def describe(diff: Mapping[str, Any]) -> str:
    """``trainer.max_steps=600, optim.lr=0.003`` (at most MAX_SHOWN keys, then "+N more")."""
    shown = [f"{k}={v}" for k, v in list(diff.items())[:MAX_SHOWN]]
    more = len(diff) - MAX_SHOWN
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "") if diff else "same setting"
