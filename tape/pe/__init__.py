"""Registry of positional encodings: ``names()``, ``get(name)``, ``options(cfg)``, ``build(cfg)``.

One file per encoding: every module in this package is imported on first use of the package
and registers its ``PositionalEncoding`` subclass under its name, with its ``Options``.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Iterable

from tape.errors import ConfigError
from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionLimit, PositionState
from tape.registry import Registry
from tape.typecheck import type_problems

if TYPE_CHECKING:
    from tape.model.config import ModelConfig

_ENCODINGS: Registry[type[PositionalEncoding]] = Registry(__name__, "positional encoding")
register = _ENCODINGS.register  # class decorator: make a PositionalEncoding available under a name


def names() -> list[str]:
    """Sorted names of every registered positional encoding."""
    return _ENCODINGS.names()


def get(name: str) -> type[PositionalEncoding]:
    cls = _ENCODINGS.find(name)
    if cls is None:
        raise KeyError(f"unknown positional encoding {name!r}; choose one of {names()}")
    return cls


def display(name: str) -> str:
    """The paper's spelling of an encoding's name (the name itself when it has none)."""
    cls = _ENCODINGS.find(name)
    return (cls.display or name) if cls is not None else name


def variant(name: str, option: str, value: Any) -> str | None:
    """The display name of the method that ``option=value`` makes of encoding ``name`` (None:
    the encoding's own)."""
    cls = _ENCODINGS.find(name)
    return cls.variants.get(option, {}).get(str(value)) if cls is not None else None


def option_names() -> set[str]:
    """Every option any registered encoding declares."""
    return {key for cls in _ENCODINGS for key in cls.Options.names()}


def options(cfg: "ModelConfig") -> PEOptions:
    """``cfg.pe_options`` parsed by the encoding's Options; ConfigError naming every problem."""
    problems = _name_problems(cfg.pe)
    if problems:
        raise ConfigError("invalid ModelConfig:\n  - " + "\n  - ".join(problems))
    cls = get(cfg.pe)
    valid = cls.Options.names()
    unknown = [key for key in cfg.pe_options if key not in valid]
    if unknown:
        raise ConfigError("invalid ModelConfig:\n  - " + "\n  - ".join(
            _unknown_option(cfg.pe, key, valid) for key in unknown))
    problems = type_problems(cls.Options, cfg.pe_options, f" (pe={cfg.pe!r})")
    if problems:
        raise ConfigError("invalid ModelConfig:\n  - " + "\n  - ".join(problems))
    opts = cls.Options(**cfg.pe_options)
    problems = opts.problems(cfg) + _shape_problems(cls, cfg)
    if problems:
        raise ConfigError("invalid ModelConfig:\n  - " + "\n  - ".join(problems))
    return opts


def check(cfg: "ModelConfig") -> None:
    """Raise ConfigError when ``cfg.pe`` or its options cannot work (ModelConfig checks sizes)."""
    options(cfg)


def build(cfg: "ModelConfig") -> PositionalEncoding:
    """The model-level PE module selected by ``cfg.pe``, its options checked."""
    opts = options(cfg)
    return get(cfg.pe)(cfg, opts)


def position_limit(cfg: "ModelConfig") -> PositionLimit | None:
    """The trained position range of an absolute-position PE (None: any position works)."""
    opts = options(cfg)
    return get(cfg.pe).position_limit(cfg, opts)


def legacy_options(values: dict[str, Any]) -> dict[str, Any]:
    """A ModelConfig dict in the old flat layout (``tape_post_attn=...`` beside the sizes, as in
    checkpoints before ``pe_options``) -> the current layout: the chosen encoding's options move
    into ``pe_options``; the other encodings' option keys are dropped."""
    if "pe_options" in values:
        return dict(values)
    flat = option_names()
    chosen = set(get(values.get("pe", "rope")).Options.names()) if values.get("pe", "rope") in _ENCODINGS else set()
    kept = {k: v for k, v in values.items() if k not in flat}
    kept["pe_options"] = {k: v for k, v in values.items() if k in chosen}
    return kept


def _name_problems(name: str) -> list[str]:
    if name in _ENCODINGS:
        return []
    return [f"pe={name!r} is not a registered positional encoding; choose one of {names()}"]


def _unknown_option(pe: str, key: str, valid: Iterable[str]) -> str:
    near = difflib.get_close_matches(key, list(valid), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (f"pe_options has {key!r}, which pe={pe!r} does not take{hint} "
            f"(its options: {sorted(valid) or 'none'})")


def _shape_problems(cls: type[PositionalEncoding], cfg: "ModelConfig") -> list[str]:
    if cls.rotary and cfg.n_heads > 0 and cfg.d_model % cfg.n_heads == 0 and cfg.head_dim % 2:
        return [f"head dim d_model/n_heads={cfg.head_dim} is odd but pe={cfg.pe!r} rotates "
                "pairs of channels; choose d_model and n_heads so that the head dim is even"]
    return []


_ENCODINGS.import_all()

__all__ = ["LayerPE", "PEOptions", "PositionLimit", "PositionState", "PositionalEncoding", "build",
           "check", "display", "get", "legacy_options", "names", "option_names", "options",
           "position_limit", "register", "variant"]
