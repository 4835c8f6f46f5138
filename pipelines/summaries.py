"""What a run and a multirun print when they end: headline metrics, run directory, timing."""

from __future__ import annotations

import re
from typing import Any


HEADLINE = re.compile(r"(accuracy|^ppl_|^passkey_|score|^f1$|^exact_match|^rouge|^val_loss$|^read_error_(ood|\d+x)$)")


def headline(metrics: dict[str, Any]) -> dict[str, float]:
    """The task's headline numbers: accuracies (addition), perplexities (pretraining, context
    extension), passkey accuracies, scores (SCROLLS), flip-flop read errors by length, and the
    final validation loss."""
    return {k: float(v) for k, v in metrics.items()
            if HEADLINE.search(k) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _fmt(metrics: dict[str, float], limit: int = 8) -> str:
    items = [f"{k} {v:.4g}" for k, v in list(metrics.items())[:limit]]
    more = len(metrics) - limit
    return ", ".join(items) + (f" (+{more} more in metrics.json)" if more > 0 else "")


def run_summary(job: dict[str, Any]) -> str:
    """One screen: what ran, where, its headline metrics and how long it took."""
    cfg, m = job["cfg"], job["metrics"]
    what = " ".join(f"{k}={v}" for k, v in (
        ("experiment", cfg.get("experiment_name")), ("pe", (cfg.get("pe") or {}).get("name")),
        ("seed", cfg.get("seed"))) if v is not None) or " ".join(  # an evaluation: the run it read
        f"{k}={v}" for k, v in (("run_dir", cfg.get("run_dir")), ("task", (cfg.get("task") or {}).get("name")))
        if v is not None)
    lines = [f"---- {job['entry']} done: {what}",
             f"  metrics: {_fmt(headline(m)) or 'none'}"]
    timing = [f"{k} {float(m[k]):.1f}" for k in ("steps", "train_time_s", "wall_time_s") if k in m]
    if timing:
        lines.append(f"  {', '.join(timing)}")
    if m.get("resumed_from"):
        lines.append(f"  resumed from {m['resumed_from']}")
    return "\n".join(lines)


def multirun_summary(jobs: list[dict[str, Any]]) -> str:
    """One line per job of a multirun: ok / FAILED, its overrides' effect, run dir and headline."""
    lines = [f"==== multirun: {sum(not j['failed'] for j in jobs)} of {len(jobs)} jobs finished"]
    for i, j in enumerate(jobs):
        cfg = j["cfg"]
        what = f"{cfg.get('experiment_name')} pe={(cfg.get('pe') or {}).get('name')} seed={cfg.get('seed')}"
        tail = "(its error is printed above)" if j["failed"] else _fmt(headline(j["metrics"]), limit=3)
        lines.append(f"  [{i}] {'FAILED' if j['failed'] else 'ok':6} {what}: {tail}")
        lines.append(f"       {j['run_dir']}")
    return "\n".join(lines)
