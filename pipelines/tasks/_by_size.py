"""Evaluation by problem size for the variable-length synthetic tasks (parity: bits, MQAR: pairs,
selective copy: slots, counting: operations): the tested sizes, teacher-forced scoring of fixed
test sets, one CSV row per size, and the summary metrics.

Not a task (the registry skips modules whose name starts with ``_``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pipelines.result_files import write_csv
from tape.data.synthetic import ANSWER, STEP, scored_roles, teacher_forced_hits


def tested_sizes(trained_max: int, multiplier: int, every: int, smallest: int = 1) -> list[int]:
    """Every ``every``-th size from ``smallest`` up to multiplier * trained_max, and each
    k * trained_max."""
    top = multiplier * trained_max
    return sorted({n for n in range(smallest, top + 1) if n % every == 0 or n % trained_max == 0})


def score(model: Any, tokens: np.ndarray, roles: np.ndarray, batch_size: int,
          score_copies: bool = False) -> dict[str, float]:
    """Accuracy (%) of the scratchpad steps and of the answers (NaN where there are none), and
    the exact match: every scored token right under teacher forcing, which is exactly when
    greedy decoding (given tokens forced) reproduces the whole scored part."""
    hits = teacher_forced_hits(model, tokens, batch_size)  # (B, T)
    scored = np.isin(roles, scored_roles(score_copies))
    out = {}
    for name, role in (("step_accuracy", STEP), ("answer_accuracy", ANSWER)):
        mask = roles == role
        out[name] = 100.0 * float(hits[mask].mean()) if mask.any() else float("nan")
    out["exact_match"] = 100.0 * float((hits | ~scored).all(axis=1).mean())
    return out


def evaluate_sizes(model: Any, sizes: Sequence[int], test_set: Callable[[int], tuple[np.ndarray, np.ndarray]],
                   batch_size: int, size_key: str, columns: Sequence[str],
                   score_copies: bool = False) -> list[dict[str, Any]]:
    """One row per size: ``size_key``, the tokens of a sequence, the count and ``columns``."""
    was_training = model.training
    model.eval()
    rows = []
    for size in sizes:
        tokens, roles = test_set(size)
        result = score(model, tokens, roles, batch_size, score_copies)
        rows.append({size_key: size, "tokens": tokens.shape[1], "sequences": len(tokens),
                     **{c: result[c] for c in columns}})
    model.train(was_training)
    return rows


def summary(rows: Sequence[dict[str, Any]], size_key: str, columns: Sequence[str], trained_max: int,
            multipliers: Sequence[int]) -> dict[str, float]:
    """Per column: ``<c>_id`` (mean over sizes <= trained_max), ``<c>_ood`` (mean over larger
    sizes) and ``<c>_<m>x`` (the size m * trained_max, where it was evaluated)."""
    out: dict[str, float] = {}
    for c in columns:
        ind = [r[c] for r in rows if r[size_key] <= trained_max]
        ood = [r[c] for r in rows if r[size_key] > trained_max]
        if ind:
            out[f"{c}_id"] = float(np.mean(ind))
        if ood:
            out[f"{c}_ood"] = float(np.mean(ood))
        by_size = {r[size_key]: r[c] for r in rows}
        for m in multipliers:
            if m * trained_max in by_size:
                out[f"{c}_{m}x"] = float(by_size[m * trained_max])
    return out


def evaluate_to_csv(model: Any, sizes: Sequence[int], test_set: Callable[[int], tuple[np.ndarray, np.ndarray]],
                    batch_size: int, size_key: str, columns: Sequence[str], trained_max: int, multiplier: int,
                    csv_path: Path, score_copies: bool = False, **fixed: Any) -> dict[str, float]:
    """Score every size, write one CSV row per size (``fixed`` columns first) and return the
    summary metrics with ``eval_time_s``."""
    t0 = time.perf_counter()
    rows = evaluate_sizes(model, sizes, test_set, batch_size, size_key, columns, score_copies)
    rows = [{**fixed, **r} for r in rows]
    metrics = summary(rows, size_key, columns, trained_max, range(1, multiplier + 1))
    write_csv(rows, list(rows[0]), csv_path)
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics
