"""The addition experiment (tape-spec E.1): mean-accuracy table beside the paper's Fig. 5 and
Fig. 2 numbers, one heatmap per PE and a panel of all PEs side by side.

Reads from each finished run (``task == "addition"``): metrics.json keys ``mean_accuracy``,
``in_distribution_accuracy``, ``ood_accuracy`` (%), ``train_time_s``, ``wall_time_s``; the
run's ``grid.csv`` (len_a, len_b, n, correct) and config.yaml ``task.max_digits`` /
``task.eval_max_digits`` / ``trainer.max_steps``. Heatmaps pool the seeds' grids cell by cell.
"""

from __future__ import annotations

import csv
import io

from tape.metrics.arithmetic import Cell, read_grid_csv
from tape.report.document import Context, Figure, Section
from tape.report.groups import Group, artifact, group_by, metric, of_scale, ordered, setting_notes
from tape.report.heatmap import plot_heatmap, plot_panel, pool_seeds, save_png
from tape.report.paper import ADDITION_FIG2, ADDITION_FIG5, ADDITION_PES, display
from tape.report.provenance import section_provenance
from tape.report.stats import Missing, Summary
from tape.report.tables import Table

METRICS = (("mean accuracy (%)", "mean_accuracy"), ("in-distribution (%)", "in_distribution_accuracy"),
           ("OOD (%)", "ood_accuracy"), ("train time (s)", "train_time_s"))


def _setting(group_runs: list, key: str, sub: str) -> int | None:
    for run in group_runs:
        value = (run.config().get(key) or {}).get(sub)
        if isinstance(value, int):
            return value
    return None


def _grids(group: Group) -> list[list[Cell]]:
    grids = []
    for run in group.finished:
        path = artifact(run, "grid.csv")
        if path is not None:
            grids.append(read_grid_csv(path))
    return grids


def _paper(column, pe: str) -> float | Missing:
    value = column.values.get(pe)
    return value if value is not None else Missing("not reported")


def _grid_csv(pooled: dict[str, tuple[list[Cell], int]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["pe", "len_a", "len_b", "n", "correct", "accuracy", "seeds"])
    for pe, (cells, seeds) in pooled.items():
        for c in cells:
            writer.writerow([pe, c.len_a, c.len_b, c.n, c.correct, 100.0 * c.accuracy, seeds])
    return buf.getvalue()


def build(ctx: Context, scale: str) -> Section:
    """The addition section at ``scale``; figures are drawn under ``ctx.out_dir``/figures."""
    # addition/<scale> only: claim C1's factorial (addition_c1/...) is read by the Claims section
    runs = [r for r in of_scale(ctx.runs, scale, lambda task: task == "addition") if r.family == "addition"]
    groups = group_by(runs, lambda r: r.method, preset=ctx.preset)
    finished = [r for g in groups.values() for r in g.finished]
    pooled_rows = [r for g in groups.values() if not g.differs for r in g.finished]
    train = _setting(pooled_rows, "task", "max_digits")
    test = _setting(pooled_rows, "task", "eval_max_digits")
    steps = _setting(pooled_rows, "trainer", "max_steps")
    rows, pooled = [], {}
    for pe in ordered(groups, ADDITION_PES):
        g = groups.get(pe, Group())
        cells = [g.cell(metric(key), key) for _, key in METRICS]
        rows.append([display(pe), cells[0], len(g.finished), *cells[1:],
                     _paper(ADDITION_FIG5, pe), _paper(ADDITION_FIG2, pe)])
        grids = _grids(g)
        if grids and not g.differs:  # heatmaps for the pooled rows only
            pooled[pe] = (pool_seeds(grids), len(grids))
    ours = f"ours (train <= {train} digits, test <= {test})" if train and test else "ours"
    table = Table(
        name=f"addition_{scale}",
        title=f"Addition, {scale} scale: mean accuracy over the test grid (%)",
        columns=["PE", f"{ours}: mean accuracy (%)", "seeds", *(m for m, _ in METRICS[1:]),
                 ADDITION_FIG5.header, ADDITION_FIG2.header],
        rows=rows,
        notes=[
            f"Ours: {scale} preset" + (f", {steps} training steps" if steps else "")
            + "; mean ± sample std (ddof 1) over the seeds counted in `seeds` (a single seed shows "
              "its value alone). OOD = cells with an operand longer than the training length.",
            f"The last two columns are **the paper's** numbers, not ours: {ADDITION_FIG5.note}; "
            f"{ADDITION_FIG2.note}. The paper trains a 16-layer model on operands of up to 20/40 "
            "digits, so compare the ordering of the PEs, not the values.",
            *setting_notes(groups),
        ],
        provenance=section_provenance(finished, ctx),
    )
    section = Section(title=f"Addition ({scale})", tables=[table])
    if pooled:
        section.extra_csv[f"addition_{scale}_grid"] = _grid_csv(pooled)
        section.figures += _figures(ctx, scale, pooled, groups, train or 0)
    else:
        section.paragraphs.append("No heatmap: no finished addition run with a grid.csv at this scale.")
    return section


def _title(pe: str, summary: Summary | Missing, seeds: int, sep: str = ": ") -> str:
    mean = f"mean {summary.mean:.2f}%" if isinstance(summary, Summary) else summary.reason
    return f"{display(pe)}{sep}{mean}" + (f" ({seeds} seeds pooled)" if seeds > 1 else "")


def _figures(ctx: Context, scale: str, pooled: dict[str, tuple[list[Cell], int]],
             groups: dict[str, Group], train: int) -> list[Figure]:
    figures = []
    titled = {}
    for pe, (cells, seeds) in pooled.items():
        summary = groups[pe].cell(metric("mean_accuracy"))
        title = _title(pe, summary, seeds)
        titled[_title(pe, summary, seeds, sep="\n")] = cells
        path, rel = ctx.figure_path(f"addition_{scale}_{pe}.png")
        save_png(plot_heatmap(cells, train, title), path, overwrite=True)
        figures.append(Figure(rel, f"Addition heatmap, {display(pe)} ({scale}); red box: training lengths"))
    path, rel = ctx.figure_path(f"addition_{scale}_panel.png")
    plot_panel(titled, train, f"Addition accuracy by operand length ({scale} scale, ours)", path,
               overwrite=True)
    figures.insert(0, Figure(rel, f"All PEs side by side ({scale} scale, ours), as the paper's Fig. 2"))
    return figures
