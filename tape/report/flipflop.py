"""The flip-flop experiment (claim C3): read error per PE by evaluation length and sparsity, and
a figure of error by length per PE on a log scale with every seed drawn.

Reads from each finished run (``task == "flipflop"``): metrics.json keys
``read_error_<sparsity>_<m>x`` and ``read_error_ood`` (%), config.yaml ``task.seq_len``. Ours
only: the paper has no flip-flop experiment.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure

from tape.report.claim_figures import COLOURS
from tape.report.document import Context, Figure, Section
from tape.report.groups import Group, group_by, metric, of_scale, ordered
from tape.report.heatmap import save_png
from tape.report.paper import display
from tape.report.provenance import section_provenance
from tape.report.runs import Run
from tape.report.tables import Table

KEY = re.compile(r"^read_error_(.+)_(\d+)x$")
FLIPFLOP_PES = ("rope", "tape", "nope", "fire", "alibi")
SPARSITY_ORDER = ("in_dist", "sparse", "dense")
FLOOR = 0.01  # % : a zero error is drawn here on the log scale


def _cells(runs: list[Run]) -> tuple[list[str], list[int]]:
    found = {(m.group(1), int(m.group(2))) for r in runs for k in (r.metrics or {}) if (m := KEY.match(k))}
    sparsities = ordered({s for s, _ in found}, [s for s in SPARSITY_ORDER if any(s == f for f, _ in found)])
    return sparsities, sorted({m for _, m in found})


def _primary(runs: list[Run]) -> list[int]:
    """The lengths of the claims' metric (config ``task.primary_multipliers``; 2x and 3x)."""
    for run in runs:
        value = (run.config().get("task") or {}).get("primary_multipliers")
        if isinstance(value, list) and value:
            return [int(m) for m in value]
    return [2, 3]


def _mean_of(keys: list[str]) -> Callable[[Run], float | None]:
    """A getter for the mean of several metrics.json keys (None when one is missing)."""
    getters = [metric(k) for k in keys]

    def get(run: Run) -> float | None:
        values = [g(run) for g in getters]
        return None if any(v is None for v in values) else float(np.mean(values))

    return get


def build(ctx: Context, scale: str) -> Section:
    runs = of_scale(ctx.runs, scale, lambda task: task == "flipflop")
    groups = group_by(runs, lambda r: r.method, preset=ctx.preset)
    finished = [r for g in groups.values() for r in g.finished]
    sparsities, mults = _cells(finished)
    seq_len = next((r.config().get("task", {}).get("seq_len") for r in finished
                    if isinstance(r.config().get("task", {}).get("seq_len"), int)), None)
    heads = [f"{m}x ({m * seq_len} tokens)" if seq_len else f"{m}x" for m in mults]
    primary = _primary(finished)
    rows = []
    for pe in ordered(groups, FLIPFLOP_PES):
        g = groups.get(pe, Group())
        for s in sparsities or ["in_dist"]:
            rows.append([display(pe), s, len(g.finished),
                         *(g.cell(metric(f"read_error_{s}_{m}x"), f"read_error_{s}_{m}x") for m in mults),
                         g.cell(_mean_of([f"read_error_{s}_{m}x" for m in primary]), "read error")])
    table = Table(
        name=f"flipflop_{scale}",
        title=f"Flip-flop, {scale} scale: read error (%) by evaluation length (lower is better)",
        columns=["PE", "sparsity", "seeds", *heads, f"mean of {', '.join(f'{m}x' for m in primary)}"],
        rows=rows,
        notes=["Ours only (Liu et al. 2023's task; the TAPE paper has none). Read error = share of "
               "the bits after 'r' predicted wrong, teacher-forced. Sparsity: in_dist = the training "
               "P(ignore), sparse = 0.98, dense = 0.1. Mean ± sample std over seeds. Claims C3, C3c "
               "and C3g read the last column of in_dist, C3s and C3sc of sparse, C3d and C3dc of dense."],
        digits=3,
        provenance=section_provenance(finished, ctx),
    )
    section = Section(title=f"Flip-flop ({scale})", tables=[table])
    if finished and mults:
        section.figures.append(_figure(ctx, scale, groups, sparsities, mults))
    return section


def _figure(ctx: Context, scale: str, groups: dict[str, Group], sparsities: list[str],
            mults: list[int]) -> Figure:
    """One panel per sparsity: each PE's mean error by length (line) and every seed (dots)."""
    fig = MplFigure(figsize=(4.2 * len(sparsities), 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(sparsities), squeeze=False, sharey=True)[0]
    for ax, s in zip(axes, sparsities):
        ax.set_prop_cycle(color=COLOURS)  # 20 colours apart: the default 10 repeat over 13 arms
        for pe in ordered(groups, FLIPFLOP_PES):
            runs = groups.get(pe, Group()).finished
            per_seed = np.array([[float((r.metrics or {}).get(f"read_error_{s}_{m}x", np.nan)) for m in mults]
                                 for r in runs])
            if per_seed.size == 0:
                continue
            line = ax.plot(mults, np.maximum(np.nanmean(per_seed, axis=0), FLOOR), marker="o",
                           label=f"{display(pe)} ({len(runs)} seeds)")[0]
            for row in per_seed:
                ax.scatter(mults, np.maximum(row, FLOOR), s=10, alpha=0.4, color=line.get_color())
        ax.set_yscale("log")
        ax.set_xticks(mults)
        ax.set_xlabel("evaluation length / training length")
        ax.set_title(f"{s}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"read error (%), 0 drawn at {FLOOR}")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the panels, off the data
    fig.suptitle(f"Flip-flop read error by length ({scale} scale, ours; dots: seeds)")
    path, rel = ctx.figure_path(f"flipflop_{scale}.png")
    save_png(fig, path, overwrite=True)
    return Figure(rel, f"Flip-flop read error by length per PE ({scale} scale, ours; log scale)")
