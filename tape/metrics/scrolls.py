"""SCROLLS metrics, written for this project to match the official metric (tape-spec D.2).

The official metric lives in the hub repo tau/scrolls (``metrics/scrolls.py`` with ``f1.py``,
``exact_match.py`` and ``rouge.py``); TAPE scored its validation predictions with it. What it
does, and so what we do:

* token F1 (qasper, narrative_qa) and exact match (quality, contract_nli) on SQuAD-style
  normalised text: lower-case, punctuation deleted, the articles a/an/the removed, whitespace
  collapsed. F1 is over bags of tokens; a prediction or reference with no tokens scores 0.
* ROUGE-1/2/L (qmsum, summ_screen_fd, gov_report): ``rouge-score`` F-measures with
  ``use_stemmer=False``. The geometric mean (R1 * R2 * RL)^(1/3) is taken after averaging each
  over the examples.
* an example with several references takes the maximum over them, for ROUGE separately for each
  of R1, R2 and RL; the task score is the mean over examples. Everything is in % (x100).

Left out on purpose: ROUGE-Lsum, which needs NLTK's punkt sentence splitter (a download) and is
not part of the SCROLLS score. The official post-processing (sentences joined by newlines) only
matters for ROUGE-Lsum: ``rouge-score``'s tokenizer treats newlines as spaces.

Predictions are a JSON object ``{id: prediction}``. :func:`verify` reports missing, extra and
duplicate ids and non-string values before anything is scored; :func:`score_file` writes one
metrics JSON (or, on a verification failure, the errors) per task.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tape.data.scrolls import get_task
from tape.optional import require

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")
_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, delete punctuation, drop a/an/the, collapse whitespace (SQuAD v1.1 order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall after normalisation, in [0, 1]."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised texts are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def best_over_references(
    fn: Callable[[str, str], float], prediction: str, references: Sequence[str]
) -> float:
    """The best score of ``prediction`` against any of its references."""
    if not references:
        raise ValueError("an example needs at least one reference")
    return max(fn(prediction, ref) for ref in references)


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    rouge_scorer = require("rouge_score.rouge_scorer", "SCROLLS' ROUGE")
    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=False)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F-measures of ``prediction`` against ``reference``, in [0, 1], no stemming."""
    scores = _rouge_scorer().score(reference, prediction)  # rouge-score takes (target, prediction)
    return {k: scores[k].fmeasure for k in ROUGE_KEYS}


def geometric_mean(values: Sequence[float]) -> float:
    """(v1 * ... * vn)^(1/n) for non-negative values; 0 if any is 0."""
    if any(v < 0 for v in values):
        raise ValueError(f"geometric mean of negative values {values}")
    return math.prod(values) ** (1.0 / len(values))


def compute_scores(
    metric: str, predictions: Sequence[str], references: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Task scores in %: ``{"f1"}``, ``{"exact_match"}`` or ``{"rouge/rouge1", "rouge/rouge2",
    "rouge/rougeL", "rouge/geometric_mean"}``, each the mean over examples of the best over
    references."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    if not predictions:
        raise ValueError("nothing to score: no predictions")
    n = len(predictions)
    if metric in ("f1", "exact_match"):
        fn = token_f1 if metric == "f1" else exact_match
        total = sum(best_over_references(fn, p, refs) for p, refs in zip(predictions, references))
        return {metric: 100.0 * total / n}
    if metric == "rouge":
        sums = dict.fromkeys(ROUGE_KEYS, 0.0)
        for pred, refs in zip(predictions, references):
            if not refs:
                raise ValueError("an example needs at least one reference")
            per_ref = [rouge(pred, ref) for ref in refs]
            for k in ROUGE_KEYS:
                sums[k] += max(s[k] for s in per_ref)
        out = {f"rouge/{k}": 100.0 * sums[k] / n for k in ROUGE_KEYS}
        out["rouge/geometric_mean"] = geometric_mean([out[f"rouge/{k}"] for k in ROUGE_KEYS])
        return out
    raise ValueError(f"unknown SCROLLS metric {metric!r}: expected f1, exact_match or rouge")


SCORE_KEY = {"f1": "f1", "exact_match": "exact_match", "rouge": "rouge/geometric_mean"}


@dataclass
class Verification:
    """What is wrong with a predictions object before scoring; ``ok`` when nothing is."""

    missing: list[str] = field(default_factory=list)  # reference ids without a prediction
    extra: list[str] = field(default_factory=list)  # predicted ids that are not references
    duplicates: list[str] = field(default_factory=list)  # ids given more than once in the file
    not_strings: list[str] = field(default_factory=list)  # ids whose prediction is not a string
    not_an_object: bool = False

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.duplicates or self.not_strings
                    or self.not_an_object)

    def errors(self) -> list[str]:
        """One readable line per problem, with a few example ids."""
        def some(ids: list[str]) -> str:
            return ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")

        if self.not_an_object:
            return ['predictions must be one JSON object {"id": "prediction", ...}']
        problems = (
            (self.missing, "reference id(s) have no prediction"),
            (self.extra, "predicted id(s) are not in the references"),
            (self.duplicates, "id(s) are predicted more than once"),
            (self.not_strings, "prediction(s) are not strings"),
        )
        return [f"{len(ids)} {what}: {some(ids)}" for ids, what in problems if ids]


def verify(
    predictions: Any, references: Mapping[str, Sequence[str]], duplicates: Sequence[str] = ()
) -> Verification:
    """Check predictions against the reference ids: missing, extra, duplicate, non-string."""
    if not isinstance(predictions, Mapping):
        return Verification(not_an_object=True)
    return Verification(
        missing=sorted(set(references) - set(predictions)),
        extra=sorted(str(k) for k in set(predictions) - set(references)),
        duplicates=sorted(set(duplicates)),
        not_strings=sorted(str(k) for k, v in predictions.items() if not isinstance(v, str)),
    )


def read_predictions(path: str | Path) -> tuple[Any, list[str]]:
    """The predictions JSON and the keys it repeats (``json.load`` keeps the last one silently)."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                repeated.append(key)
            seen[key] = value
        return seen

    with open(path, encoding="utf-8") as f:
        data = json.load(f, object_pairs_hook=pairs)
    return data, repeated


class PredictionsError(ValueError):
    """A predictions file failed verification; the message lists every problem."""


def score_predictions(
    task: str, predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """Verify, then score ``{id: prediction}`` against ``{id: [references]}`` for ``task``:
    the metric's values in %, ``scrolls_score``, ``num_predicted`` and the mean length."""
    check = verify(predictions, references)
    if not check.ok:
        raise PredictionsError(f"SCROLLS {task}: " + "; ".join(check.errors()))
    metric = get_task(task).metric
    ids = list(references)
    preds = [predictions[i] for i in ids]
    scores = compute_scores(metric, preds, [references[i] for i in ids])
    return {
        "task": task,
        "metric": metric,
        **scores,
        "scrolls_score": scores[SCORE_KEY[metric]],
        "num_predicted": len(preds),
        "mean_prediction_length_characters": sum(map(len, preds)) / len(preds),
    }


def score_file(
    task: str,
    predictions_path: str | Path,
    references: Mapping[str, Sequence[str]],
    out_path: str | Path,
) -> dict[str, Any]:
    """Score a predictions JSON and write one metrics JSON (values rounded to 4 decimals, as the
    official metric does). On a verification failure write ``{"errors", "details"}`` there
    instead and raise PredictionsError."""
    predictions, repeated = read_predictions(predictions_path)
    check = verify(predictions, references, repeated)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not check.ok:
        details = {k: v for k, v in vars(check).items() if v}
        out_path.write_text(json.dumps({"errors": check.errors(), "details": details}, indent=2))
        raise PredictionsError(
            f"SCROLLS {task}: {predictions_path} failed verification (details in {out_path}): "
            + "; ".join(check.errors())
        )
    metrics = score_predictions(task, predictions, references)
    metrics = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}
    out_path.write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tape.metrics.scrolls --task qasper --predictions p.json --out m.json``."""
    parser = argparse.ArgumentParser(description="Score SCROLLS {id: prediction} JSON.")
    parser.add_argument("--task", required=True)
    parser.add_argument("--predictions", required=True, help="JSON object {id: prediction}")
    parser.add_argument("--out", required=True, help="where the metrics JSON goes")
    parser.add_argument("--data-dir", default=None,
                        help="local <task>/<split>.jsonl folder (task.data_dir); default: the hub")
    parser.add_argument("--split", default="validation")
    args = parser.parse_args(argv)

    from tape.data.scrolls import load_scrolls, references

    refs = references(load_scrolls(args.task, args.data_dir, splits=(args.split,))[args.split])
    print(json.dumps(score_file(args.task, args.predictions, refs, args.out), indent=2))


if __name__ == "__main__":
    main()
