"""Run records: the few KB of a finished run that results/ is rendered from, committed under
``results/records/`` so that anyone can re-render results/ and recheck every verdict.

A record mirrors its run directory (``<records>/<experiment>/<pe>/<seed>/<run name>/``) and
keeps only what the report reads: command.txt (command, commit, time, machine), the resolved
config.yaml (which defines the run's arm), metrics.json, the per-cell / per-length CSVs its task
writes (every ``*.csv`` beside metrics.json), the validation curve (csv/metrics.csv) and the
newest evaluation's copies of these. ``find_runs`` reads a records folder exactly as it reads
runs/. A record is never overwritten: exporting a run whose record exists with other contents is
an error; a file the record lacks (kept only since it was written) is added.
"""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from tape.report.runs import Run, find_runs

RECORD_FILES = ("command.txt", "config.yaml", "metrics.json", "csv/metrics.csv")  # every task
NOT_RECORDED_SCALES = ("smoke", "demo", "custom")  # tests, make demo's first look, ad-hoc runs: never records


class RecordConflict(RuntimeError):
    """A record of this run exists with other contents; nothing was written."""


def _kept_in(folder: Path) -> list[Path]:
    """RECORD_FILES and the task's CSVs (grid.csv, parity.csv, ...) in ``folder``, relative to it."""
    fixed = [Path(name) for name in RECORD_FILES if (folder / name).is_file()]
    return fixed + sorted(p.relative_to(folder) for p in folder.glob("*.csv") if p.is_file())


def record_files(run: Run) -> list[Path]:
    """The files of ``run`` its record keeps, relative to the run directory."""
    keep = _kept_in(run.path)
    evals = sorted(p for p in (run.path / "eval").glob("*") if (p / "metrics.json").is_file())
    if evals:
        newest = evals[-1].relative_to(run.path)
        keep += [newest / f for f in _kept_in(run.path / newest)]
    return keep


def is_recordable(run: Run) -> bool:
    """A finished run of a results scale (not a smoke test or an ad-hoc experiment)."""
    return run.finished and run.scale not in NOT_RECORDED_SCALES and run.experiment != "custom"


def export(run: Run, runs_root: str | Path, records_root: str | Path) -> tuple[Path, bool]:
    """Write ``run``'s record under ``records_root`` (its path relative to ``runs_root``
    mirrored); (record path, whether it was new or gained files). An identical record is left as
    it is; one with a file that differs raises RecordConflict; files it lacks are added. A new
    record appears whole or not at all."""
    if not run.finished:
        raise ValueError(f"{run.path}: unfinished (no metrics.json); only finished runs have records")
    dest = Path(records_root) / run.path.relative_to(runs_root)
    files = record_files(run)
    if dest.exists():
        missing = [f for f in files if not (dest / f).is_file()]
        differ = [str(f) for f in files if f not in missing
                  and not filecmp.cmp(run.path / f, dest / f, shallow=False)]
        if differ:
            raise RecordConflict(f"{dest}: a record of this run exists and differs in {', '.join(differ)}; "
                                 "records are never overwritten (move the old one away if it is wrong)")
        for f in missing:  # kept since the record was written (a task's per-length CSV)
            _copy_atomic(run.path / f, dest / f)
        return dest, bool(missing)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for f in files:
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run.path / f, tmp / f)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest, True


def _copy_atomic(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` through a temporary file beside it, so ``dest`` is whole or absent."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(src, tmp)
    tmp.rename(dest)


def export_all(runs_root: str | Path, records_root: str | Path,
               keep: Callable[[Run], bool] = is_recordable) -> list[Path]:
    """Export every run under ``runs_root`` that ``keep`` accepts; the records written or
    completed now. A conflicting record stops none of the others: the conflicts are raised
    together once every other run is exported."""
    written, conflicts = [], []
    for run in find_runs(runs_root):
        if keep(run):
            try:
                path, new = export(run, runs_root, records_root)
            except RecordConflict as err:
                conflicts.append(str(err))
                continue
            if new:
                written.append(path)
    if conflicts:
        raise RecordConflict("; ".join(conflicts) + f" (the other {len(written)} record(s) were written)")
    return written


def finished_runs(*roots: str | Path) -> list[Run]:
    """The runs under every root (run directories or records), a record and its run once."""
    seen: dict[tuple[str, str, int, str], Run] = {}
    for root in roots:
        for run in find_runs(root):
            seen.setdefault((run.experiment, run.pe, run.seed, run.name), run)
    return list(seen.values())

