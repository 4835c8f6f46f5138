"""From-scratch pretraining: held-out perplexity per PE at 1x / 2x / 4x the training length.

Reads from each finished run (``task == "pretrain"``): metrics.json keys ``ppl_<m>x`` (any
multiplier m; the cpu preset writes 1, 2, 4) and config.yaml ``task.seq_len`` for the token
counts in the headers. The paper has no such table (its ablations, tape-spec E.6, use 155M
models on the Pile), so there is no paper column.
"""

from __future__ import annotations

import re

from tape.report.document import Context, Section
from tape.report.groups import Group, group_by, metric, of_scale, ordered, setting_notes
from tape.report.paper import PRETRAIN_PES, display
from tape.report.provenance import section_provenance
from tape.report.runs import Run
from tape.report.tables import Table

PPL_KEY = re.compile(r"^ppl_(\d+)x$")
SHIFT_KEY = re.compile(r"^shift_(attn|pe)_(add|shift)_layer(\d+)$")
DEFAULT_MULTIPLIERS = (1, 2, 4)


def build(ctx: Context, scale: str) -> Section:
    runs = of_scale(ctx.runs, scale, lambda task: task == "pretrain")
    groups = group_by(runs, lambda r: r.method, preset=ctx.preset)
    finished = [r for g in groups.values() for r in g.finished]
    mults = sorted({int(m.group(1)) for r in finished for k in (r.metrics or {})
                    if (m := PPL_KEY.match(k))}) or list(DEFAULT_MULTIPLIERS)
    seq_len = next((r.config().get("task", {}).get("seq_len") for r in finished
                    if isinstance(r.config().get("task", {}).get("seq_len"), int)), None)
    headers = [f"ppl @ {m * seq_len} tokens ({m}x)" if seq_len else f"ppl @ {m}x" for m in mults]
    rows = []
    for pe in ordered(groups, PRETRAIN_PES):
        g = groups.get(pe, Group())
        rows.append([display(pe), len(g.finished),
                     *(g.cell(metric(f"ppl_{m}x"), f"ppl_{m}x") for m in mults)])
    table = Table(
        name=f"pretrain_{scale}",
        title=f"Pretraining, {scale} scale: held-out perplexity by evaluation length (lower is better)",
        columns=["PE", "seeds", *headers],
        rows=rows,
        notes=["Ours only: the paper reports no perplexity table for this experiment. "
               + (f"Trained on {seq_len}-token blocks; " if seq_len else "")
               + "evaluations longer than the blocks measure length extrapolation. Mean ± sample std "
                 "over seeds.", *setting_notes(groups)],
        provenance=section_provenance(finished, ctx),
    )
    shift_tables = [t for kind in ("attn", "pe") if (t := _shift_table(ctx, scale, groups, finished, kind))]
    return Section(title=f"Pretraining perplexity ({scale})", tables=[table, *shift_tables])


SHIFT_TABLES = {  # kind -> (title, unit, scale of the metric)
    "attn": ("attention-weight change", "x 10^-2", 100.0),
    "pe": ("positional dot-product change", "%", 1.0),
}


def _shift_table(ctx: Context, scale: str, groups: dict[str, Group], finished: list[Run],
                 kind: str) -> Table | None:
    """Table 8's layout: per PE, the change when three [BOS] tokens are prepended ("add") or the
    position ids start at 3 ("shift"), per layer (tape/metrics/shift_robustness.py); None when
    no run measured it."""
    layers = sorted({int(m.group(3)) for r in finished for k in (r.metrics or {})
                     if (m := SHIFT_KEY.match(k)) and m.group(1) == kind})
    if not layers:
        return None
    title, unit, factor = SHIFT_TABLES[kind]
    keys = [f"shift_{kind}_{how}_layer{layer}" for how in ("add", "shift") for layer in layers]

    def scaled(key: str):
        get = metric(key)
        return lambda run: None if (v := get(run)) is None else factor * v

    rows, used = [], []
    for pe, g in ((pe, groups[pe]) for pe in ordered(groups, PRETRAIN_PES) if pe in groups):
        measured = Group(finished=[r for r in g.finished if keys[0] in (r.metrics or {})])
        if measured.finished:
            used += measured.finished
            rows.append([display(pe), len(measured.finished),
                         *(measured.cell(scaled(k), k) for k in keys)])
    return Table(
        name=f"pretrain_{scale}_shift_{kind}",
        title=f"Pretraining, {scale} scale: {title} ({unit}) with three [BOS] tokens prepended "
              "(add) or position ids started at 3 (shift), by layer (the paper's Table 8)",
        columns=["PE", "seeds", *(f"{how} L{layer}" for how in ("add", "shift") for layer in layers)],
        rows=rows, digits=3,
        notes=["Measured on 8 held-out blocks of the training length in float32 (docs/experiments.md "
               "defines both numbers; the paper does not). A PE exactly invariant to a shift of "
               "positions scores float rounding under shift. Mean ± sample std over the seeds whose "
               "runs measured it (runs from 2026-12-06 on)."],
        provenance=section_provenance(used, ctx),
    )
