"""The commit a piece of code ran at, and whether its tracked files had uncommitted changes."""

from __future__ import annotations

import hashlib
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


CODE = ("tape", "pipelines", "conf", "tests", "Makefile", "pyproject.toml", "requirements.txt")


def code_digest(root: Path, parts: tuple[str, ...] = CODE) -> str:
    """SHA-256 (first 16 hex digits) of the code under ``root``: every file of ``parts`` but
    caches, build metadata and hidden ones, by relative path and bytes. Two trees with one digest run the same
    code, whatever their git history (a device's copy of the tree may carry an older .git)."""
    digest = hashlib.sha256()
    for part in parts:
        top = root / part
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else []
        for path in files:
            rel = path.relative_to(root)
            if rel.suffix == ".pyc" or any(q == "__pycache__" or q.startswith(".") or q.endswith(".egg-info")
                                           for q in rel.parts):
                continue
            digest.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
