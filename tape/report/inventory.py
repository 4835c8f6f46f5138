"""The run inventory: every run directory found, whether it finished, whether the report uses
it (the newest finished run of each experiment / PE / seed), and the wall time per experiment."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from tape.report.groups import Preset, group_by
from tape.report.runs import Run
from tape.report.tables import Table

FIELDS = ["experiment", "task", "scale", "pe", "seed", "status", "used", "wall_time_s", "run_dir", "command",
          "commit", "machine"]


def usage(runs: list[Run], preset: Preset | None = None) -> dict[int, str]:
    """id(run) -> how the tables use it: "yes" (pooled), "apart: <differing keys>" (a row of
    its own, see tape.report.groups.group_by, which with the tables' ``preset`` pools the
    preset's setting); runs not in the map are not used."""
    groups = group_by(runs, lambda r: f"{r.experiment}\t{r.method}", preset=preset)
    return {id(r): f"apart: {g.differs}" if g.differs else "yes"
            for g in groups.values() for r in g.finished}


def status(run: Run, used: dict[int, str], scales: Iterable[str]) -> tuple[str, str]:
    """(status, used) of one run: finished / unfinished, and why it is (not) in the tables."""
    if not run.finished:
        return "unfinished (no metrics.json)", "no"
    if run.scale not in scales:
        return "finished", f"no: scale {run.scale} not rendered"
    if run.variant:
        return "finished", "no: a variant protocol, kept out of the paper-style tables"
    return "finished", used.get(id(run), "no: superseded by a newer run of this seed and setting")


def inventory_csv(runs: list[Run], scales: Iterable[str], runs_root: Path, used: dict[int, str]) -> str:
    """One CSV row per run directory (paths relative to the runs folder's parent); ``used``:
    ``usage(runs, preset)``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FIELDS)
    for r in runs:
        st, use = status(r, used, list(scales))
        wall = (r.metrics or {}).get("wall_time_s")
        writer.writerow([r.experiment, r.task, r.scale, r.pe, r.seed, st, use,
                         "" if wall is None else repr(float(wall)),
                         _relative(r.path, runs_root.parent), r.command, r.commit, r.machine])
    return buf.getvalue()


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def summary_table(runs: list[Run], scales: Iterable[str], stamp: str, used: dict[int, str]) -> Table:
    """Per experiment: finished / unfinished runs, PEs and total wall time of the runs used
    (pooled or shown apart: every run whose numbers the report shows); ``used``: ``usage(runs, preset)``."""
    scales = list(scales)
    per: dict[str, dict] = defaultdict(lambda: {"finished": 0, "unfinished": 0, "pes": set(), "wall": 0.0,
                                                "scale": ""})
    for r in runs:
        row = per[r.experiment]
        row["scale"] = r.scale
        if r.finished:
            row["finished"] += 1
            if id(r) in used:
                row["pes"].add(r.pe)
                row["wall"] += float((r.metrics or {}).get("wall_time_s") or 0.0)
        else:
            row["unfinished"] += 1
    rows = [[exp, v["finished"], v["unfinished"], ", ".join(sorted(v["pes"])) or "-",
             round(v["wall"] / 60, 1), "yes" if v["scale"] in scales else "no"]
            for exp, v in sorted(per.items())]
    return Table(name="runs_summary", title="Runs found",
                 columns=["experiment", "finished runs", "unfinished runs", "PEs / methods used",
                          "wall time of the runs used (min)", "rendered"],
                 rows=rows, digits=1,
                 notes=["Every run directory is listed in [runs.csv](runs.csv). Unfinished runs "
                        "(no metrics.json) never contribute a number; of several finished runs of "
                        "the same experiment, PE, seed and setting the newest is used; runs whose "
                        "settings differ in more than the seed are shown apart (column `used` of "
                        "runs.csv). Smoke-scale runs are tests, not results, and are not rendered."],
                 provenance=stamp)
