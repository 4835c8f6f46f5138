"""One figure per claim: the claim's arms by evaluation length, mean over seeds with a 95 % t
interval and every seed drawn (issue 15: "a figure of accuracy by length per PE with intervals").

Per run, a curve {length: value} comes from what its task wrote: the addition grid.csv (exact
match by the longer operand's digits), the per-size CSV of the sized tasks (parity: scratchpad
step accuracy by bits), the flip-flop read error at each multiple of the training length, or the
held-out perplexity at each multiple.
"""

from __future__ import annotations

import csv
import functools
import json
import re
from typing import Any, Callable, Mapping

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure
from scipy import stats

from tape.report.document import Context, Figure
from tape.report.groups import artifact
from tape.report.heatmap import save_png
from tape.report.runs import Run

Curve = dict[int, float]


def grid_curve(correct_key: str, total_key: str) -> Callable[[Run], Curve]:
    """Accuracy (%) by the longer operand's digit count from the addition grid.csv, pooled over
    the cells: whole sums (correct / n) or answer digits (digits_correct / digits)."""

    def curve(run: Run) -> Curve:
        path = artifact(run, "grid.csv")
        if path is None:
            return {}
        total: dict[int, int] = {}
        correct: dict[int, int] = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                length = max(int(row["len_a"]), int(row["len_b"]))
                total[length] = total.get(length, 0) + int(row[total_key])
                correct[length] = correct.get(length, 0) + int(row[correct_key])
        return {k: 100.0 * correct[k] / total[k] for k in sorted(total) if total[k]}
    return curve


addition_curve = grid_curve("correct", "n")  # exact match by length


def size_curve(file: str, size_key: str, value_key: str) -> Callable[[Run], Curve]:
    """{size: value} from the per-size CSV a sized task wrote (parity.csv: bits -> step accuracy)."""

    def curve(run: Run) -> Curve:
        path = artifact(run, file)
        if path is None:
            return {}
        with open(path, newline="") as f:
            return {int(row[size_key]): float(row[value_key]) for row in csv.DictReader(f)}
    return curve


def multiple_curve(pattern: str) -> Callable[[Run], Curve]:
    """{m: metrics[key]} for every metrics key that matches ``pattern`` (one group: m)."""
    regex = re.compile(pattern)

    def curve(run: Run) -> Curve:
        found = {int(m.group(1)): float(v) for k, v in (run.metrics or {}).items()
                 if (m := regex.fullmatch(k)) and isinstance(v, (int, float))}
        return dict(sorted(found.items()))
    return curve


# task -> (curve of a run, x label, y label, log y)
TASK_CURVES: Mapping[str, tuple[Callable[[Run], Curve], str, str, bool]] = {
    "addition": (addition_curve, "digits of the longer operand", "exact match (%)", False),
    "flipflop": (multiple_curve(r"read_error_(\d+)x"), "evaluation length / training length",
                 "read error (%), mean over sparsities", True),
    "pretrain": (multiple_curve(r"ppl_(\d+)x"), "evaluation length / training length",
                 "held-out perplexity", False),
    "parity": (size_curve("parity.csv", "bits", "step_accuracy"), "bits in the string",
               "scratchpad step accuracy (%)", False),
    "word_problem": (multiple_curve(r"token_accuracy_(\d+)x"), "evaluation length / training length",
                     "prefix-product token accuracy (%)", False),
}
def corpus_curves(corpus: str, ylabel: str) -> tuple[Callable[[str], Callable[[Run], Curve]], str, str, bool]:
    """The spec of one recipe's perplexity on ``corpus`` by evaluation length (ppl_<corpus>_<n>_<recipe>)."""
    return (lambda method: multiple_curve(rf"ppl_{corpus}_(\d+)_{re.escape(method)}"),
            "evaluation length (tokens)", ylabel, False)


# claim metric -> the curve of one recipe (Arm.method) of runs that score several (C7: context
# extension), on the corpus the metric reads
METHOD_CURVES: Mapping[str, tuple[Callable[[str], Callable[[Run], Curve]], str, str, bool]] = {
    "nll_books_extended": corpus_curves("books", "held-out books perplexity"),
    "nll_stdlib_extended": corpus_curves("stdlib", "standard-library code perplexity"),
}
# a claim metric read from the same task another way (C1b: C1's addition runs, digit by digit)
METRIC_CURVES: Mapping[str, tuple[Callable[[Run], Curve], str, str, bool]] = {
    "ood_digit_accuracy": (grid_curve("digits_correct", "digits"), "digits of the longer operand",
                           "digit accuracy (%)", False),
}
FLOOR = 0.01  # a zero error drawn on a log scale
MIN_BAND_SEEDS = 3  # two seeds' t interval (t = 12.7) would cover every other arm: dots only
COLOURS = matplotlib.colormaps["tab20"].colors[0::2] + matplotlib.colormaps["tab20"].colors[1::2]  # 20 arms apart


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % t interval over seeds (the mean alone for one seed)."""
    mean = float(values.mean())
    if len(values) < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))
    return mean, mean - half, mean + half


def _draw(ax: Any, label: str, runs: list[Run], curve_of: Callable[[Run], Curve], log: bool, style: str) -> bool:
    """One arm's mean curve over its seeds with the 95 % band and every seed; whether it drew."""
    curves = [c for c in (curve_of(r) for r in runs) if c]
    if not curves:
        return False
    xs = sorted(set.intersection(*(set(c) for c in curves)))
    per_seed = np.array([[c[x] for x in xs] for c in curves])  # (seeds, lengths)
    if log:
        per_seed = np.maximum(per_seed, FLOOR)
    stats_ = [interval(per_seed[:, j]) for j in range(len(xs))]
    mean = np.array([s[0] for s in stats_])
    hollow = {"mfc": "none"} if style != "-" else {}  # a control's markers leave its dashes visible
    line = ax.plot(xs, mean, marker="o", ms=4, ls=style, label=f"{label} ({len(curves)} seeds)", **hollow)[0]
    if len(curves) >= MIN_BAND_SEEDS:
        low = [max(s[1], FLOOR) if log else s[1] for s in stats_]  # a log axis has no room below the floor
        ax.fill_between(xs, low, [s[2] for s in stats_], alpha=0.15, color=line.get_color())
    for row in per_seed:
        ax.scatter(xs, row, s=8, alpha=0.35, color=line.get_color())
    return True


def claim_figure(ctx: Context, claim_id: str, title: str, arms: Mapping[str, list[Run]],
                 task: str, train_length: int | None = None, metric: str = "",
                 controls: Mapping[str, list[Run]] | None = None,
                 methods: Mapping[str, str] | None = None) -> Figure | None:
    """The figure of one claim (None when no curve fits it or no arm has a run); a ``metric`` of
    METRIC_CURVES picks its own curve, else the task's; ``controls`` (the arms' positive-control
    runs) are drawn dashed; ``methods`` (arm title -> recipe) reads each arm's recipe from the runs
    they share (METHOD_CURVES, by the metric's corpus)."""
    spec = METHOD_CURVES.get(metric) if methods else METRIC_CURVES.get(metric) or TASK_CURVES.get(task)
    if spec is None or not any(arms.values()):
        return None
    curve_of, xlabel, ylabel, log = spec
    curves = {label: curve_of(methods[label]) for label in arms} if methods else dict.fromkeys(arms, curve_of)
    fig = MplFigure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_prop_cycle(color=COLOURS)
    if not any([_draw(ax, label, runs, curves[label], log, "-") for label, runs in arms.items()]):
        return None
    # controls: only claims whose arms are not recipes (the claims loader refuses the others)
    dashed = any([_draw(ax, label, runs, curve_of, log, "--") for label, runs in (controls or {}).items()])
    if log:
        ax.set_yscale("log")
    if train_length is not None:
        ax.axvline(train_length + 0.5, color="red", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: many arms
    ax.set_title(f"{claim_id}: {title} (ours; band: 95 % t interval, dots: seeds)", fontsize=9)
    path, rel = ctx.figure_path(f"claim_{claim_id.lower()}.png")
    save_png(fig, path, overwrite=True)
    notes = [f"band: 95 % t interval over seeds for arms of {MIN_BAND_SEEDS} or more", "dots: seeds"]
    notes += ["red line: the longest training length"] * (train_length is not None)
    notes += ["dashed: the arms' positive controls"] * dashed
    return Figure(rel, f"{claim_id}: {title}, every arm by length (ours; {'; '.join(notes)})")


def train_flops_per_step(run: Run) -> int | None:
    """Training FLOPs of one optimizer step of ``run`` (forward, loss, backward; matrix products,
    tape/bench/flops.py) from its config, or None when the config cannot say."""
    cfg = run.config()
    try:
        groups = json.dumps([cfg["model"], cfg["pe"]], sort_keys=True)
        return _flops_per_step(groups, int(cfg["task"]["batch_size"]), int(cfg["task"]["seq_len"]))
    except (KeyError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def _flops_per_step(groups: str, batch: int, seq_len: int) -> int:
    """``train_flops_per_step`` of the model and pe groups (JSON [model, pe]), counted once per
    setting: a count traces a whole step on the meta device (about half a second), and a
    claim's seeds and arms share a few settings."""
    from tape.bench.flops import model_costs
    import tape.pe as pe_registry
    from tape.model import ModelConfig

    model, pe = json.loads(groups)
    mc = ModelConfig.from_groups(dict(model), dict(pe), pe_registry.option_names())
    return model_costs(mc, batch, seq_len, backward=True)["flops"]


def validation_curve(run: Run, key: str = "val/loss") -> dict[int, float]:
    """{training steps done: value} of the run's validations (csv/metrics.csv)."""
    out: dict[int, float] = {}
    try:
        with open(run.path / "csv" / "metrics.csv", newline="") as f:
            for row in csv.DictReader(f):
                if row.get(key):
                    out[int(row["step"]) + 1] = float(row[key])  # Lightning logs the 0-based index
    except (OSError, ValueError, KeyError):
        return {}
    return out


def flops_figure(ctx: Context, claim_id: str, title: str, arms: Mapping[str, list[Run]]) -> Figure | None:
    """Held-out loss (nats/token) against cumulative training FLOPs, every arm (mean over seeds
    at each validation): compares encodings at equal compute whatever their step counts."""
    fig = MplFigure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_prop_cycle(color=COLOURS)
    drawn = False
    for label, runs in arms.items():
        curves = [(c, f) for r in runs if (c := validation_curve(r)) and (f := train_flops_per_step(r))]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c, _ in curves)))
        if not steps:
            continue
        flops = float(np.mean([f for _, f in curves]))
        mean = [float(np.mean([c[s] for c, _ in curves])) for s in steps]
        ax.plot([s * flops for s in steps], mean, marker="o", label=f"{label} ({len(curves)} seeds)")
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("cumulative training FLOPs (matrix products)")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: many arms
    ax.set_title(f"{claim_id}: {title}, loss at equal compute (ours; mean over seeds)", fontsize=9)
    path, rel = ctx.figure_path(f"claim_{claim_id.lower()}_flops.png")
    save_png(fig, path, overwrite=True)
    return Figure(rel, f"{claim_id}: held-out loss against cumulative training FLOPs, every arm (ours; "
                       "mean over seeds at each validation)")
