"""Provenance lines: under an experiment's table a brief one (the runs' commit range, a link to
their records and to runs.csv); in the claims detail the full one (commits, launch times, machines
and commands from command.txt). Runs made at a working tree with uncommitted changes are flagged,
then comes the rendering stamp. The stamp names no date, machine or commit, so that a render of the same records is the
same bytes anywhere; it says when the rendering code itself had uncommitted changes.

Runs made before command.txt recorded a machine are counted as "machine not recorded".
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from tape.vcs import commit_label
from tape.report.runs import Run

if TYPE_CHECKING:
    from tape.report.document import Context

REPO = Path(__file__).resolve().parents[2]
MAX_COMMANDS = 3


def git_head(repo: Path = REPO) -> str:
    """The checked-out commit, short (with "+dirty" when code outside results/ changed), or "unknown"."""
    return _short(commit_label(repo))


DIRTY_RENDER = ("**rendered by code with uncommitted changes (+dirty): this render may not be "
                "reproducible from any commit**")


def render_stamp(commit: str | None = None) -> str:
    """How this rendering was made: by committed code, or (flagged) by a dirty working tree."""
    commit = git_head() if commit is None else commit
    return DIRTY_RENDER if "+dirty" in commit else "rendered by committed code"


def _short(commit: str) -> str:
    """12 hex digits of a commit label, keeping a "+dirty" mark; "unknown" when none was recorded."""
    if not commit or commit in ("None", "unknown"):
        return "unknown"
    sha, plus, mark = commit.partition("+")
    return sha[:12] + plus + mark


def _when(started: str) -> tuple[int, float | str]:
    """Sort key of a command.txt time (time.ctime, e.g. "Sun Nov 22 23:57:46 2026"): in time
    order, so a range reads earliest .. latest; unparsable stamps sort last, as text."""
    try:
        return 0, datetime.strptime(started, "%a %b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        return 1, started


def provenance_line(runs: Iterable[Run], stamp: str) -> str:
    """The runs' commits, launch times, machines and (up to MAX_COMMANDS) commands, then ``stamp``."""
    runs = list(runs)
    if not runs:
        return f"no finished run; {stamp}"
    commits = sorted({_short(r.commit) for r in runs})
    times = sorted((r.started for r in runs if r.started), key=_when)
    commands = list(dict.fromkeys(r.command for r in runs if r.command))
    shown = "; ".join(f"`{c}`" for c in commands[:MAX_COMMANDS])
    more = f" (+{len(commands) - MAX_COMMANDS} more, see runs.csv)" if len(commands) > MAX_COMMANDS else ""
    when = f"launched {times[0]}" + (f" .. {times[-1]}" if len(times) > 1 else "") if times else ""
    machines = sorted({r.machine or "machine not recorded" for r in runs})
    dirty = sum("+dirty" in r.commit for r in runs)
    flag = (f"**{dirty} of them made at a working tree with uncommitted changes (+dirty): "
            "their code is not exactly any commit**" if dirty else "")
    parts = [f"{len(runs)} run(s) at commit(s) {', '.join(commits)}", flag, when,
             f"ran on: {' | '.join(machines)}",
             f"command(s): {shown}{more}" if commands else "command.txt missing", stamp]
    return "; ".join(p for p in parts if p)


def provenance_brief(runs: Iterable[Run], stamp: str, records: str = "", inventory: str = "") -> str:
    """One short line: the runs, their first .. last commit in launch order, any +dirty ones,
    a link to ``records`` (the folder they were read from) and to ``inventory`` (runs.csv: every
    run's command, launch time and machine), then ``stamp``."""
    runs = sorted(runs, key=lambda r: _when(r.started))
    if not runs:
        return f"no finished run; {stamp}"
    commits = list(dict.fromkeys(_short(r.commit) for r in runs))
    span = commits[0] if len(commits) == 1 else f"{commits[0]} .. {commits[-1]} ({len(commits)} commits)"
    dirty = sum("+dirty" in r.commit for r in runs)
    parts = [f"{len(runs)} run(s) at commit(s) {span}",
             f"**{dirty} of them made at a working tree with uncommitted changes (+dirty)**" if dirty else "",
             f"records: [{records}]({records})" if records else "",
             f"commands, times and machines: [{inventory}]({inventory})" if inventory else "", stamp]
    return "; ".join(p for p in parts if p)


def section_provenance(runs: Iterable[Run], ctx: "Context") -> str:
    """The line under an experiment's table: the brief form, linking the records and runs.csv."""
    return provenance_brief(runs, ctx.stamp, ctx.records_link, "runs.csv")
