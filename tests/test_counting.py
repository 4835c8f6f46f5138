"""Counting: the generator's properties (hypothesis; each count recomputed from the decoded text),
the task's config checks and evaluation, and smoke runs end to end through pipelines.train and
its command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import tasks
from pipelines.tasks import counting
import task_checks
from project_copy import REPO, run_python
from tape.data.counting import (
    BOS, FIRST_VARIABLE, INCREMENT, PAD, PASS, QUERY, decode, eval_set, first_count, generate, sequence_length,
    training_batch, training_set, vocab_size,
)
from tape.data.labels import IGNORE_INDEX
from tape.data.synthetic import ANSWER, PADDING

task = tasks.get("counting")

VARIABLES, MAX_INCREMENTS = 4, 8


def parse(seq: np.ndarray, variables: int = VARIABLES) -> tuple[list[str], str, str]:
    """An example read back as text: its operations ('x3 ++' or 'pass'), the queried variable and
    the answer word."""
    words = decode(seq, variables).split()
    assert words[0] == "<bos>" and words[-3] == "?" and words.count("?") == 1
    ops, i = [], 1
    while i < len(words) - 3:
        if words[i] == "pass":
            ops.append("pass")
            i += 1
        else:
            assert words[i].startswith("x") and words[i + 1] == "++", words
            ops.append(f"{words[i]} ++")
            i += 2
    return ops, words[-2], words[-1]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ops=st.integers(1, 60), pass_prob=st.floats(0.0, 1.0),
       cap=st.integers(1, 10), batch=st.integers(1, 5))
def test_every_answer_counts_the_increments_of_the_query(seed: int, ops: int, pass_prob: float, cap: int,
                                                         batch: int) -> None:
    tokens, roles = generate(np.random.default_rng(seed), batch, ops, VARIABLES, cap, pass_prob)
    assert tokens.shape == roles.shape == (batch, sequence_length(ops, cap)) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < vocab_size(VARIABLES, cap)
    for seq, role in zip(tokens, roles):
        operations, query, answer = parse(seq)
        increments = [op for op in operations if op != "pass"]
        assert len(operations) == ops and len(increments) <= cap
        assert answer == f"c{increments.count(f'{query} ++')}"
        length = int((role != PADDING).sum())
        assert length == 1 + ops + len(increments) + 3
        assert (role[length:] == PADDING).all() and (seq[length:] == PAD).all() and (seq[:length] != PAD).all()
        assert np.flatnonzero(role == ANSWER).tolist() == [length - 1]  # roles mark exactly the count


def test_pass_prob_zero_keeps_exactly_max_increments() -> None:
    tokens, _ = generate(np.random.default_rng(0), 50, 20, VARIABLES, MAX_INCREMENTS, 0.0)
    assert ((tokens == INCREMENT).sum(axis=1) == MAX_INCREMENTS).all()
    tokens, _ = generate(np.random.default_rng(0), 50, 20, VARIABLES, MAX_INCREMENTS, 1.0)
    assert not (tokens == INCREMENT).any() and (tokens[:, -1 - MAX_INCREMENTS] == first_count(VARIABLES)).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lo=st.integers(1, 6), span=st.integers(0, 10))
def test_mixed_sizes_pad_right_and_score_only_answers(seed: int, lo: int, span: int) -> None:
    args = (VARIABLES, MAX_INCREMENTS, 0.5)
    tokens, roles = training_set(np.random.default_rng(seed), 12, lo, lo + span, *args)
    batch = training_batch(np.random.default_rng(seed), 12, lo, lo + span, *args)
    assert torch.equal(batch["input_ids"], torch.from_numpy(tokens))
    assert tokens.shape[1] <= sequence_length(lo + span, MAX_INCREMENTS)
    for seq, role, lab in zip(tokens, roles, batch["labels"].numpy()):
        operations, _, _ = parse(seq)
        assert lo <= len(operations) <= lo + span
        scored = role == ANSWER
        assert scored.sum() == 1 and (lab[scored] == seq[scored]).all() and (lab[~scored] == IGNORE_INDEX).all()


def test_eval_sets_are_seeded_and_differ_by_size() -> None:
    args = (VARIABLES, MAX_INCREMENTS, 0.5)
    a, roles = eval_set(42, 10, 20, *args)
    b, again = eval_set(42, 10, 20, *args)
    assert np.array_equal(a, b) and np.array_equal(roles, again)
    assert not np.array_equal(a, eval_set(43, 10, 20, *args)[0])
    longer = eval_set(42, 11, 20, *args)[0]
    assert longer.shape == (20, sequence_length(11, MAX_INCREMENTS))
    assert not np.array_equal(a, longer[:, :a.shape[1]])


def test_decode_reads_operations_query_and_count() -> None:
    ids = [BOS, FIRST_VARIABLE + 1, INCREMENT, PASS, QUERY, FIRST_VARIABLE + 1, first_count(VARIABLES) + 1, PAD]
    assert decode(ids, VARIABLES) == "<bos> x1 ++ pass ? x1 c1"


@pytest.mark.parametrize("ops, variables, cap, pass_prob, name", [
    (0, 4, 8, 0.5, "ops=0"), (5, 0, 8, 0.5, "variables=0"), (5, 4, 0, 0.5, "max_increments=0"),
    (5, 4, 8, 1.5, "pass_prob=1.5"), (5, 4, 8, -0.1, "pass_prob=-0.1")])
def test_impossible_arguments_name_the_argument(ops: int, variables: int, cap: int, pass_prob: float,
                                                name: str) -> None:
    with pytest.raises(ValueError, match=name):
        generate(np.random.default_rng(0), 1, ops, variables, cap, pass_prob)


# ---------------------------------------------------------------------------- evaluation
class Oracle(torch.nn.Module):
    """A perfect counter (or one that always answers c0)."""

    def __init__(self, perfect: bool, vocab: int, variables: int) -> None:
        super().__init__()
        self.perfect, self.vocab, self.c0 = perfect, vocab, first_count(variables)
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor):
        logits = torch.zeros(*ids.shape, self.vocab)
        for b, seq in enumerate(ids.tolist()):
            q = seq.index(QUERY) + 1  # the queried variable: it predicts the count
            count = sum(1 for x, y in zip(seq[:q - 1], seq[1:q]) if x == seq[q] and y == INCREMENT)
            logits[b, q, self.c0 + count if self.perfect else self.c0] = 1.0
        return type("Out", (), {"logits": logits})()


def test_evaluate_counts_right_answers(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("experiment=counting/smoke")
    task.prepare(cfg)
    t, vocab, variables = cfg.task, int(cfg.task.vocab_size), int(cfg.task.variables)
    perfect = task.evaluate(Oracle(True, vocab, variables), t, tmp_path, "oracle")
    assert {k: v for k, v in perfect.items() if k != "eval_time_s"} == {
        f"answer_accuracy_{s}": 100.0 for s in ("id", "ood", "1x", "2x", "3x")}
    (tmp_path / "b").mkdir()
    zero = task.evaluate(Oracle(False, vocab, variables), t, tmp_path / "b", "always zero")
    with open(tmp_path / "b" / "counting.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["ops", "tokens", "sequences", "answer_accuracy"]
    assert [int(r["ops"]) for r in rows] == list(range(1, 13))
    for r in rows:  # "always c0" is right exactly on the answers that are c0
        tokens, roles = eval_set(int(t.eval_seed), int(r["ops"]), int(t.eval_sequences), *counting.generator_args(t))
        answers = tokens[roles == ANSWER]
        assert float(r["answer_accuracy"]) == pytest.approx(100.0 * (answers == first_count(variables)).mean())
    assert zero["answer_accuracy_ood"] == pytest.approx(np.mean([float(r["answer_accuracy"]) for r in rows[4:]]))


# ---------------------------------------------------------------------------- config
def checked(make_cfg, *overrides: str):
    return task_checks.checked(make_cfg, task, "counting/smoke", *overrides)


def test_prepare_sizes_vocabulary_and_length(make_cfg) -> None:
    cfg = checked(make_cfg)
    assert (cfg.task.vocab_size, cfg.task.seq_len) == (6 + 2 + 3, 4 + 3 + 4)
    assert (cfg.model.vocab_size, cfg.model.max_seq_len) == (11, 11)
    assert task.positions_needed(cfg.task) == (12 + 3 + 4, "task.eval_multiplier")
    assert task.sizes(checked(make_cfg, "task.eval_every=3").task) == [3, 4, 6, 8, 9, 12]


@pytest.mark.parametrize("override, message", [
    ("task.max_ops=0", r"task\.max_ops=0 must be >= 1"),
    ("task.min_ops=5", r"task\.min_ops=5 must be <= task\.max_ops=4"),
    ("task.variables=0", r"task\.variables=0 must be >= 1"),
    ("task.max_increments=0", r"task\.max_increments=0 must be >= 1"),
    ("task.pass_prob=1.0", r"task\.pass_prob=1\.0 must be in \[0, 1\)"),
    ("task.pass_prob=-0.5", r"task\.pass_prob=-0\.5 must be in \[0, 1\)"),
    ("task.vocab_size=5", r"task\.vocab_size=5 is smaller than the counting vocabulary \(6 \+ task\.variables"),
    ("task.seq_len=10", r"task\.seq_len=10 is shorter than a 4-operation training example \(11 tokens\)"),
    ("model.vocab_size=4", r"model\.vocab_size=4 is smaller"),
    ("pe=randpe model.randpe_max_position=16", r"pe\.randpe_max_position"),
])
def test_bad_config_is_one_clear_line(make_cfg, override: str, message: str) -> None:
    task_checks.assert_refused_in_one_line(make_cfg, task, "counting/smoke", override, message)


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
def test_presets_are_valid(preset: str) -> None:
    task_checks.assert_preset_valid(task, "counting", preset, "pe=randpe")


# ---------------------------------------------------------------------------- end to end
def test_smoke_run_end_to_end(make_cfg) -> None:
    run, saved = task_checks.smoke_run(make_cfg, "counting", "tape")
    for s in ("id", "ood", "1x", "2x", "3x"):
        assert 0.0 <= saved[f"answer_accuracy_{s}"] <= 100.0
    with open(run / "counting.csv") as f:
        assert [int(r["ops"]) for r in csv.DictReader(f)] == list(range(1, 13))
    task_checks.assert_reevaluation_repeats(run, saved, ("answer_",))


@pytest.mark.slow
def test_smoke_trains_from_the_command_line(tmp_path: Path) -> None:
    proc = run_python(REPO, "-m", "pipelines.train", "experiment=counting/smoke", "pe=rope", "logger=none",
                      f"paths.runs_dir={tmp_path}/runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics_path,) = (tmp_path / "runs").rglob("metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["task"] == "counting" and metrics["pe"] == "rope" and metrics["steps"] == 6
    assert (metrics_path.parent / "counting.csv").is_file()
