"""Group runs into table rows: per PE (or method), the newest finished run of each seed, and
the unfinished runs, so a cell either summarises finished seeds or says why it has no number."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tape.report.runs import Run
from tape.report.settings import NOT_SETTINGS, describe, differences, setting_differences, setting_values
from tape.report.stats import Missing, Summary, summarize

NOT_RUN = "not run"


@dataclass
class Group:
    """The runs of one row: ``finished`` holds one run per seed (the newest finished one)."""

    finished: list[Run] = field(default_factory=list)
    unfinished: list[Run] = field(default_factory=list)
    differs: str = ""  # a row of runs set apart: the keys where they differ from the pooled row

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


def _by_setting(runs: list[Run]) -> list[list[Run]]:
    """Finished runs, newest first, split into settings: a run joins the first bucket whose
    newest run has the same setting (tape.report.settings.same_setting); per bucket, the newest
    run of each seed."""
    buckets: list[list[Run]] = []
    for run in sorted(runs, key=lambda r: r.name, reverse=True):
        home = next((b for b in buckets if not setting_differences(run.setting(), b[0].setting())), None)
        if home is None:
            buckets.append([run])
        elif all(r.seed != run.seed or r.experiment != run.experiment for r in home):
            home.append(run)  # an older run of a seed the bucket has is superseded
    return buckets


Preset = Callable[[str, str], "dict[str, Any] | None"]
"""(experiment, pe) -> the preset's flat setting, or None (pipelines.presets.preset_setting)."""


def _distance(bucket: list[Run], preset: Preset) -> int:
    """How many keys of a bucket's setting differ from its preset's (0 without a preset)."""
    setting = preset(bucket[0].experiment, bucket[0].pe)
    return 0 if setting is None else len(setting_differences(bucket[0].setting(), setting_values(setting)))


def group_by(runs: Iterable[Run], key: Callable[[Run], str | None],
             preset: Preset | None = None) -> dict[str, Group]:
    """Rows keyed by ``key(run)`` (runs where it is None are left out), in first-seen order.

    A row pools only runs of one setting (tape.report.settings): the setting with the most
    finished seeds (ties: the newest run); given ``preset`` (a paper-style table), the setting
    closest to the experiment's preset as conf/ has it comes first, so a
    claim's compute-matched or ablation arm never stands for the encoding. Runs of any other
    setting get a row of their own, keyed ``"<key> [<differing keys>]"`` with
    ``Group.differs`` naming them, and are never averaged in. Variant runs (Run.variant) are
    left out."""
    rows: dict[str, list[Run]] = {}
    for run in runs:
        if (name := key(run)) is not None:
            rows.setdefault(str(name), []).append(run)
    groups: dict[str, Group] = {}
    for name, members in rows.items():
        buckets = _by_setting([r for r in members if r.finished and not r.variant])
        rank = len if preset is None or len(buckets) < 2 else lambda b: (-_distance(b, preset), len(b))
        main = max(buckets, key=rank, default=[])  # max keeps the first (newest) of equal ranks
        g = groups.setdefault(name, Group())
        g.finished = sorted(main, key=lambda r: r.seed)
        g.unfinished = [r for r in members if not r.finished and not any(
            f.finished and f.seed == r.seed and f.experiment == r.experiment and f.pe == r.pe
            for f in members)]  # an unfinished run that a later finished run superseded is left out
        for others in buckets:
            if others is not main:
                diff = describe(setting_differences(others[0].setting(), main[0].setting()))
                label, n = f"{name} [{diff}]", 2
                while label in groups:  # two set-apart settings that read alike stay two rows
                    label, n = f"{name} [{diff}] ({n})", n + 1
                groups[label] = Group(finished=sorted(others, key=lambda r: r.seed), differs=diff)
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


def setting_notes(groups: dict[str, Group], compared: str | None = "pe") -> list[str]:
    """Table notes that keep the comparison honest: the runs set apart because their settings
    differ, and pooled rows whose settings differ in more than ``compared`` (the key the table
    compares, e.g. the PE; None: rows differ by design, skip that check)."""
    notes = []
    apart = {name: g for name, g in groups.items() if g.differs and g.finished}
    if apart:
        notes.append("Set apart, never pooled as seeds (their resolved config differs in the named "
                     "keys from the pooled row; tape/report/settings.py lists the keys that may "
                     "differ): " + "; ".join(
                         f"{name.replace(chr(9), ' ')} (seeds {', '.join(map(str, g.seeds))})"
                         for name, g in apart.items()) + ".")
    main = {name: g.finished[0] for name, g in groups.items() if g.finished and not g.differs}
    if compared and len(main) > 1:
        ignore = (*NOT_SETTINGS, compared)
        ref = next(iter(main.values()))
        keys = sorted({k for r in main.values() for k in differences(r.config(), ref.config(), ignore)})
        if keys:
            values = {name: setting_values(r.config(), ignore) for name, r in main.items()}
            notes.append(f"**Not like for like:** the rows differ in more than `{compared}`: "
                         + "; ".join(f"{name}: {describe({k: v.get(k) for k in keys})}"
                                     for name, v in values.items()) + ".")
    return notes
