"""Context extension (tape-spec E.3 Table 2, E.4 Fig. 3): perplexity per method x corpus x
length and passkey accuracy per method x length, each beside the paper's numbers.

Reads from each finished run (``task == "context_extension"``, written by
``python -m pipelines.extend``): ``perplexity.csv`` (columns method, corpus, length, perplexity)
and ``passkey.csv`` (method, target_tokens, mean_tokens, trials, accuracy); when a CSV is
missing, the metrics.json keys ``ppl_<corpus>_<length>_<method>`` and
``passkey_<target_tokens>_<method>`` instead. Also ``context``, ``target_context``,
``base_passkey_at_context`` and ``base_retrieves`` from metrics.json: a seed whose base model
misses its own context's passkeys (issue 15) is invalid for passkey retrieval, named in the notes
and left out of the passkey table and figure, never averaged.
Seeds are combined per cell (mean ± sample std).
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure

from tape.report.document import Context, Figure, Section
from tape.report.groups import artifact, group_by, of_scale, ordered, setting_notes
from tape.report.heatmap import save_png
from tape.report.paper import (
    EXTENSION_LENGTHS, EXTENSION_METHODS, EXTENSION_TABLE2, PASSKEY_FIG3, PASSKEY_TOKENS, display,
)
from tape.report.provenance import section_provenance
from tape.report.runs import Run
from tape.report.stats import Missing, Summary, summarize
from tape.report.tables import Table

PPL_KEY = re.compile(r"^ppl_(?P<corpus>.+)_(?P<length>\d+)_(?P<method>[a-z0-9]+)$")
PASSKEY_KEY = re.compile(r"^passkey_(?P<length>\d+)_(?P<method>[a-z0-9]+)$")
PAPER_CORPUS = {"proof_pile": "PP", "pg19": "PG19"}


def _read_csv(path: Path | None) -> list[dict[str, str]] | None:
    if path is None:
        return None
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return None


def _num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def perplexity_rows(run: Run) -> dict[tuple[str, str, int], float]:
    """(method, corpus, length) -> perplexity of one run."""
    out: dict[tuple[str, str, int], float] = {}
    rows = _read_csv(artifact(run, "perplexity.csv"))
    if rows is not None:
        for r in rows:
            value, length = _num(r.get("perplexity")), _num(r.get("length"))
            if value is not None and length is not None and r.get("method") and r.get("corpus"):
                out[(r["method"], r["corpus"], int(length))] = value
        return out
    for key, value in (run.metrics or {}).items():
        if (m := PPL_KEY.match(key)) and _num(value) is not None:
            out[(m["method"], m["corpus"], int(m["length"]))] = float(value)
    return out


def passkey_rows(run: Run) -> dict[tuple[str, int], tuple[float, float | None]]:
    """(method, target_tokens) -> (accuracy, mean prompt tokens or None) of one run."""
    out: dict[tuple[str, int], tuple[float, float | None]] = {}
    rows = _read_csv(artifact(run, "passkey.csv"))
    if rows is not None:
        for r in rows:
            acc, n = _num(r.get("accuracy")), _num(r.get("target_tokens"))
            if acc is not None and n is not None and r.get("method"):
                out[(r["method"], int(n))] = (acc, _num(r.get("mean_tokens")))
        return out
    for key, value in (run.metrics or {}).items():
        if (m := PASSKEY_KEY.match(key)) and _num(value) is not None:
            out[(m["method"], int(m["length"]))] = (float(value), None)
    return out


def _combine(per_run: Iterable[dict]) -> dict:
    values: dict = defaultdict(list)
    for table in per_run:
        for key, value in table.items():
            values[key].append(value)
    return values


def _cell(values: list[float] | None) -> Summary | Missing:
    return summarize(values) if values else Missing("not evaluated")


def build(ctx: Context, scale: str) -> Section:
    runs = of_scale(ctx.runs, scale, lambda task: task == "context_extension")
    variants = [r for r in runs if r.variant]
    runs = [r for r in runs if r not in variants]
    groups = group_by(runs, lambda r: "all", preset=ctx.preset)
    g = groups.get("all")
    finished = g.finished if g else []
    unfinished = g.unfinished if g else []
    stamp = section_provenance(finished, ctx)
    section = Section(title=f"Context extension ({scale})")
    # seeds whose base retrieves at its own context: the only ones the passkey table and figure use
    valid = [r for r in finished if (r.metrics or {}).get("base_retrieves") is not False]
    if variants:
        section.paragraphs.append(
            f"{len(variants)} run(s) with passkey rows mixed into the extension "
            "(`extend.passkey_rows>0`, our variant, not the paper's protocol) are left out here: "
            + ", ".join(f"`{r.path}`" for r in variants) + ".")
    if not finished:
        why = (f"unfinished: {len(unfinished)} run(s) without metrics.json" if unfinished
               else "not run")
        section.paragraphs.append(f"Ours: {why} (`python -m pipelines.extend "
                                  f"experiment=context_extension/{scale}`).")
    else:
        section.paragraphs += _notes(finished) + setting_notes(groups, compared=None)
        section.tables += [_ppl_table(finished, scale, stamp)]
        if valid:
            section.tables.append(_passkey_table(valid, scale, section_provenance(valid, ctx)))
        else:
            section.paragraphs.append("Passkey retrieval: no valid seed (every base model misses "
                                      "its own context's passkeys), so no passkey table.")
    section.tables += [_paper_ppl_table(), _paper_passkey_table()]
    path, rel = ctx.figure_path(f"passkey_{scale}.png")
    save_png(_passkey_figure(valid, scale), path, overwrite=True)
    section.figures.append(Figure(rel, f"Passkey retrieval: ours ({scale} scale, left) beside "
                                       "the paper's Fig. 3 values (Llama-2-7B, right)"))
    return section


def _notes(runs: list[Run]) -> list[str]:
    m = runs[0].metrics or {}
    notes = [f"Ours: a RoPE Llama pretrained at {m.get('context', '?')} tokens, extended to "
             f"{m.get('target_context', '?')} with each recipe; {len(runs)} seed(s) "
             f"({', '.join(str(r.seed) for r in runs)}). The paper extends Llama-2-7B from 4k to 8k: "
             "compare the ordering of the recipes, not the values."]
    for r in runs:
        rm = r.metrics or {}
        if rm.get("base_retrieves") is False:
            notes.append(f"Seed {r.seed} is invalid for passkey retrieval and left out of the passkey "
                         f"table and figure: its base model retrieves "
                         f"{100 * float(rm.get('base_passkey_at_context', 0)):.0f}% of passkeys at its "
                         "own context (below task.eval.min_base_passkey), so its extension measures "
                         "little. Its perplexities are kept.")
    return notes


def _ppl_table(runs: list[Run], scale: str, stamp: str) -> Table:
    values = _combine(perplexity_rows(r) for r in runs)
    cols = sorted({(c, n) for _, c, n in values}, key=lambda cn: (cn[0], cn[1]))
    methods = ordered({m for m, _, _ in values}, EXTENSION_METHODS)
    rows = [[display(m), *(_cell(values.get((m, c, n))) for c, n in cols)] for m in methods]
    return Table(name=f"context_extension_{scale}_perplexity",
                 title=f"Context extension, {scale} scale: perplexity (ours, lower is better)",
                 columns=["method", *(f"{c} {n}" for c, n in cols)], rows=rows, digits=3,
                 notes=["Mean ± sample std over seeds; column = corpus and evaluation length in tokens."],
                 provenance=stamp)


def _passkey_table(runs: list[Run], scale: str, stamp: str) -> Table:
    per_run = [passkey_rows(r) for r in runs]
    acc = _combine({k: v[0] for k, v in t.items()} for t in per_run)
    mean_tokens = _combine({k[1]: v[1] for k, v in t.items() if v[1] is not None} for t in per_run)
    lengths = sorted({n for _, n in acc})
    methods = ordered({m for m, _ in acc}, EXTENSION_METHODS)

    def head(n: int) -> str:
        toks = mean_tokens.get(n)
        return f"<= {n} tokens" + (f" (mean {sum(toks) / len(toks):.0f})" if toks else "")

    return Table(name=f"context_extension_{scale}_passkey",
                 title=f"Context extension, {scale} scale: passkey accuracy (ours)",
                 columns=["method", *(head(n) for n in lengths)],
                 rows=[[display(m), *(_cell(acc.get((m, n))) for n in lengths)] for m in methods],
                 notes=["Fraction of trials retrieving the passkey; mean ± sample std over seeds."],
                 provenance=stamp)


def _paper_ppl_table() -> Table:
    cols = [(c, n) for c in PAPER_CORPUS for n in EXTENSION_LENGTHS]
    return Table(
        name="paper_table2_perplexity",
        title="The paper's Table 2 (Llama-2-7B extended to 8k): perplexity, paper's numbers",
        columns=["method", *(f"paper {PAPER_CORPUS[c]} {n}" for c, n in cols)],
        rows=[[display(m), *(EXTENSION_TABLE2[m][cn] for cn in cols)] for m in EXTENSION_TABLE2],
        digits=3, notes=["**The paper's** numbers (tape-spec E.3), not ours. PP = Proof-pile."])


def _paper_passkey_table() -> Table:
    return Table(
        name="paper_fig3_passkey",
        title="The paper's Fig. 3 (Llama-2-7B): passkey accuracy over 20 trials, paper's numbers",
        columns=["method", *(f"paper ~{n} tokens" for n in PASSKEY_TOKENS)],
        rows=[[display(m), *vals] for m, vals in PASSKEY_FIG3.items()],
        notes=["**The paper's** values (tape-spec E.4, from the authors' plotting script), not ours."])


def _colour(method: str) -> str:
    """The same colour for a method in both panels."""
    names = list(EXTENSION_METHODS)
    return f"C{names.index(method)}" if method in names else "black"


def _passkey_figure(runs: list[Run], scale: str) -> MplFigure:
    fig = MplFigure(figsize=(11, 3.8))
    FigureCanvasAgg(fig)
    ours, paper = fig.subplots(1, 2, sharey=True)
    series = _combine({(m, n): (a, t) for (m, n), (a, t) in passkey_rows(r).items()} for r in runs)
    methods = ordered({m for m, _ in series}, EXTENSION_METHODS) if series else []
    for m in methods:
        pts = sorted((n, sum(a for a, _ in v) / len(v)) for (mm, n), v in series.items() if mm == m)
        if pts:
            ours.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=display(m),
                      linestyle="--" if m == "base" else "-", color=_colour(m))
    if not methods:
        ours.text(0.5, 0.5, "not run", ha="center", va="center", transform=ours.transAxes)
    ours.set(title=f"ours ({scale} scale)", xlabel="max prompt tokens", ylabel="passkey accuracy",
             ylim=(-0.03, 1.03))
    for m, vals in PASSKEY_FIG3.items():
        paper.plot(PASSKEY_TOKENS, vals, marker="o", label=display(m), color=_colour(m))
    paper.set(title="the paper's Fig. 3 values (Llama-2-7B)", xlabel="mean prompt tokens")
    for ax in (ours, paper):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return fig
