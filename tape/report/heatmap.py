"""Accuracy heatmap of an addition grid: rows len_a, columns len_b, training region outlined.

Drawn with matplotlib's object API (no pyplot, no global backend), so it works headless and in
worker processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from tape.metrics.arithmetic import Cell

ANNOTATE_UP_TO = 24  # write the % in each cell when the grid is at most this wide


def grid_matrix(cells: Iterable[Cell]) -> np.ndarray:
    """(max len_a, max len_b) accuracy in %, NaN where a cell is missing; [i, j] is len_a = i + 1."""
    cells = list(cells)
    rows = max(c.len_a for c in cells)
    cols = max(c.len_b for c in cells)
    acc = np.full((rows, cols), np.nan)
    for c in cells:
        acc[c.len_a - 1, c.len_b - 1] = 100.0 * c.accuracy
    return acc


def plot_heatmap(
    cells: Iterable[Cell], train_digits: int, title: str, path: str | Path | None = None
) -> Figure:
    """Draw the grid (colour bar 0-100 %), outline [1..train_digits]^2 in red, save as PNG when
    ``path`` is given (refusing to overwrite), and return the figure."""
    acc = grid_matrix(cells)
    rows, cols = acc.shape
    side = max(4.0, 0.28 * max(rows, cols) + 2.0)
    fig = Figure(figsize=(side + 1.2, side))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(acc, cmap="YlGnBu", vmin=0, vmax=100, origin="upper", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="exact-match accuracy (%)")
    ax.add_patch(
        Rectangle((-0.5, -0.5), min(train_digits, cols), min(train_digits, rows),
                  fill=False, edgecolor="red", linewidth=2.0, label="training lengths")
    )
    step = 1 if max(rows, cols) <= 20 else 5
    ax.set_xticks(np.arange(0, cols, step), [str(j + 1) for j in range(0, cols, step)])
    ax.set_yticks(np.arange(0, rows, step), [str(i + 1) for i in range(0, rows, step)])
    ax.set_xlabel("digits in second operand (len_b)")
    ax.set_ylabel("digits in first operand (len_a)")
    ax.set_title(title)
    if max(rows, cols) <= ANNOTATE_UP_TO:
        for (i, j), value in np.ndenumerate(acc):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if value > 60 else "black")
    if path is not None:
        with open(path, "xb") as f:  # never overwrite an earlier figure
            fig.savefig(f, format="png", dpi=150, bbox_inches="tight")
    return fig
