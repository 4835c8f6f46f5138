"""One provenance line per table: the runs' commits, launch times and commands (command.txt),
the commit and date of the rendering, and the machine (CPU count and model).

Run directories do not record the machine they ran on, so the machine named is the one that
rendered the report; ``make reproduce-table`` runs and renders on the same machine.
"""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import torch

from tape.bench.machine import git_state, machine_info
from tape.report.runs import Run

REPO = Path(__file__).resolve().parents[2]
MAX_COMMANDS = 3


def git_head(repo: Path = REPO) -> str:
    """The checked-out commit (with "+dirty" when tracked files changed), or "unknown"."""
    state = git_state(repo, paths=())  # the whole repository
    if not state["commit"]:
        return "unknown"
    return state["commit"][:12] + ("+dirty" if state["dirty"] else "")


def machine_line() -> str:
    """CPU count and model (and the GPU when torch sees one) of this machine."""
    info = machine_info(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ""
    return f"{info['cpu_count']} CPU cores, {info['cpu']}{gpu}, {platform.system()} {platform.machine()}"


def render_stamp(now: datetime | None = None) -> str:
    """Commit, date and machine of this rendering."""
    when = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    return f"rendered at commit {git_head()} on {when}; machine: {machine_line()}"


def _short(commit: str) -> str:
    return commit[:12] if commit and commit != "None" else "unknown"


def provenance_line(runs: Iterable[Run], stamp: str) -> str:
    """The runs' commits, launch times and (up to MAX_COMMANDS) commands, then ``stamp``."""
    runs = list(runs)
    if not runs:
        return f"no finished run; {stamp}"
    commits = sorted({_short(r.commit) for r in runs})
    times = sorted(r.started for r in runs if r.started)
    commands = list(dict.fromkeys(r.command for r in runs if r.command))
    shown = "; ".join(f"`{c}`" for c in commands[:MAX_COMMANDS])
    more = f" (+{len(commands) - MAX_COMMANDS} more, see runs.csv)" if len(commands) > MAX_COMMANDS else ""
    when = f"launched {times[0]}" + (f" .. {times[-1]}" if len(times) > 1 else "") if times else ""
    parts = [f"{len(runs)} run(s) at commit(s) {', '.join(commits)}", when,
             f"command(s): {shown}{more}" if commands else "command.txt missing", stamp]
    return "; ".join(p for p in parts if p)
