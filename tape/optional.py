"""Packages imported only where a run needs them (``datasets``, ``rouge-score``, ``wandb``): a missing
one is named with the line that installs it, before a run claims its directory and where it is
imported; the tests that need one skip without it (tests/conftest.py)."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

PINS = {"datasets": "datasets==5.2.0", "rouge_score": "rouge-score==0.1.2", "wandb": "wandb==0.31.0"}
"""Import name -> requirements.txt's pin (a test keeps them equal)."""


def missing(module: str) -> str | None:
    """None when ``module`` imports here; else what installs it."""
    if importlib.util.find_spec(module) is not None:
        return None
    return (f"the {PINS[module].split('==')[0]} package is not installed: pip install {PINS[module]} (a node "
            "without network: docs/devices.md, 'A GPU node without network')")


def require(module: str, purpose: str) -> ModuleType:
    """``import module`` (``rouge_score.rouge_scorer``: a module of a package in PINS), or a
    ModuleNotFoundError that says what needs its package and how to install it."""
    package = module.split(".")[0]
    why = missing(package)
    if why is not None:
        raise ModuleNotFoundError(f"{purpose} needs {why}", name=package)
    return importlib.import_module(module)
