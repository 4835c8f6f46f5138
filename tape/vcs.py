"""The commit a piece of code ran at, and whether its tracked files had uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def git_state(root: Path, paths: tuple[str, ...] = ("tape", "pipelines/benchmark.py", "conf/benchmark.yaml")) -> dict[str, Any]:
    """Commit and whether the code the benchmark runs (``paths``) had uncommitted changes."""
    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def commit_label(root: Path) -> str:
    """The checked-out commit, "+dirty" appended when tracked files outside results/ had
    uncommitted changes (results/ is what the report writes, not code); "unknown" outside a
    git checkout. What run directories and report stamps record."""
    state = git_state(root, paths=(".", ":(exclude)results"))
    if not state["commit"]:
        return "unknown"
    return state["commit"] + ("+dirty" if state["dirty"] else "")
