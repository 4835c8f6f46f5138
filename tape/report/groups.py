"""Group runs into table rows: per PE (or method), the newest finished run of each seed, and
the unfinished runs, so a cell either summarises finished seeds or says why it has no number."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tape.report.runs import Run, latest_finished
from tape.report.stats import Missing, Summary, summarize

NOT_RUN = "not run"


@dataclass
class Group:
    """The runs of one row: ``finished`` holds one run per seed (the newest finished one)."""

    finished: list[Run] = field(default_factory=list)
    unfinished: list[Run] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted(r.seed for r in self.finished)

    def missing(self) -> Missing:
        """Why this row has no number."""
        if self.unfinished:
            return Missing(f"unfinished: {len(self.unfinished)} run(s) without metrics.json")
        return Missing(NOT_RUN)

    def cell(self, value: Callable[[Run], float | None], what: str = "") -> Summary | Missing:
        """mean ± std over the finished seeds of ``value(run)``; a Missing with the reason when
        no run finished or no finished run has the value."""
        if not self.finished:
            return self.missing()
        got = [v for v in (value(r) for r in self.finished) if v is not None]
        if not got:
            return Missing(f"missing: no {what or 'value'} in metrics.json")
        return summarize(got)


def metric(key: str) -> Callable[[Run], float | None]:
    """A getter for one metrics.json key (None when absent or not a number)."""

    def get(run: Run) -> float | None:
        value = (run.metrics or {}).get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return get


def group_by(runs: Iterable[Run], key: Callable[[Run], str | None]) -> dict[str, Group]:
    """Rows keyed by ``key(run)`` (runs where it is None are left out), in first-seen order."""
    runs = [r for r in runs if key(r) is not None]
    newest = latest_finished(runs)
    groups: dict[str, Group] = {}
    for run in runs:
        g = groups.setdefault(str(key(run)), Group())
        if run.finished:
            if newest.get((run.experiment, run.pe, run.seed)) is run:
                g.finished.append(run)
        elif not any(r.finished and r.seed == run.seed and r.experiment == run.experiment
                     and r.pe == run.pe for r in runs):
            g.unfinished.append(run)  # an unfinished run that a later finished run superseded is left out
    for g in groups.values():
        g.finished.sort(key=lambda r: r.seed)
    return groups


def ordered(names: Iterable[str], preferred: Sequence[str]) -> list[str]:
    """``preferred`` first (all of them, run or not), then any other names in sorted order."""
    names = set(names)
    return list(preferred) + sorted(names - set(preferred))


def artifact(run: Run, name: str) -> Path | None:
    """``<run>/<name>``, else the newest evaluation's copy, else None."""
    if (run.path / name).is_file():
        return run.path / name
    evals = sorted(p / name for p in (run.path / "eval").glob("*") if (p / name).is_file())
    return evals[-1] if evals else None


def of_scale(runs: Iterable[Run], scale: str, task: Callable[[str], bool]) -> list[Run]:
    """The runs at ``scale`` whose task name passes ``task``."""
    return [r for r in runs if r.scale == scale and task(r.task)]
