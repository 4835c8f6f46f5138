"""A small table model rendered three ways: Markdown (reading), LaTeX and CSV (papers).

A cell is a ``str``, an ``int``/``float``, a ``Summary`` (mean ± std over seeds) or a
``Missing`` (a reason instead of a number). In CSV a column holding any Summary becomes three
columns (``<col>``, ``<col> std``, ``<col> n``), so the file stays numeric where it can.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Union

from tape.report.stats import Missing, Summary

CellValue = Union[str, int, float, Summary, Missing, None]


@dataclass
class Table:
    """Columns, rows and the lines that go under it (notes, provenance)."""

    name: str  # file stem under results/tables/
    title: str
    columns: list[str]
    rows: list[list[CellValue]]
    notes: list[str] = field(default_factory=list)
    provenance: str = ""
    digits: int = 2

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.name}: row {row} has {len(row)} cells, expected "
                                 f"{len(self.columns)} ({self.columns})")


def format_cell(value: CellValue, digits: int = 2) -> str:
    """The text of one cell."""
    if value is None:
        return ""
    if isinstance(value, (Summary, Missing)):
        return value.format(digits)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(table: Table, heading_level: int = 3) -> str:
    """A heading, the pipe table, then notes and the provenance line."""
    lines = [f"{'#' * heading_level} {table.title}", ""]
    lines.append("| " + " | ".join(_md_escape(c) for c in table.columns) + " |")
    lines.append("|" + "---|" * len(table.columns))
    for row in table.rows:
        lines.append("| " + " | ".join(_md_escape(format_cell(v, table.digits)) for v in row) + " |")
    lines.append("")
    lines.extend(f"- {note}" for note in table.notes)
    if table.provenance:
        lines.append(f"- Provenance: {table.provenance}")
    return "\n".join(lines).rstrip() + "\n"


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
                  "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "\\": r"\textbackslash{}", "±": r"$\pm$", "<=": r"$\le$", "≤": r"$\le$"}


def latex_escape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text.startswith("<=", i):
            out.append(_LATEX_SPECIAL["<="])
            i += 2
            continue
        out.append(_LATEX_SPECIAL.get(text[i], text[i]))
        i += 1
    return "".join(out)


def to_latex(table: Table) -> str:
    """A booktabs ``table`` environment with the title as caption and the notes below."""
    spec = "l" + "r" * (len(table.columns) - 1)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{latex_escape(table.title)}}}", rf"\label{{tab:{table.name}}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in table.columns) + r" \\", r"\midrule"]
    for row in table.rows:
        lines.append(" & ".join(latex_escape(format_cell(v, table.digits)) for v in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    for note in [*table.notes, *([f"Provenance: {table.provenance}"] if table.provenance else [])]:
        lines.append(rf"\par\footnotesize {latex_escape(note)}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def _csv_header(table: Table) -> tuple[list[str], list[bool]]:
    expand = [any(isinstance(row[i], Summary) for row in table.rows) for i in range(len(table.columns))]
    header: list[str] = []
    for col, wide in zip(table.columns, expand):
        header += [col, f"{col} std", f"{col} n"] if wide else [col]
    return header, expand


def to_csv(table: Table) -> str:
    """Unrounded numbers; a Summary column also gets its std and n; Missing cells give reasons."""
    header, expand = _csv_header(table)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out: list[object] = []
        for value, wide in zip(row, expand):
            if isinstance(value, Summary):
                out += [repr(value.mean), "" if value.std is None else repr(value.std), value.n]
            else:
                text = repr(value) if isinstance(value, float) else format_cell(value)
                out += [text, "", ""] if wide else [text]
        writer.writerow(out)
    return buf.getvalue()
