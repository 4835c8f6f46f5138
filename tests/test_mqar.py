"""Multi-query associative recall: the generator's properties (hypothesis; each answer looked up
again in the pairs parsed back out of the tokens), the task's config checks and evaluation, and
smoke runs end to end through pipelines.train and its command line."""

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
from tape.data.mqar import (
    BOS, FIRST_KEY, PAD, SEP, decode, eval_set, first_value, generate, sequence_length, training_batch,
    training_set, vocab_size,
)
from tape.data.synthetic import ANSWER, GIVEN, PADDING

task = tasks.get("mqar")

KEYS, VALUES = 64, 64


def parse(seq: np.ndarray) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """An example read back as text: {key: value} before '>', (query, answer) pairs after it."""
    seq = [int(x) for x in seq if x != PAD]
    assert seq[0] == BOS and seq.count(SEP) == 1
    sep = seq.index(SEP)
    pairs, queries = seq[1:sep], seq[sep + 1:]
    assert len(pairs) % 2 == 0 and len(queries) % 2 == 0
    table = dict(zip(pairs[0::2], pairs[1::2]))
    assert len(table) == len(pairs) // 2  # distinct keys
    return table, list(zip(queries[0::2], queries[1::2]))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pairs=st.integers(1, 40), batch=st.integers(1, 5))
def test_every_answer_is_the_value_of_its_key(seed: int, pairs: int, batch: int) -> None:
    tokens, roles = generate(np.random.default_rng(seed), batch, pairs, KEYS, VALUES)
    assert tokens.shape == roles.shape == (batch, sequence_length(pairs)) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < vocab_size(KEYS, VALUES)
    fv = first_value(KEYS)
    for seq, role in zip(tokens, roles):
        table, queries = parse(seq)
        assert len(table) == pairs and all(FIRST_KEY <= k < fv <= v for k, v in table.items())
        assert sorted(q for q, _ in queries) == sorted(table)  # every key queried once
        assert all(table[q] == a for q, a in queries)
        answers = [int(t) for t, r in zip(seq, role) if r == ANSWER]
        assert answers == [a for _, a in queries] and (role[:2 * pairs + 2] == GIVEN).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lo=st.integers(1, 6), span=st.integers(0, 8))
def test_mixed_sizes_pad_right_and_score_only_answers(seed: int, lo: int, span: int) -> None:
    tokens, roles = training_set(np.random.default_rng(seed), 12, lo, lo + span, KEYS, VALUES)
    batch = training_batch(np.random.default_rng(seed), 12, lo, lo + span, KEYS, VALUES)
    assert torch.equal(batch["input_ids"], torch.from_numpy(tokens))
    for seq, role, lab in zip(tokens, roles, batch["labels"].numpy()):
        length = int((role != PADDING).sum())
        assert (role[length:] == PADDING).all() and (seq[length:] == PAD).all()
        table, _ = parse(seq)
        assert lo <= len(table) <= lo + span and length == sequence_length(len(table))
        scored = role == ANSWER
        assert (lab[scored] == seq[scored]).all() and (lab[~scored] == IGNORE_INDEX).all()


def test_seeded_distinct_text_and_bad_arguments() -> None:
    a, _ = eval_set(42, 5, 4, KEYS, VALUES)
    assert np.array_equal(a, eval_set(42, 5, 4, KEYS, VALUES)[0])
    assert not np.array_equal(a, eval_set(43, 5, 4, KEYS, VALUES)[0])
    assert decode([BOS, FIRST_KEY + 3, first_value(KEYS), SEP, PAD], KEYS) == "<bos> k3 v0 >"
    with pytest.raises(ValueError, match="distinct keys"):
        generate(np.random.default_rng(0), 1, 9, 8, 4)
    with pytest.raises(ValueError, match="pairs >= 1"):
        generate(np.random.default_rng(0), 1, 0, 8, 4)


# ---------------------------------------------------------------------------- evaluation
class Oracle(torch.nn.Module):
    """A perfect MQAR model (or one that always answers the first value)."""

    def __init__(self, perfect: bool, vocab: int, keys: int) -> None:
        super().__init__()
        self.perfect, self.vocab, self.fv = perfect, vocab, first_value(keys)
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor):
        logits = torch.zeros(*ids.shape, self.vocab)
        for b, seq in enumerate(ids.tolist()):
            sep = seq.index(SEP)
            table = dict(zip(seq[1:sep:2], seq[2:sep:2]))
            for pos in range(sep + 1, len(seq), 2):  # a query: predict its value next
                if seq[pos] in table:
                    logits[b, pos, table[seq[pos]] if self.perfect else self.fv] = 1.0
        return type("Out", (), {"logits": logits})()


def test_evaluate_counts_right_answers(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("experiment=mqar/smoke")
    task.prepare(cfg)
    vocab, keys = int(cfg.task.vocab_size), int(cfg.task.num_keys)
    perfect = task.evaluate(Oracle(True, vocab, keys), cfg.task, tmp_path, "oracle")
    assert {k: v for k, v in perfect.items() if k != "eval_time_s"} == {
        f"{m}_{s}": 100.0 for m in ("answer_accuracy", "exact_match") for s in ("id", "ood", "1x", "2x", "3x")}
    (tmp_path / "b").mkdir()
    first = task.evaluate(Oracle(False, vocab, keys), cfg.task, tmp_path / "b", "first value")
    with open(tmp_path / "b" / "mqar.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["pairs", "tokens", "sequences", "answer_accuracy", "exact_match"]
    assert [int(r["pairs"]) for r in rows] == list(range(1, 10))
    for r in rows:  # "always v0" is right exactly on the answers that are v0
        tokens, roles = eval_set(int(cfg.task.eval_seed), int(r["pairs"]), int(cfg.task.eval_sequences), keys,
                                 int(cfg.task.num_values))
        answers = tokens[roles == ANSWER].reshape(len(tokens), -1)
        assert float(r["answer_accuracy"]) == pytest.approx(100.0 * (answers == first_value(keys)).mean())
        assert float(r["exact_match"]) == pytest.approx(100.0 * (answers == first_value(keys)).all(axis=1).mean())
    assert first["answer_accuracy_ood"] == pytest.approx(np.mean([float(r["answer_accuracy"]) for r in rows[3:]]))


# ---------------------------------------------------------------------------- config
def checked(make_cfg, *overrides: str):
    return task_checks.checked(make_cfg, task, "mqar/smoke", *overrides)


def test_prepare_sizes_vocabulary_and_length(make_cfg) -> None:
    cfg = checked(make_cfg)
    assert (cfg.task.vocab_size, cfg.task.seq_len) == (3 + 64 + 64, 14)
    assert (cfg.model.vocab_size, cfg.model.max_seq_len) == (131, 14)
    assert task.positions_needed(cfg.task) == (38, "task.eval_multiplier")
    assert task.sizes(checked(make_cfg, "task.eval_every=2").task) == [2, 3, 4, 6, 8, 9]


@pytest.mark.parametrize("override, message", [
    ("task.max_pairs=0", r"task\.max_pairs=0 must be >= 1"),
    ("task.min_pairs=4", r"task\.min_pairs=4 must be <= task\.max_pairs=3"),
    ("task.num_values=0", r"task\.num_values=0 must be >= 1"),
    ("task.num_keys=8", r"task\.num_keys=8 cannot give the 9 distinct keys"),
    ("task.vocab_size=100", r"task\.vocab_size=100 is smaller than the MQAR vocabulary \(3 \+ task\.num_keys"),
    ("task.seq_len=10", r"task\.seq_len=10 is shorter than a 3-pair training example \(14 tokens\)"),
    ("model.vocab_size=4", r"model\.vocab_size=4 is smaller"),
    ("pe=randpe model.randpe_max_position=16", r"pe\.randpe_max_position"),
])
def test_bad_config_is_one_clear_line(make_cfg, override: str, message: str) -> None:
    task_checks.assert_refused_in_one_line(make_cfg, task, "mqar/smoke", override, message)


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
def test_presets_are_valid(preset: str) -> None:
    task_checks.assert_preset_valid(task, "mqar", preset, "pe=randpe")


# ---------------------------------------------------------------------------- end to end
def test_smoke_run_end_to_end(make_cfg) -> None:
    run, saved = task_checks.smoke_run(make_cfg, "mqar", "tape")
    for m in ("answer_accuracy", "exact_match"):
        for s in ("id", "ood", "1x", "2x", "3x"):
            assert 0.0 <= saved[f"{m}_{s}"] <= 100.0
    with open(run / "mqar.csv") as f:
        assert [int(r["pairs"]) for r in csv.DictReader(f)] == list(range(1, 10))
    task_checks.assert_reevaluation_repeats(run, saved, ("answer_", "exact_"))


@pytest.mark.slow
def test_smoke_trains_from_the_command_line(tmp_path: Path) -> None:
    proc = run_python(REPO, "-m", "pipelines.train", "experiment=mqar/smoke", "pe=rope", "logger=none",
                      f"paths.runs_dir={tmp_path}/runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics_path,) = (tmp_path / "runs").rglob("metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["task"] == "mqar" and metrics["pe"] == "rope" and metrics["steps"] == 6
    assert (metrics_path.parent / "mqar.csv").is_file()
