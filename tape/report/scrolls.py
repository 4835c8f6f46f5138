"""SCROLLS, the paper's Table 1: rows PE, columns the seven tasks; each PE has a row of ours
and a row of the paper's numbers, labelled.

The SCROLLS task is being written beside this reader, so the reader is tolerant. It reads a
finished run as SCROLLS when metrics.json ``task`` starts with ``scrolls``, and then:
- the dataset: ``scrolls_task``; else the part of ``task`` after ``scrolls/``, ``scrolls_`` or
  ``scrolls-``; else config.yaml ``task.dataset`` or ``task.scrolls_task``. It must be one of the
  seven names of ``tape.data.scrolls.TASKS`` (qasper, contract_nli, ...); other runs are ignored.
- the score (in %, as ``tape.metrics.scrolls`` writes it): ``scrolls_score``; else the task's
  metric: ``f1``; ``exact_match`` or ``em``; ``rouge_gm``, ``rouge_geometric_mean`` or
  ``rouge/geometric_mean``; each also tried with an ``eval_``, ``test_``, ``validation_`` or
  ``val_`` prefix.
A cell with no finished run reads "not run: data unavailable" (SCROLLS needs the hub or local
copies of its data; nothing runs offline).
"""

from __future__ import annotations

from typing import Any

from tape.data.scrolls import TASKS
from tape.report.document import Context, Section
from tape.report.groups import Group, group_by, of_scale, ordered, setting_notes
from tape.report.paper import (
    SCROLLS_MEDIAN_LENGTH, SCROLLS_NOPE_REPO_HISTORY, SCROLLS_ORDER, SCROLLS_PES, SCROLLS_TABLE1,
    display,
)
from tape.report.provenance import section_provenance
from tape.report.runs import Run
from tape.report.stats import Missing
from tape.report.tables import Table

METRIC_LABEL = {"f1": "F1", "exact_match": "EM", "rouge": "Rgm"}
SCORE_KEYS = {"f1": ("f1",), "exact_match": ("exact_match", "em"),
              "rouge": ("rouge_gm", "rouge_geometric_mean", "rouge/geometric_mean")}
PREFIXES = ("", "eval_", "test_", "validation_", "val_")
NOT_RUN = "not run: data unavailable"


def dataset(run: Run) -> str | None:
    """The SCROLLS dataset a run evaluated, or None when it is not a SCROLLS run."""
    m = run.metrics or {}
    task = str(m.get("task") or run.task)
    if not task.startswith("scrolls"):
        return None
    name = m.get("scrolls_task")
    if not name:
        for sep in ("/", "_", "-"):
            if task.startswith("scrolls" + sep):
                name = task[len("scrolls") + 1:]
                break
    if not name:
        cfg_task = run.config().get("task") or {}
        name = cfg_task.get("dataset") or cfg_task.get("scrolls_task")
    return str(name) if name in TASKS else None


def score(metrics: dict[str, Any], name: str) -> float | None:
    """The task's score from a metrics dict (keys as in the module docstring), else None."""
    keys = ("scrolls_score", *SCORE_KEYS[TASKS[name].metric])
    for key in keys:
        for prefix in PREFIXES:
            value = metrics.get(prefix + key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def header(name: str) -> str:
    return f"{TASKS[name].column} {METRIC_LABEL[TASKS[name].metric]}"


def _paper_row(pe: str) -> list[Any]:
    if pe in SCROLLS_TABLE1:
        return [SCROLLS_TABLE1[pe][t] for t in SCROLLS_ORDER]
    if pe == "nope":
        return [SCROLLS_NOPE_REPO_HISTORY.get(t, Missing("not reported")) for t in SCROLLS_ORDER]
    return [Missing("not reported")] * len(SCROLLS_ORDER)


def build(ctx: Context, scale: str) -> Section:
    runs = of_scale(ctx.runs, scale, lambda task: task.startswith("scrolls"))
    groups = group_by(runs, lambda r: f"{r.pe}\t{dataset(r)}" if dataset(r) else None)
    pes = {key.split("\t")[0] for key in groups}
    rows: list[list[Any]] = [["median length (paper)", "", *(SCROLLS_MEDIAN_LENGTH[t] for t in SCROLLS_ORDER)]]
    for pe in ordered(pes, SCROLLS_PES):
        ours = []
        for t in SCROLLS_ORDER:
            g = groups.get(f"{pe}\t{t}", Group())
            cell = g.cell(lambda r, t=t: score(r.metrics or {}, t), f"{t} score")
            ours.append(Missing(NOT_RUN) if isinstance(cell, Missing) and cell.reason == "not run" else cell)
        seeds = sorted({s for t in SCROLLS_ORDER for s in groups.get(f"{pe}\t{t}", Group()).seeds})
        rows.append([f"{display(pe)} (ours)", len(seeds), *ours])
        source = "repo history" if pe == "nope" else "paper"
        rows.append([f"{display(pe)} ({source})", "", *_paper_row(pe)])
    finished = [r for g in groups.values() for r in g.finished]
    table = Table(
        name=f"scrolls_{scale}",
        title=f"SCROLLS (Table 1 layout), {scale} scale: ours beside the paper's",
        columns=["PE", "seeds", *(header(t) for t in SCROLLS_ORDER)],
        rows=rows,
        notes=["Rows marked (paper) are **the paper's** Table 1 (155M models pretrained on C4 at "
               "1,024 tokens, fine-tuned per task)" + ("; the NoPE row marked (repo history) is from the "
               "authors' repository history and is not in the paper (QA tasks only)." if "nope" in pes else "."),
               f"\"{NOT_RUN}\": SCROLLS needs the tau/scrolls data from the hub or local copies, and "
               "nothing runs offline; no number is filled in.",
               "Ours: mean ± sample std over seeds; F1/EM/ROUGE geometric mean in %.",
               *setting_notes(groups, compared=None)],
        provenance=section_provenance(finished, ctx),
    )
    return Section(title=f"SCROLLS ({scale})", tables=[table])
