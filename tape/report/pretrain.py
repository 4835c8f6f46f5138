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
from tape.report.tables import Table

PPL_KEY = re.compile(r"^ppl_(\d+)x$")
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
    return Section(title=f"Pretraining perplexity ({scale})", tables=[table])
