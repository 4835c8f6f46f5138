"""SCROLLS metrics: hand-worked F1/EM/ROUGE cases, the official metric's documented example,
the verify step (missing, extra, duplicate ids) and the metrics JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tape.metrics.scrolls import (
    PredictionsError, best_over_references, compute_scores, exact_match, geometric_mean,
    normalize_answer, read_predictions, rouge, score_file, score_predictions, token_f1, verify,
)


def test_normalisation_lowercases_strips_punctuation_and_articles() -> None:
    assert normalize_answer("  The Cat's hat,\n  an APPLE!  ") == "cats hat apple"
    # punctuation is deleted, not turned into a space; "a" inside a word stays
    assert normalize_answer("e-mail a banana") == "email banana"
    assert normalize_answer("the a an") == ""


def test_token_f1_by_hand() -> None:
    # "the big red ball" -> [big, red, ball]; "a red ball" -> [red, ball]; 2 shared tokens
    # precision 2/3, recall 2/2, F1 = 2 * (2/3) * 1 / (2/3 + 1) = 0.8
    assert token_f1("the big red ball", "a red ball") == pytest.approx(0.8)
    # a bag of tokens: "red" twice in the prediction matches the reference's one "red" once
    # precision 2/3, recall 2/2 -> 0.8 again
    assert token_f1("red red ball", "red ball") == pytest.approx(0.8)
    # 1 shared of 2 and 4: precision 1/2, recall 1/4, F1 = 2 * (1/8) / (3/4) = 1/3
    assert token_f1("blue whale", "a very blue sky today") == pytest.approx(1 / 3)
    assert token_f1("Paris!", "paris") == 1.0
    assert token_f1("London", "Paris") == 0.0


def test_empty_answers_score_zero_as_in_the_official_metric() -> None:
    # the hub f1.py returns 0 when nothing is shared, even when both sides are empty
    assert token_f1("", "an answer") == 0.0
    assert token_f1("the", "a") == 0.0  # both normalise to nothing


def test_exact_match_uses_the_normalisation() -> None:
    assert exact_match("The Eiffel Tower.", "eiffel   tower") == 1.0
    assert exact_match("Entailment", "entailment") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("Not mentioned", "Contradiction") == 0.0


def test_maximum_over_references() -> None:
    refs = ["a red ball", "blue ball", "ball"]
    # "red ball today" -> [red, ball, today]. vs [red, ball]: P 2/3, R 1 -> 0.8;
    # vs [blue, ball]: P 1/3, R 1/2 -> 0.4; vs [ball]: P 1/3, R 1 -> 0.5. Best: 0.8
    assert [token_f1("red ball today", r) for r in refs] == pytest.approx([0.8, 0.4, 0.5])
    assert best_over_references(token_f1, "red ball today", refs) == pytest.approx(0.8)
    assert best_over_references(token_f1, "red ball today", refs[1:]) == pytest.approx(0.5)
    assert best_over_references(exact_match, "Blue ball!", refs) == 1.0
    with pytest.raises(ValueError, match="at least one reference"):
        best_over_references(token_f1, "x", [])


def test_task_f1_is_the_mean_of_the_per_example_best() -> None:
    preds = ["the big red ball", "London"]
    refs = [["blue ball", "a red ball"], ["Paris", "london"]]
    # example 1: [big, red, ball] vs [blue, ball]: 1 shared, precision 1/3, recall 1/2 -> 0.4;
    # vs [red, ball]: 0.8 -> best 0.8. Example 2: "London" equals "london" -> 1.
    assert compute_scores("f1", preds, refs) == {"f1": pytest.approx(100 * (0.8 + 1.0) / 2)}
    assert compute_scores("exact_match", preds, refs) == {"exact_match": pytest.approx(50.0)}


@pytest.mark.rouge_score
def test_rouge_on_a_tiny_pair_by_hand() -> None:
    # prediction [a, cat, sat], reference [the, cat, sat, down] (rouge-score keeps articles)
    # R1: 2 shared unigrams, P = 2/3, R = 2/4 -> F = 4/7
    # R2: bigrams {a cat, cat sat} vs {the cat, cat sat, sat down}: 1 shared,
    #     P = 1/2, R = 1/3 -> 2/5
    # RL: LCS [cat, sat] = 2, P = 2/3, R = 2/4 -> 4/7
    r = rouge("a cat sat", "the cat sat down")
    assert r == pytest.approx({"rouge1": 4 / 7, "rouge2": 2 / 5, "rougeL": 4 / 7})
    scores = compute_scores("rouge", ["a cat sat"], [["the cat sat down"]])
    r1, r2, rl = 100 * 4 / 7, 100 * 2 / 5, 100 * 4 / 7
    assert scores == pytest.approx({
        "rouge/rouge1": r1, "rouge/rouge2": r2, "rouge/rougeL": rl,
        "rouge/geometric_mean": (r1 * r2 * rl) ** (1 / 3),  # = 100 * (32/245)^(1/3) = 50.737...
    })
    assert scores["rouge/geometric_mean"] == pytest.approx(50.7374, abs=1e-4)


@pytest.mark.rouge_score
def test_rouge_does_not_stem_and_ignores_newlines() -> None:
    # the official metric passes use_stemmer=False: "cats"/"cat" and "running"/"run" differ
    assert rouge("cats running", "cat run") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    # the hub's sentence-per-line post-processing cannot change R1/R2/RL: newlines are spaces
    assert rouge("the cat\nsat down", "the cat sat down")["rouge2"] == 1.0


@pytest.mark.rouge_score
def test_rouge_takes_the_maximum_over_references_for_each_key_separately() -> None:
    # vs "d c b a": R1 = 1, R2 = 0, RL = LCS 1 of 4 = 1/4
    # vs "a b x y": R1 = 1/2, R2 = 1 of 3 bigrams each side = 1/3, RL = LCS [a, b] = 1/2
    scores = compute_scores("rouge", ["a b c d"], [["d c b a", "a b x y"]])
    assert scores["rouge/rouge1"] == pytest.approx(100.0)  # from the first reference
    assert scores["rouge/rouge2"] == pytest.approx(100 / 3)  # from the second
    assert scores["rouge/rougeL"] == pytest.approx(50.0)  # from the second


@pytest.mark.rouge_score
def test_geometric_mean_is_taken_after_averaging_over_examples() -> None:
    preds, refs = ["a cat sat", "a b c d"], [["the cat sat down"], ["a b x y"]]
    scores = compute_scores("rouge", preds, refs)
    means = [100 * (4 / 7 + 1 / 2) / 2, 100 * (2 / 5 + 1 / 3) / 2, 100 * (4 / 7 + 1 / 2) / 2]
    assert scores["rouge/geometric_mean"] == pytest.approx(geometric_mean(means))
    per_example = [geometric_mean([400 / 7, 40, 400 / 7]), geometric_mean([50, 100 / 3, 50])]
    assert scores["rouge/geometric_mean"] != pytest.approx(sum(per_example) / 2, rel=1e-6)


@pytest.mark.rouge_score
def test_the_official_metric_documented_example() -> None:
    # tau/scrolls metrics/scrolls.py documents these inputs and outputs (rounded to 4 decimals)
    preds = ["exact match example", "hello there", "general kenobi"]
    refs = [["exact match example"], ["hello", "hi there"], ["commander kenobi"]]
    rounded = lambda d: {k: round(v, 4) for k, v in d.items()}  # noqa: E731
    assert rounded(compute_scores("rouge", preds, refs)) == {
        "rouge/rouge1": 72.2222, "rouge/rouge2": 33.3333, "rouge/rougeL": 72.2222,
        "rouge/geometric_mean": 55.8136,
    }
    assert rounded(compute_scores("exact_match", preds, refs)) == {"exact_match": 33.3333}
    assert rounded(compute_scores("f1", preds, refs)) == {"f1": 72.2222}


def test_geometric_mean_and_bad_input() -> None:
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([0.0, 50.0, 50.0]) == 0.0
    with pytest.raises(ValueError, match="negative"):
        geometric_mean([-1.0, 1.0])
    with pytest.raises(ValueError, match="unknown SCROLLS metric"):
        compute_scores("bleu", ["x"], [["x"]])
    with pytest.raises(ValueError, match="2 predictions but 1"):
        compute_scores("f1", ["x", "y"], [["x"]])


REFS = {"q1": ["Paris"], "q2": ["eleven", "11"], "q3": ["No"]}


def test_verify_reports_missing_extra_and_non_string_ids() -> None:
    check = verify({"q1": "Paris", "q3": 3, "zz": "?"}, REFS)
    assert not check.ok
    assert (check.missing, check.extra, check.not_strings) == (["q2"], ["zz"], ["q3"])
    text = "\n".join(check.errors())
    assert "1 reference id(s) have no prediction: q2" in text
    assert "not in the references: zz" in text
    assert verify({"q1": "a", "q2": "b", "q3": "c"}, REFS).ok
    assert verify(["Paris"], REFS).errors() == [
        'predictions must be one JSON object {"id": "prediction", ...}']


def test_duplicate_ids_in_the_file_are_found(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"q1": "Paris", "q2": "eleven", "q1": "Lyon", "q3": "No"}')
    data, repeated = read_predictions(path)
    assert data["q1"] == "Lyon" and repeated == ["q1"]  # json.load alone would hide this
    check = verify(data, REFS, repeated)
    assert check.duplicates == ["q1"] and not check.ok


def test_score_file_writes_one_metrics_json(tmp_path: Path) -> None:
    preds = tmp_path / "qasper.json"
    preds.write_text(json.dumps({"q1": "paris.", "q2": "11 birds", "q3": "yes"}))
    out = tmp_path / "metrics" / "qasper_metrics.json"
    metrics = score_file("qasper", preds, REFS, out)
    # F1: q1 -> 1; q2 -> [11, birds] vs [11]: precision 1/2, recall 1 -> 2/3; q3 -> 0
    expected = round(100 * (1 + 2 / 3 + 0) / 3, 4)
    assert json.loads(out.read_text()) == metrics
    assert metrics["f1"] == metrics["scrolls_score"] == expected == 55.5556
    assert metrics["num_predicted"] == 3 and metrics["metric"] == "f1"
    assert metrics["mean_prediction_length_characters"] == round((6 + 8 + 3) / 3, 4)


def test_score_file_refuses_bad_predictions_and_writes_the_errors(tmp_path: Path) -> None:
    preds = tmp_path / "p.json"
    preds.write_text('{"q1": "Paris", "q1": "Paris", "extra": "x"}')
    out = tmp_path / "m.json"
    with pytest.raises(PredictionsError, match="no prediction: q2, q3") as err:
        score_file("qasper", preds, REFS, out)
    assert "predicted more than once: q1" in str(err.value)
    written = json.loads(out.read_text())
    assert written["details"] == {"missing": ["q2", "q3"], "extra": ["extra"], "duplicates": ["q1"]}
    assert "f1" not in written


@pytest.mark.rouge_score
def test_summary_tasks_score_the_rouge_geometric_mean() -> None:
    metrics = score_predictions("gov_report", {"g": "a cat sat"}, {"g": ["the cat sat down"]})
    assert metrics["scrolls_score"] == metrics["rouge/geometric_mean"]
    assert metrics["scrolls_score"] == pytest.approx(50.7374, abs=1e-4)
    em = score_predictions("contract_nli", {"c": "Entailment."}, {"c": ["Entailment"]})
    assert em["exact_match"] == em["scrolls_score"] == 100.0
    assert all(0.0 <= metrics[k] <= 100.0 for k in metrics if k.startswith("rouge/"))
    assert math.isfinite(metrics["scrolls_score"])
