"""Selective copy: the generator's properties (hypothesis; each answer recomputed from the decoded
text), the task's config checks and evaluation, and smoke runs end to end through pipelines.train
and its command line."""

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
import task_checks
from project_copy import REPO, run_python
from tape.data.labels import IGNORE_INDEX
from tape.data.selective_copy import (
    BLANK, BOS, FIRST_DATA, PAD, SEP, decode, eval_set, generate, sequence_length, training_batch, training_set,
    vocab_size,
)
from tape.data.synthetic import ANSWER, PADDING

task = tasks.get("selective_copy")

TOKENS = 16


def parse(seq: np.ndarray) -> tuple[list[str], list[str]]:
    """An example read back as text: the slots between <bos> and '>', and the words after '>'."""
    words = decode(seq).split()
    assert words[0] == "<bos>" and words.count(">") == 1
    sep = words.index(">")
    return words[1:sep], words[sep + 1:]


def copied(slots: list[str]) -> list[str]:
    """What a correct answer is: the non-blank slots in order."""
    return [w for w in slots if w != "."]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), items=st.integers(1, 8), blanks=st.integers(0, 40), batch=st.integers(1, 5))
def test_every_answer_is_the_data_tokens_in_order(seed: int, items: int, blanks: int, batch: int) -> None:
    length = items + blanks
    tokens, roles = generate(np.random.default_rng(seed), batch, length, items, TOKENS)
    assert tokens.shape == roles.shape == (batch, sequence_length(length, items)) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < vocab_size(TOKENS) and not (tokens == PAD).any()
    for seq, role in zip(tokens, roles):
        slots, answers = parse(seq)
        assert len(slots) == length and slots.count(".") == blanks
        assert answers == copied(slots)
        assert decode(seq[role == ANSWER]).split() == answers  # roles mark exactly the copies
        assert (role[:length + 2] != ANSWER).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), items=st.integers(1, 4), lo=st.integers(0, 6), span=st.integers(0, 8))
def test_mixed_lengths_pad_right_and_score_only_answers(seed: int, items: int, lo: int, span: int) -> None:
    low = items + lo
    tokens, roles = training_set(np.random.default_rng(seed), 12, low, low + span, items, TOKENS)
    batch = training_batch(np.random.default_rng(seed), 12, low, low + span, items, TOKENS)
    assert torch.equal(batch["input_ids"], torch.from_numpy(tokens))
    for seq, role, lab in zip(tokens, roles, batch["labels"].numpy()):
        length = int((role != PADDING).sum())
        assert (role[length:] == PADDING).all() and (seq[length:] == PAD).all()
        slots, answers = parse(seq)
        assert low <= len(slots) <= low + span and length == sequence_length(len(slots), items)
        assert answers == copied(slots) and len(answers) == items
        scored = role == ANSWER
        assert (lab[scored] == seq[scored]).all() and (lab[~scored] == IGNORE_INDEX).all()


def test_eval_sets_are_seeded_and_differ_by_length() -> None:
    a, roles = eval_set(42, 10, 6, 3, TOKENS)
    b, again = eval_set(42, 10, 6, 3, TOKENS)
    assert np.array_equal(a, b) and np.array_equal(roles, again)
    assert not np.array_equal(a, eval_set(43, 10, 6, 3, TOKENS)[0])
    longer = eval_set(42, 11, 6, 3, TOKENS)[0]
    assert longer.shape == (6, sequence_length(11, 3)) and not np.array_equal(a[:, -3:], longer[:, -3:])


def test_decode_reads_slots_and_copies() -> None:
    ids = [BOS, BLANK, FIRST_DATA + 3, BLANK, FIRST_DATA, SEP, FIRST_DATA + 3, FIRST_DATA, PAD]
    assert decode(ids) == "<bos> . d3 . d0 > d3 d0"


@pytest.mark.parametrize("length, items, tokens, name", [
    (3, 4, 8, "length=3"), (4, 0, 8, "items=0"), (4, 2, 0, "tokens=0")])
def test_impossible_arguments_name_the_argument(length: int, items: int, tokens: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        generate(np.random.default_rng(0), 1, length, items, tokens)


# ---------------------------------------------------------------------------- evaluation
class Oracle(torch.nn.Module):
    """A perfect selective copier (or one that always writes the first data token)."""

    def __init__(self, perfect: bool, vocab: int) -> None:
        super().__init__()
        self.perfect, self.vocab = perfect, vocab
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor):
        logits = torch.zeros(*ids.shape, self.vocab)
        for b, seq in enumerate(ids.tolist()):
            sep = seq.index(SEP)
            data = [x for x in seq[1:sep] if x != BLANK]
            for j, x in enumerate(data):  # position sep + j predicts the j-th copy
                logits[b, sep + j, x if self.perfect else FIRST_DATA] = 1.0
        return type("Out", (), {"logits": logits})()


def test_evaluate_counts_right_answers(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("experiment=selective_copy/smoke")
    task.prepare(cfg)
    t, vocab = cfg.task, int(cfg.task.vocab_size)
    perfect = task.evaluate(Oracle(True, vocab), t, tmp_path, "oracle")
    assert {k: v for k, v in perfect.items() if k != "eval_time_s"} == {
        f"{m}_{s}": 100.0 for m in ("answer_accuracy", "exact_match") for s in ("id", "ood", "1x", "2x", "3x")}
    (tmp_path / "b").mkdir()
    first = task.evaluate(Oracle(False, vocab), t, tmp_path / "b", "first token")
    with open(tmp_path / "b" / "selective_copy.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["length", "tokens", "sequences", "answer_accuracy", "exact_match"]
    assert [int(r["length"]) for r in rows] == list(range(2, 13))
    for r in rows:  # "always d0" is right exactly on the copies that are d0
        tokens, roles = eval_set(int(t.eval_seed), int(r["length"]), int(t.eval_sequences), int(t.num_items),
                                 int(t.num_tokens))
        answers = tokens[roles == ANSWER].reshape(len(tokens), -1)
        assert int(r["tokens"]) == sequence_length(int(r["length"]), int(t.num_items))
        assert float(r["answer_accuracy"]) == pytest.approx(100.0 * (answers == FIRST_DATA).mean())
        assert float(r["exact_match"]) == pytest.approx(100.0 * (answers == FIRST_DATA).all(axis=1).mean())
    assert first["answer_accuracy_ood"] == pytest.approx(np.mean([float(r["answer_accuracy"]) for r in rows[3:]]))


# ---------------------------------------------------------------------------- config
def checked(make_cfg, *overrides: str):
    return task_checks.checked(make_cfg, task, "selective_copy/smoke", *overrides)


def test_prepare_sizes_vocabulary_and_length(make_cfg) -> None:
    cfg = checked(make_cfg)
    assert (cfg.task.vocab_size, cfg.task.seq_len) == (4 + 8, 4 + 2 + 2)
    assert (cfg.model.vocab_size, cfg.model.max_seq_len) == (12, 8)
    assert task.positions_needed(cfg.task) == (16, "task.eval_multiplier")
    assert task.sizes(checked(make_cfg, "task.eval_every=3").task) == [3, 4, 6, 8, 9, 12]


@pytest.mark.parametrize("override, message", [
    ("task.max_length=0", r"task\.max_length=0 must be >= 1"),
    ("task.min_length=5", r"task\.min_length=5 must be <= task\.max_length=4"),
    ("task.num_items=3", r"task\.min_length=2 slots cannot hold task\.num_items=3"),
    ("task.num_tokens=0", r"task\.num_tokens=0 must be >= 1"),
    ("task.vocab_size=5", r"task\.vocab_size=5 is smaller than the selective-copy vocabulary \(4 \+ task\.num_tokens"),
    ("task.seq_len=7", r"task\.seq_len=7 is shorter than a 4-slot training example \(8 tokens\)"),
    ("model.vocab_size=4", r"model\.vocab_size=4 is smaller"),
    ("pe=randpe model.randpe_max_position=12", r"pe\.randpe_max_position"),
])
def test_bad_config_is_one_clear_line(make_cfg, override: str, message: str) -> None:
    task_checks.assert_refused_in_one_line(make_cfg, task, "selective_copy/smoke", override, message)


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
def test_presets_are_valid(preset: str) -> None:
    task_checks.assert_preset_valid(task, "selective_copy", preset, "pe=randpe")


# ---------------------------------------------------------------------------- end to end
def test_smoke_run_end_to_end(make_cfg) -> None:
    run, saved = task_checks.smoke_run(make_cfg, "selective_copy", "tape")
    for m in ("answer_accuracy", "exact_match"):
        for s in ("id", "ood", "1x", "2x", "3x"):
            assert 0.0 <= saved[f"{m}_{s}"] <= 100.0
    with open(run / "selective_copy.csv") as f:
        assert [int(r["length"]) for r in csv.DictReader(f)] == list(range(2, 13))
    task_checks.assert_reevaluation_repeats(run, saved, ("answer_", "exact_"))


@pytest.mark.slow
def test_smoke_trains_from_the_command_line(tmp_path: Path) -> None:
    proc = run_python(REPO, "-m", "pipelines.train", "experiment=selective_copy/smoke", "pe=rope", "logger=none",
                      f"paths.runs_dir={tmp_path}/runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics_path,) = (tmp_path / "runs").rglob("metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["task"] == "selective_copy" and metrics["pe"] == "rope" and metrics["steps"] == 6
    assert (metrics_path.parent / "selective_copy.csv").is_file()
