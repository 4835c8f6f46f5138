"""Render the whole report: read the run directories, build every section, write
``<out>/README.md``, ``<out>/runs.csv``, ``<out>/tables/*.{csv,tex}`` and ``<out>/figures/*.png``.

Only the files named above are written (and rewritten on every render); anything else in the
output folder, such as the benchmark's efficiency.md / efficiency.json, is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tape.report import addition, claims, efficiency, extension, flipflop, pretrain, scrolls
from tape.report.document import Context, Section
from tape.report.inventory import inventory_csv, summary_table
from tape.report.provenance import render_stamp
from tape.report.runs import find_runs
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


def _write(path: Path, text: str, written: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    written.append(path)


def render(runs_dir: str | Path, out_dir: str | Path, scales: Sequence[str] | None = None) -> Rendered:
    """Render every experiment at each scale of ``scales`` (see scales_to_render)."""
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = find_runs(runs_dir)
    stamp = render_stamp()
    ctx = Context(runs=runs, out_dir=out_dir, stamp=stamp)
    chosen = scales_to_render([r.scale for r in runs], scales)
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
