"""Render the whole report: read the run directories, build every section, write
``<out>/README.md``, ``<out>/runs.csv``, ``<out>/tables/*.{csv,tex}`` and ``<out>/figures/*.png``.

Only the files named above are written (and rewritten on every render); anything else in the
output folder, such as the benchmark's efficiency.md / efficiency.json, is left as it is.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tape.report import addition, claims, efficiency, extension, flipflop, pretrain, scrolls
from tape.report.document import Context, Section
from tape.report.inventory import inventory_csv, summary_table
from tape.report.provenance import render_stamp
from tape.report.runs import Run, find_runs
from tape.report.tables import to_csv, to_latex, to_markdown

EXPERIMENTS: tuple[Callable[[Context, str], Section], ...] = (
    addition.build, scrolls.build, extension.build, pretrain.build, flipflop.build,
)
DEFAULT_SCALES = ("cpu",)
NOT_RESULTS = ("smoke",)  # test presets: never rendered unless asked for by name


@dataclass
class Rendered:
    """What a render wrote (paths) and the sections it built."""

    files: list[Path]
    sections: list[Section]


def scales_to_render(found: Sequence[str], requested: Sequence[str] | None) -> list[str]:
    """``requested`` when given; else cpu plus every scale found except the test presets."""
    if requested:
        return list(dict.fromkeys(requested))
    return list(dict.fromkeys([*DEFAULT_SCALES, *sorted(s for s in found if s not in NOT_RESULTS)]))


def would_lose(runs: Sequence[Run], out_dir: Path, scales: Sequence[str], runs_dir: Path) -> list[str]:
    """Why rendering now would replace numbers with "not run" (empty: safe): a scale with no
    finished run under ``runs_dir``, or an (experiment, PE) that ``out_dir``/runs.csv used and
    that has no finished run now (e.g. a fresh clone, where runs/ is not committed)."""
    where = runs_dir.resolve()
    problems = [f"no finished run at scale {scale} under {where}" for scale in scales
                if not any(r.finished and r.scale == scale for r in runs)]
    have = {(r.experiment, r.pe) for r in runs if r.finished}
    try:
        with open(out_dir / "runs.csv", newline="") as f:
            committed = [row for row in csv.DictReader(f) if row.get("used", "").startswith(("yes", "apart"))]
    except OSError:
        committed = []
    lost = sorted({(row["experiment"], row["pe"]) for row in committed
                   if row.get("scale") in scales and (row["experiment"], row["pe"]) not in have})
    if lost:
        problems.append(f"{out_dir / 'runs.csv'} has numbers for {len(lost)} experiment/PE pair(s) "
                        f"with no finished run under {where}: "
                        + ", ".join(f"{e} {pe}" for e, pe in lost[:6]) + (f" (+{len(lost) - 6} more)" if len(lost) > 6 else ""))
    return problems


def _write(path: Path, text: str, written: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    written.append(path)


class WouldLoseResults(RuntimeError):
    """Rendering would replace committed numbers with "not run"; nothing was written."""


def render(runs_dir: str | Path, out_dir: str | Path, scales: Sequence[str] | None = None,
           allow_empty: bool = False) -> Rendered:
    """Render every experiment at each scale of ``scales`` (see scales_to_render). Refuses
    (WouldLoseResults, before writing anything) when that would lose a number, unless
    ``allow_empty``."""
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    runs = find_runs(runs_dir)
    chosen = scales_to_render([r.scale for r in runs], scales)
    problems = [] if allow_empty else would_lose(runs, out_dir, chosen, runs_dir)
    if problems:
        raise WouldLoseResults("; ".join(problems))
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = render_stamp()
    ctx = Context(runs=runs, out_dir=out_dir, stamp=stamp)
    sections = [build(ctx, scale) for scale in chosen for build in EXPERIMENTS]
    sections.append(efficiency.build(ctx))
    sections.insert(0, claims.build(ctx))  # issue 15: the Claims section opens the report
    written: list[Path] = []
    inventory = summary_table(runs, chosen, stamp)
    for table in [inventory, *(t for s in sections for t in s.tables)]:
        _write(ctx.tables_dir / f"{table.name}.csv", to_csv(table), written)
        _write(ctx.tables_dir / f"{table.name}.tex", to_latex(table), written)
    for section in sections:
        for stem, text in section.extra_csv.items():
            _write(ctx.tables_dir / f"{stem}.csv", text, written)
        written += [out_dir / f.path for f in section.figures]
    _write(out_dir / "runs.csv", inventory_csv(runs, chosen, runs_dir), written)
    readme = [
        "# Results",
        "",
        f"Rendered by `python -m pipelines.report --runs {runs_dir} --out {out_dir}` from the run "
        f"directories under `{runs_dir}/` (never from W&B). Every number in a column "
        "without \"paper\" in its header comes from a run listed in [runs.csv](runs.csv); columns "
        "and rows marked \"paper\" are the paper's numbers (tape-spec E). A cell without a number "
        "says why (\"not run: ...\", \"unfinished: ...\").",
        "",
        f"Scales rendered: {', '.join(chosen)}. {stamp[0].upper()}{stamp[1:]}.",
        "",
        sections[0].to_markdown(),  # Claims
        to_markdown(inventory, heading_level=2),
        *(s.to_markdown() for s in sections[1:]),
    ]
    _write(out_dir / "README.md", "\n".join(readme), written)
    return Rendered(files=written, sections=sections)
