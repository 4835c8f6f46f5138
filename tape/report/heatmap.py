"""Accuracy heatmaps of addition grids: rows len_a, columns len_b, training region outlined;
one per run (``plot_heatmap``) or several side by side as in the paper's figure (``plot_panel``).

Drawn with matplotlib's object API (no pyplot, no global backend), so it works headless and in
worker processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
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


def pool_seeds(grids: Sequence[Iterable[Cell]]) -> list[Cell]:
    """One grid from several (e.g. one per seed): per cell, the summed n and correct."""
    totals: dict[tuple[int, int], list[int]] = {}
    for grid in grids:
        for c in grid:
            t = totals.setdefault((c.len_a, c.len_b), [0, 0])
            t[0] += c.n
            t[1] += c.correct
    return [Cell(a, b, n, k) for (a, b), (n, k) in sorted(totals.items())]


def draw_grid(fig: Figure, ax: Axes, acc: np.ndarray, train_digits: int, title: str,
              colorbar: bool = True, ylabel: bool = True) -> None:
    """Draw an accuracy matrix (from grid_matrix) on ``ax``: colours 0-100 %, the training region
    [1..train_digits]^2 outlined in red, per-cell % on small grids."""
    rows, cols = acc.shape
    image = ax.imshow(acc, cmap="YlGnBu", vmin=0, vmax=100, origin="upper", interpolation="nearest")
    if colorbar:
        fig.colorbar(image, ax=ax, label="exact-match accuracy (%)")
    ax.add_patch(
        Rectangle((-0.5, -0.5), min(train_digits, cols), min(train_digits, rows),
                  fill=False, edgecolor="red", linewidth=2.0, label="training lengths")
    )
    step = 1 if max(rows, cols) <= 20 else 5
    ax.set_xticks(np.arange(0, cols, step), [str(j + 1) for j in range(0, cols, step)])
    ax.set_yticks(np.arange(0, rows, step), [str(i + 1) for i in range(0, rows, step)])
    ax.set_xlabel("digits in second operand (len_b)")
    if ylabel:
        ax.set_ylabel("digits in first operand (len_a)")
    ax.set_title(title)
    if max(rows, cols) <= ANNOTATE_UP_TO:
        for (i, j), value in np.ndenumerate(acc):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if value > 60 else "black")


def save_png(fig: Figure, path: str | Path, overwrite: bool = False) -> None:
    """Save as PNG; refuse an existing file unless ``overwrite`` (rendered reports are redrawn)."""
    with open(path, "wb" if overwrite else "xb") as f:
        fig.savefig(f, format="png", dpi=150, bbox_inches="tight")


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
    draw_grid(fig, fig.add_subplot(), acc, train_digits, title)
    if path is not None:
        save_png(fig, path)  # never overwrite an earlier figure
    return fig


def plot_panel(
    grids: Mapping[str, Iterable[Cell]], train_digits: int, title: str,
    path: str | Path | None = None, overwrite: bool = False,
) -> Figure:
    """The paper's figure layout: one heatmap per entry of ``grids`` (subplot title = its key,
    which may hold a line break), side by side with one shared colour bar; saved as PNG when
    ``path`` is given."""
    if not grids:
        raise ValueError("plot_panel() needs at least one grid")
    mats = {name: grid_matrix(cells) for name, cells in grids.items()}
    side = max(3.0, 0.25 * max(max(m.shape) for m in mats.values()) + 1.5)
    fig = Figure(figsize=(side * len(mats) + 1.2, side + 0.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(mats), squeeze=False)[0]
    for i, (ax, (name, acc)) in enumerate(zip(axes, mats.items())):
        draw_grid(fig, ax, acc, train_digits, name, colorbar=False, ylabel=i == 0)
    fig.colorbar(axes[0].images[0], ax=list(axes), label="exact-match accuracy (%)")
    fig.suptitle(title)
    if path is not None:
        save_png(fig, path, overwrite=overwrite)
    return fig
