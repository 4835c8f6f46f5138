"""Tables and the figure of the context-extension experiment: tidy CSVs, markdown tables and the
passkey accuracy-vs-length plot (one line per method). Reads rows, never W&B."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

PPL_FIELDS = ["method", "corpus", "length", "perplexity", "nll", "windows", "scored_tokens"]
PASSKEY_FIELDS = ["method", "target_tokens", "n_garbage", "mean_tokens", "trials", "accuracy"]


def _methods(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in rows))


def perplexity_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per method, one column per (corpus, length)."""
    cols = list(dict.fromkeys((r["corpus"], r["length"]) for r in rows))
    value = {(r["method"], r["corpus"], r["length"]): r["perplexity"] for r in rows}
    lines = ["| method | " + " | ".join(f"{c} {n}" for c, n in cols) + " |",
             "|---|" + "---|" * len(cols)]
    # bold: the best extended model per column (none in a base-only run, extend.recipes=[])
    best = {c: min((value[(k, *c)] for k in _methods(rows) if (k, *c) in value and k != "base"), default=None)
            for c in cols}
    for m in _methods(rows):
        cells = [f"**{value[(m, *c)]:.3f}**" if m != "base" and value.get((m, *c)) == best[c]
                 else f"{value[(m, *c)]:.3f}" if (m, *c) in value else "" for c in cols]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def passkey_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per method, one column per target length (mean prompt tokens below)."""
    lengths = list(dict.fromkeys(r["target_tokens"] for r in rows))
    acc = {(r["method"], r["target_tokens"]): r for r in rows}
    mean = {n: rows_mean([r["mean_tokens"] for r in rows if r["target_tokens"] == n]) for n in lengths}
    lines = ["| method | " + " | ".join(f"<= {n} ({mean[n]:.0f})" for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for m in _methods(rows):
        cells = [f"{acc[(m, n)]['accuracy']:.2f}" if (m, n) in acc else "" for n in lengths]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def multiple_choice_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per method, one column per benchmark and group (acc ± its standard error)."""
    cols = list(dict.fromkeys((r["benchmark"], r["group"]) for r in rows))
    cell = {(r["method"], r["benchmark"], r["group"]): f"{r['acc']:.2f} ± {r['acc_stderr']:.2f}" for r in rows}
    lines = ["| method | " + " | ".join(f"{b} {g}" for b, g in cols) + " |", "|---|" + "---|" * len(cols)]
    for m in _methods(rows):
        lines.append(f"| {m} | " + " | ".join(cell.get((m, *c), "") for c in cols) + " |")
    return "\n".join(lines)


def paired_table(records: dict[str, list[dict[str, Any]]], reference: str) -> str:
    """Markdown: per model other than ``reference``, per benchmark and group, its accuracy minus
    the reference's on the same items (``tape.report.paired.paired_difference``)."""
    from pipelines.tasks.multiple_choice import groups, in_group
    from tape.report.paired import paired_difference

    ref = records[reference]
    cols = [(b, g) for b in dict.fromkeys(r["benchmark"] for r in ref) for g in groups(b)
            if any(r["benchmark"] == b and in_group(r, g) for r in ref)]
    lines = ["| method | " + " | ".join(f"{b} {g}" for b, g in cols) + " |", "|---|" + "---|" * len(cols)]
    for method, mine in records.items():
        if method == reference:
            continue
        cells = []
        for b, g in cols:
            theirs = {r["item"]: r["correct"] for r in ref if r["benchmark"] == b and in_group(r, g)}
            ours = {r["item"]: r["correct"] for r in mine if r["benchmark"] == b and in_group(r, g)}
            d = paired_difference([ours[i] for i in theirs], [theirs[i] for i in theirs])
            cells.append(f"{d.delta:+.2f} [{d.low:+.2f}, {d.high:+.2f}], p {d.p_value:.2g}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_mean(values: Sequence[float]) -> float:
    return sum(values) / max(len(values), 1)


def plot_passkey(rows: Sequence[dict[str, Any]], path: Path, title: str, context: int | None = None) -> None:
    """Accuracy against mean prompt tokens, one line per method; a dotted line at ``context``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for m in _methods(rows):
        pts = sorted((r["mean_tokens"], r["accuracy"]) for r in rows if r["method"] == m)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m,
                linestyle="--" if m == "base" else "-")
    if context:
        ax.axvline(context, color="grey", linestyle=":", label=f"pretraining context {context}")
    ax.set(xlabel="prompt tokens (mean over trials)", ylabel="passkey accuracy", ylim=(-0.03, 1.03),
           title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
