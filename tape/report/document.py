"""What one experiment contributes to the report: paragraphs, tables and figures, and the
context the builders share (the runs, the output folder, the rendering stamp)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tape.report.groups import Preset
from tape.report.runs import Run
from tape.report.tables import Table, to_markdown


@dataclass
class Context:
    """Input of every section builder."""

    runs: list[Run]
    out_dir: Path
    stamp: str  # how this rendering was made (provenance.render_stamp)
    carry_over: bool = False  # keep what the runs here cannot rebuild from the previous render
    records: Path | None = None  # the folder the runs were read from (linked from provenance lines)
    preset: Preset | None = None  # (experiment, pe) -> the preset's setting: tables prefer its runs

    @property
    def records_link(self) -> str:
        """``records`` relative to ``out_dir``, as a link target ("" when unknown)."""
        return "" if self.records is None else Path(os.path.relpath(self.records, self.out_dir)).as_posix() + "/"

    def figure_path(self, name: str) -> tuple[Path, Path]:
        """(absolute, relative to out_dir) path of figures/<name>; creates the folder."""
        rel = Path("figures") / name
        (self.out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        return self.out_dir / rel, rel

    @property
    def tables_dir(self) -> Path:
        path = self.out_dir / "tables"
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass
class Figure:
    """A PNG under the output folder and its caption."""

    path: Path  # relative to the output folder
    caption: str


@dataclass
class Section:
    """One experiment at one scale."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    extra_csv: dict[str, str] = field(default_factory=dict)  # file stem -> CSV text (tidy data)

    def to_markdown(self) -> str:
        parts = [f"## {self.title}", ""]
        parts += [p + "\n" for p in self.paragraphs]
        for table in self.tables:
            parts.append(to_markdown(table))
            parts.append(files_line(table))
        parts += [figure_markdown(fig) for fig in self.figures]
        return "\n".join(parts)


def files_line(table: Table) -> str:
    """The links to a table's CSV and LaTeX files, under its Markdown."""
    return (f"Files: [`tables/{table.name}.csv`](tables/{table.name}.csv), "
            f"[`tables/{table.name}.tex`](tables/{table.name}.tex)\n")


def figure_markdown(fig: Figure) -> str:
    """A figure and its caption."""
    return f"![{fig.caption}]({fig.path.as_posix()})\n\n*{fig.caption}*\n"
