"""Registry of positional encodings: ``names()``, ``get(name)``, ``build(cfg)``.

One file per encoding; each registers its ``PositionalEncoding`` subclass under its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

from tape.pe.base import LayerPE, PositionalEncoding, PositionState

if TYPE_CHECKING:
    from tape.model.config import ModelConfig

_REGISTRY: dict[str, type[PositionalEncoding]] = {}
T = TypeVar("T", bound=type[PositionalEncoding])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make a PositionalEncoding available under ``name``."""

    def deco(cls: T) -> T:
        if name in _REGISTRY:
            raise ValueError(f"positional encoding {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def names() -> list[str]:
    """Sorted names of every registered positional encoding."""
    return sorted(_REGISTRY)


def get(name: str) -> type[PositionalEncoding]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown positional encoding {name!r}; choose one of {names()}") from None


def build(cfg: "ModelConfig") -> PositionalEncoding:
    """The model-level PE module selected by ``cfg.pe``."""
    return get(cfg.pe)(cfg)


# Importing the modules registers them.
from tape.pe import alibi, fire, nope, prope, randpe, rope, t5, tape, xpos  # noqa: E402,F401

__all__ = ["LayerPE", "PositionState", "PositionalEncoding", "build", "get", "names", "register"]
