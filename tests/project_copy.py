"""A copy of the project in a temporary folder with a few files added (the extension tests: a
new encoding, a new task), and a Python command run inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from warm_python import run_module

REPO = Path(__file__).resolve().parents[1]
COPIED = ("tape", "conf", "pipelines", "tests")


def copy_project(root: Path, added: Mapping[str, str]) -> Path:
    """tape/, conf/, pipelines/, tests/ and pyproject.toml copied into ``root``, plus ``added``
    (path relative to the project -> text); returns ``root``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in COPIED:
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for path, text in added.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def run_python(root: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python *args`` in ``root``, its output captured (``-m``: forked warm, tests/warm_python.py)."""
    if args[:1] == ("-m",):
        return run_module(args[1], args[2:], root, timeout=timeout)
    return subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True,
                          timeout=timeout)
