"""Render the whole report: read the run directories, build every section, write
``<out>/README.md``, ``<out>/claims_detail.md`` (the Claims section's detail), ``<out>/runs.csv``,
``<out>/tables/*.{csv,tex}`` and ``<out>/figures/*.png``.

Only the files named above are written (and rewritten on every render); anything else in the
output folder, such as the benchmark's efficiency.md / efficiency.json, is left as it is.

With ``carry_over``, an experiment section none of whose runs is on this machine (runs/ is not
committed) is carried over from the previous render instead: its README text and its runs.csv
rows are copied, and its tables/figures files are left as they are.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from tape.report import addition, claims, efficiency, extension, flipflop, pretrain, scrolls
from tape.report.document import Context, Section
from tape.report.groups import Preset
from tape.report.inventory import FIELDS, inventory_csv, summary_table, usage
from tape.report.provenance import render_stamp
from tape.report.runs import Run, find_runs
from tape.report.tables import to_csv, to_latex, to_markdown


class Experiment(NamedTuple):
    """A section builder, the runs its section stands for and its section's title (per scale),
    so that a section can be carried over when none of its runs is here."""

    build: Callable[[Context, str], Section]
    prefix: str  # "addition/{scale}": experiment <prefix> and any below it (scrolls/cpu/qasper)
    title: str  # "Addition ({scale})": the builder's Section.title

    def owns(self, experiment: str, scale: str) -> bool:
        """Whether runs of ``experiment`` belong to this section at ``scale``."""
        prefix = self.prefix.format(scale=scale)
        return experiment == prefix or experiment.startswith(prefix + "/")


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(addition.build, "addition/{scale}", "Addition ({scale})"),
    Experiment(scrolls.build, "scrolls/{scale}", "SCROLLS ({scale})"),
    Experiment(extension.build, "context_extension/{scale}", "Context extension ({scale})"),
    Experiment(pretrain.build, "pretrain/{scale}", "Pretraining perplexity ({scale})"),
    Experiment(flipflop.build, "flipflop/{scale}", "Flip-flop ({scale})"),
)
CARRIED_NOTE = ("*Carried over unchanged from the previous render: its runs are not under {runs_dir}/ "
                "on this machine; their rows stay in runs.csv.*")
PARTIAL_NOTE = ("*Carried over unchanged from the previous render: built from the runs under "
                "{runs_dir}/ on this machine it would drop the rows of {pes}, whose runs are not "
                "here. Its rows stay in runs.csv; the {n} finished run(s) of this experiment here "
                "are listed there too (the Claims section uses them).*")
USED = ("yes", "apart")  # runs.csv `used` values of rows whose numbers are in the report
DEFAULT_SCALES = ("cpu",)
NOT_RESULTS = ("smoke",)  # test presets: never rendered unless asked for by name


@dataclass
class Rendered:
    """What a render wrote (paths) and the sections it built."""

    files: list[Path]
    sections: list[Section]


def scales_to_render(found: Sequence[str], requested: Sequence[str] | None,
                     rendered: Sequence[str] = ()) -> list[str]:
    """``requested`` when given; else the scales the folder ``rendered`` before (its runs.csv)
    and every scale found except the test presets, cpu first; with neither, the test presets
    found; with none at all, cpu (whose missing runs are then named)."""
    if requested:
        return list(dict.fromkeys(requested))
    chosen = {*rendered, *(s for s in found if s not in NOT_RESULTS)}
    return sorted(chosen or set(found) or set(DEFAULT_SCALES), key=lambda s: (s not in DEFAULT_SCALES, s))


class CarriedSection(Section):
    """A section copied from the previous README (its Markdown, verbatim but for a note)."""

    def __init__(self, title: str, markdown: str) -> None:
        super().__init__(title=title)
        self.markdown = markdown

    def to_markdown(self) -> str:
        return self.markdown


@dataclass
class Carried:
    """A section kept from the previous render: none of its runs is on this machine, or those
    here would drop numbers of runs that are not."""

    experiment: str  # e.g. "addition/cpu" (see Experiment.prefix)
    scale: str
    section: CarriedSection | None  # None: a claim-only experiment (the Claims section carries its rows)
    rows: list[dict[str, str]]  # its rows of the previous runs.csv, kept as they were

    def owns(self, experiment: str) -> bool:
        """Whether rows of ``experiment`` are this section's."""
        return experiment == self.experiment or experiment.startswith(self.experiment + "/")


def _read_runs_csv(out_dir: Path) -> list[dict[str, str]]:
    """The rows of ``out_dir``/runs.csv ([] when there is none)."""
    try:
        with open(out_dir / "runs.csv", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def old_section(readme: str, title: str, note: str) -> str | None:
    """The Markdown of section ``## title`` of a rendered README (up to the next ``## ``
    heading) with ``note`` under its heading, replacing the note of an earlier carry-over;
    None when the README has no such section."""
    lines = readme.split("\n")
    heading = f"## {title}"
    if heading not in lines:
        return None
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = lines[start + 1:end]
    if len(body) >= 2 and body[0] == "" and body[1].startswith(CARRIED_NOTE.split(":")[0]):
        body = body[2:]  # carried before: one note, not two
    return "\n".join([heading, "", note, *body]).rstrip("\n") + "\n"


def to_carry(runs: Sequence[Run], out_dir: Path, scales: Sequence[str], runs_dir: Path) -> list[Carried]:
    """The sections to carry over: at a rendered scale, with rows with numbers in
    ``out_dir``/runs.csv and a section in its README, and either no finished run of theirs
    under ``runs_dir`` or runs that lack a PE those rows had (building it would drop it)."""
    committed = _read_runs_csv(out_dir)
    try:
        readme = (out_dir / "README.md").read_text()
    except OSError:
        return []
    carried = []
    have = {(r.experiment, r.pe) for r in runs if r.finished}
    for scale in scales:
        for exp in EXPERIMENTS:
            rows = [row for row in committed if exp.owns(row.get("experiment", ""), scale)]
            used = [row for row in rows if row.get("used", "").startswith(USED)]
            here = [r for r in runs if r.finished and exp.owns(r.experiment, scale)]
            if not used:
                continue
            note = CARRIED_NOTE.format(runs_dir=runs_dir)
            if here:  # carried only when building it from the runs here would drop numbers
                lost = sorted({row["pe"] for row in used if (row["experiment"], row["pe"]) not in have})
                if not lost:
                    continue
                note = PARTIAL_NOTE.format(runs_dir=runs_dir, pes=", ".join(lost), n=len(here))
            title = exp.title.format(scale=scale)
            markdown = old_section(readme, title, note)
            if markdown is not None:
                carried.append(Carried(exp.prefix.format(scale=scale), scale,
                                       CarriedSection(title, markdown), rows))
    for experiment in sorted({row.get("experiment", "") for row in committed}):
        scale = experiment.split("/")[1] if "/" in experiment else ""  # claim-only: addition_c1/cpu
        if scale not in scales or any(exp.owns(experiment, scale) for exp in EXPERIMENTS):
            continue
        rows = [row for row in committed if row.get("experiment") == experiment]
        if any(row.get("used", "").startswith(USED) for row in rows) and not any(
                r.finished and r.experiment == experiment for r in runs):
            carried.append(Carried(experiment, scale, None, rows))  # the Claims section keeps its table rows
    return carried


def would_lose(runs: Sequence[Run], out_dir: Path, scales: Sequence[str], runs_dir: Path,
               carried: Sequence[Carried] = ()) -> list[str]:
    """Why rendering now would replace or drop numbers (empty: safe): a scale with no finished
    run under ``runs_dir`` (nor a ``carried`` section); an (experiment, PE) that ``out_dir``/runs.csv
    used, at any scale, that has no finished run now (e.g. a fresh clone, where runs/ is not
    committed) and whose section is not carried over; or a run whose number ``out_dir`` shows
    with no run of the same command and seed under ``runs_dir`` (a rerun replaces it; a subset of
    the seeds would redo the statistics)."""
    where = runs_dir.resolve()
    found = sorted({r.scale for r in runs if r.finished})
    only = " ".join(f"--scale {f}" for f in found)
    elsewhere = (f" (its finished runs are at scale {', '.join(found)}: render only those into another "
                 f"folder, make report RUNS={runs_dir} OUT=runs/report REPORT_ARGS=\"{only}\")") if found else ""
    problems = [f"no finished run at scale {scale} under {where}{elsewhere}" for scale in scales
                if not any(r.finished and r.scale == scale for r in runs)
                and not any(c.scale == scale for c in carried)]
    have = {(r.experiment, r.pe) for r in runs if r.finished}
    committed = [row for row in _read_runs_csv(out_dir) if row.get("used", "").startswith(USED)
                 and not any(c.owns(row["experiment"]) for c in carried)]  # carried: kept
    lost = sorted({(row["experiment"], row["pe"]) for row in committed
                   if (row["experiment"], row["pe"]) not in have})
    if lost:
        problems.append(f"{out_dir / 'runs.csv'} has numbers for {len(lost)} experiment/PE pair(s) "
                        f"with no finished run under {where}: "
                        + ", ".join(f"{e} {pe}" for e, pe in lost[:6]) + (f" (+{len(lost) - 6} more)" if len(lost) > 6 else ""))
    rerun = {(r.experiment, r.pe, str(r.seed), r.command) for r in runs if r.finished}  # a rerun replaces
    missing = [row for row in committed if (row["experiment"], row["pe"]) in have
               and (row["experiment"], row["pe"], row.get("seed", ""), row.get("command", "")) not in rerun]
    if missing:
        shown = ", ".join(f"{r['experiment']} {r['pe']} seed {r['seed']}" for r in missing[:4])
        problems.append(f"{len(missing)} run(s) whose numbers {out_dir} shows have no run of the same command "
                        f"and seed under {where} ({shown}" + (f", +{len(missing) - 4} more" if len(missing) > 4 else "")
                        + "): rendering a subset of the seeds would redo the statistics; to add new runs, "
                        "export them beside the others with --add-records")
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
           allow_empty: bool = False, carry_over: bool = False, preset: Preset | None = None) -> Rendered:
    """Render every experiment at each scale of ``scales`` (see scales_to_render). Refuses
    (WouldLoseResults, before writing anything) when that would lose a number, unless
    ``allow_empty``; with ``carry_over``, sections none of whose runs is here are carried over
    from the previous render (see to_carry) rather than lost; ``preset`` lets the paper-style
    tables prefer each preset's own runs (pipelines.presets.preset_setting)."""
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    runs = find_runs(runs_dir)
    rendered = [row["scale"] for row in _read_runs_csv(out_dir) if row.get("scale")]
    chosen = scales_to_render([r.scale for r in runs], scales, rendered)
    carried = to_carry(runs, out_dir, chosen, runs_dir) if carry_over else []
    problems = [] if allow_empty else would_lose(runs, out_dir, chosen, runs_dir, carried)
    if problems:
        raise WouldLoseResults("; ".join(problems))
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = render_stamp()
    ctx = Context(runs=runs, out_dir=out_dir, stamp=stamp, carry_over=carry_over, records=runs_dir,
                  preset=preset)
    kept: dict[str, Section] = {c.section.title: c.section for c in carried if c.section is not None}
    sections = [kept[title] if (title := exp.title.format(scale=scale)) in kept else exp.build(ctx, scale)
                for scale in chosen for exp in EXPERIMENTS]
    sections.append(efficiency.build(ctx))
    claims_section = claims.build(ctx)
    sections.insert(0, claims_section)  # issue 15: the Claims section opens the report
    written: list[Path] = []
    used = usage(runs, preset)  # id(run) -> how the tables use it: one grouping for both listings
    inventory = summary_table(runs, chosen, stamp, used)
    if carried:
        inventory.notes.append("Carried over from the previous render (runs not on this machine): "
                               + ", ".join(c.experiment for c in carried) + ". Their rows stay in "
                               "[runs.csv](runs.csv); their sections, tables and figures are unchanged.")
    for table in [inventory, *(t for s in sections for t in s.tables)]:
        _write(ctx.tables_dir / f"{table.name}.csv", to_csv(table), written)
        _write(ctx.tables_dir / f"{table.name}.tex", to_latex(table), written)
    for section in sections:
        for stem, text in section.extra_csv.items():
            _write(ctx.tables_dir / f"{stem}.csv", text, written)
        written += [out_dir / f.path for f in section.figures]
    listed = inventory_csv(runs, chosen, runs_dir, used)
    _write(out_dir / "runs.csv", listed + _carried_rows(carried, listed), written)
    command = f"python -m pipelines.report --runs {runs_dir} --out {out_dir}"
    command += "".join(f" --scale {s}" for s in dict.fromkeys(scales or ()))
    command += " --carry-over" if carried else ""  # the same bytes as make report when nothing was carried
    readme = [
        "# Results",
        "",
        f"Rendered by `{command}` from the runs "
        f"(run records or run directories) under `{runs_dir}/` (never from W&B). Every number in a column "
        "without \"paper\" in its header comes from a run listed in [runs.csv](runs.csv); columns "
        "and rows marked \"paper\" are the paper's numbers (tape-spec E). A cell without a number "
        "says why (\"not run: ...\", \"unfinished: ...\")."
        + (" Sections marked \"carried over\" are copied unchanged from the previous render, "
           "whose runs are not on this machine." if carried else ""),
        "",
        f"Scales rendered: {', '.join(chosen)}. {stamp[0].upper()}{stamp[1:]}.",
        "",
        sections[0].to_markdown(),  # Claims
        to_markdown(inventory, heading_level=2),
        *(s.to_markdown() for s in sections[1:]),
    ]
    _write(out_dir / "README.md", "\n".join(readme), written)
    _write(out_dir / claims.DETAIL_FILE, claims_section.detail_markdown(), written)
    return Rendered(files=written, sections=sections)


def _carried_rows(carried: Sequence[Carried], listed: str) -> str:
    """The previous runs.csv rows of the carried sections, as they were (CSV lines, no header),
    but for run directories that ``listed`` (the new runs.csv) already has."""
    have = {row["run_dir"] for row in csv.DictReader(io.StringIO(listed))}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, FIELDS, restval="", extrasaction="ignore", lineterminator="\n")
    writer.writerows(row for c in carried for row in c.rows if row.get("run_dir") not in have)
    return buf.getvalue()
