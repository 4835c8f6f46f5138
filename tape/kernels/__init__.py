"""Custom attention kernels. ``triton_attention`` needs triton (import it only where available:
``tape.kernels.triton_available()`` says whether it is)."""

from __future__ import annotations

import importlib.util


_TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None and importlib.util.find_spec("numpy") is not None
"""Looked up once at import: dynamo (torch 2.11) refuses to trace ``find_spec``."""


def triton_available() -> bool:
    """True when triton (and numpy, which its CPU interpreter needs) can be imported."""
    return _TRITON_AVAILABLE
