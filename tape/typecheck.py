"""Type checks of config values against their dataclass annotations (bool is no number; an int
passes for a float), so that ``model.abacus=no`` or ``model.d_model=abc`` is named, not taken."""

from __future__ import annotations

import types
import typing
from typing import Any


def type_problems(annotated: Any, values: dict[str, Any], context: str = "") -> list[str]:
    """``key=value (type) is not one of: ...`` for each value not of the type ``annotated`` (a
    dataclass, or a function's parameters) declares for its key."""
    hints = typing.get_type_hints(annotated)
    out = []
    for key, value in values.items():
        allowed = _allowed(hints[key])
        if not any(_is(value, kind) for kind in allowed):
            want = ", ".join("null" if k is type(None) else k.__name__ if isinstance(k, type) else repr(k)
                             for k in allowed)
            out.append(f"{key}={value!r} ({type(value).__name__}) is not one of: {want}{context}")
    return out


def _allowed(hint: Any) -> list[Any]:
    """A type hint as a flat list of types and literal values (a generic alias: its origin)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return list(typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return [kind for arg in typing.get_args(hint) for kind in _allowed(arg)]
    return [origin or hint]


def _is(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of type ``kind`` (bool is no number) or equals literal ``kind``."""
    if not isinstance(kind, type):  # a literal value
        return type(value) is type(kind) and value == kind
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in (list, tuple):  # a config's sequences arrive as lists
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)
