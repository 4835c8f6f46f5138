"""Parity with a scratchpad: the generator's properties (hypothesis; the parity is recomputed from
the bits parsed back out of the tokens), the task's config checks and evaluation, and smoke runs
end to end through pipelines.train and its command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.errors import PipelineConfigError
from pipelines import tasks
import task_checks
from project_copy import REPO, run_python
from tape.data.labels import IGNORE_INDEX
from tape.data.parity import (
    BOS, EQUALS, FIRST_MNEMONIC, FORMATS, ONE, PAD, SEP, ZERO, decode, eval_set, generate, sequence_length,
    training_batch, training_set, vocab_size,
)
from tape.data.synthetic import ANSWER, COPY, GIVEN, PADDING, STEP, SeededBatches

task = tasks.get("parity")

MNEMONICS = 64


def parse(seq: np.ndarray, fmt: str) -> dict:
    """Read an example back as text would be read: the input bits (and anchors) before '>', the
    scratchpad between '>' and '=', the answer after '='."""
    seq = [int(x) for x in seq if x != PAD]
    assert seq[0] == BOS and seq.count(SEP) == 1 and seq.count(EQUALS) == 1
    sep, eq = seq.index(SEP), seq.index(EQUALS)
    given, scratch, answer = seq[1:sep], seq[sep + 1:eq], seq[eq + 1:]
    if fmt == "mnemonics":
        anchors, bits = given[0::2], [t - ZERO for t in given[1::2]]
    else:
        anchors, bits = None, [t - ZERO for t in given]
    return {"bits": bits, "anchors": anchors, "scratch": scratch, "answer": answer}


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), batch=st.integers(1, 5),
       fmt=st.sampled_from(FORMATS))
def test_scratchpad_is_the_running_parity_of_the_parsed_bits(seed: int, n: int, batch: int, fmt: str) -> None:
    tokens, roles = generate(np.random.default_rng(seed), batch, n, fmt, MNEMONICS)
    assert tokens.shape == roles.shape == (batch, sequence_length(fmt, n)) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < vocab_size(fmt, MNEMONICS)
    for seq, role in zip(tokens, roles):
        ex = parse(seq, fmt)
        bits = ex["bits"]
        assert len(bits) == n and set(bits) <= {0, 1}
        running = [sum(bits[:i + 1]) % 2 for i in range(n)]  # the parity, from the bits alone
        assert ex["answer"] == [ZERO + sum(bits) % 2]
        scratch = ex["scratch"]
        if fmt == "standard":
            assert scratch == [ZERO + p for p in running]
        else:
            copies, steps = scratch[0::2], scratch[1::2]
            assert steps == [ZERO + p for p in running]
            if fmt == "interleaved":
                assert copies == [ZERO + b for b in bits]
            else:  # distinct anchors, repeated in order
                assert copies == ex["anchors"] and len(set(copies)) == n
                assert min(copies) >= FIRST_MNEMONIC
        # roles: STEP on the running parities, ANSWER on the last token, COPY on the repeats
        sep = list(seq).index(SEP)
        assert (role[:sep + 1] == GIVEN).all() and role[-1] == ANSWER and role[-2] == GIVEN
        assert [int(t) for t, r in zip(seq, role) if r == STEP] == [ZERO + p for p in running]
        assert (role == COPY).sum() == (0 if fmt == "standard" else n)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lo=st.integers(1, 6), span=st.integers(0, 8), fmt=st.sampled_from(FORMATS),
       copies=st.booleans())
def test_mixed_lengths_pad_right_and_score_only_steps_and_answers(seed: int, lo: int, span: int, fmt: str,
                                                                 copies: bool) -> None:
    rng = np.random.default_rng(seed)
    tokens, roles = training_set(rng, 12, lo, lo + span, fmt, MNEMONICS)
    batch = training_batch(np.random.default_rng(seed), 12, lo, lo + span, fmt, MNEMONICS, copies)
    assert torch.equal(batch["input_ids"], torch.from_numpy(tokens))
    labels = batch["labels"].numpy()
    for seq, role, lab in zip(tokens, roles, labels):
        real = role != PADDING
        length = int(real.sum())
        assert real[:length].all() and not real[length:].any()  # padding only on the right
        assert (seq[length:] == PAD).all()
        n = len(parse(seq, fmt)["bits"])
        assert lo <= n <= lo + span and length == sequence_length(fmt, n)
        scored = np.isin(role, [STEP, ANSWER] + ([COPY] if copies else []))
        assert (lab[scored] == seq[scored]).all() and (lab[~scored] == IGNORE_INDEX).all()


def test_seeded_distinct_and_the_same_bits_in_every_format() -> None:
    a, _ = eval_set(42, 10, "standard", 5)
    assert np.array_equal(a, eval_set(42, 10, "standard", 5)[0])
    assert not np.array_equal(a, eval_set(43, 10, "standard", 5)[0])
    bits = [parse(s, "standard")["bits"] for s in a]
    for fmt in ("interleaved", "mnemonics"):
        other, _ = eval_set(42, 10, fmt, 5, MNEMONICS)
        assert [parse(s, fmt)["bits"] for s in other] == bits  # paired across formats
    make = lambda rng: training_batch(rng, 4, 1, 8, "standard")  # noqa: E731
    s = SeededBatches(make, seed=0)
    assert torch.equal(s.batch(5)["input_ids"], SeededBatches(make, 0, start=5).batch(5)["input_ids"])
    assert not torch.equal(s.batch(5)["input_ids"], s.batch(6)["input_ids"])


def test_text_and_bad_arguments() -> None:
    tokens, _ = generate(np.random.default_rng(0), 1, 3, "standard")
    text = decode(tokens[0])
    bits = text.removeprefix("<bos>")[:3]
    running = "".join(str(bits[:i + 1].count("1") % 2) for i in range(3))
    assert text == f"<bos>{bits}>{running}={running[-1]}"
    assert decode([BOS, FIRST_MNEMONIC + 2, ONE, SEP]) == "<bos>[2]1>"
    with pytest.raises(ValueError, match="scratchpad format 'other'"):
        generate(np.random.default_rng(0), 1, 3, "other")
    with pytest.raises(ValueError, match="distinct anchors"):
        generate(np.random.default_rng(0), 1, 9, "mnemonics", 8)
    with pytest.raises(ValueError, match="n >= 1"):
        generate(np.random.default_rng(0), 1, 0, "standard")


# ---------------------------------------------------------------------------- evaluation
class Oracle(torch.nn.Module):
    """A perfect parity model (or one that always says 0), reading the text as it goes."""

    def __init__(self, perfect: bool, vocab: int) -> None:
        super().__init__()
        self.perfect, self.vocab = perfect, vocab
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor):
        logits = torch.zeros(*ids.shape, self.vocab)
        for b, seq in enumerate(ids.tolist()):
            for pos, tok in self.answers(seq).items():  # the logits before a token predict it
                logits[b, pos - 1, tok if self.perfect else ZERO] = 1.0
        return type("Out", (), {"logits": logits})()

    @staticmethod
    def answers(seq: list[int]) -> dict[int, int]:
        """Position -> the token a perfect model predicts there (every step and the answer)."""
        sep, eq = seq.index(SEP), seq.index(EQUALS)
        given = seq[1:sep]
        bits = [t - ZERO for t in given if t in (ZERO, ONE)]
        paired = len(seq[sep + 1:eq]) == 2 * len(bits)  # interleaved / mnemonics: copy, step
        out, acc = {}, 0
        for i, b in enumerate(bits):
            acc ^= b
            out[sep + 1 + (2 * i + 1 if paired else i)] = ZERO + acc
        out[eq + 1] = ZERO + acc
        return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_evaluate_counts_steps_and_exact_matches(make_cfg, tmp_path: Path, fmt: str) -> None:
    cfg = make_cfg("experiment=parity/smoke", f"task.scratchpad={fmt}")
    task.prepare(cfg)
    vocab = int(cfg.task.vocab_size)
    perfect = task.evaluate(Oracle(True, vocab), cfg.task, tmp_path, "oracle")
    assert {k: v for k, v in perfect.items() if k != "eval_time_s"} == {
        f"{m}_{s}": 100.0 for m in ("step_accuracy", "exact_match") for s in ("id", "ood", "1x", "2x", "3x")}
    (tmp_path / "b").mkdir()
    zeros = task.evaluate(Oracle(False, vocab), cfg.task, tmp_path / "b", "zeros")
    with open(tmp_path / "b" / "parity.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["bits"]) for r in rows] == list(range(1, 13)) and {r["scratchpad"] for r in rows} == {fmt}
    for r in rows:  # "always 0" is right exactly on the even running parities
        n = int(r["bits"])
        tokens, _ = eval_set(int(cfg.task.eval_seed), n, fmt, int(cfg.task.eval_sequences), MNEMONICS)
        running = np.array([[sum(parse(s, fmt)["bits"][:i + 1]) % 2 for i in range(n)] for s in tokens])
        assert int(r["tokens"]) == sequence_length(fmt, n)
        assert float(r["step_accuracy"]) == pytest.approx(100.0 * (running == 0).mean())
        assert float(r["exact_match"]) == pytest.approx(100.0 * (running == 0).all(axis=1).mean())
    ood = [float(r["exact_match"]) for r in rows if int(r["bits"]) > 4]
    assert zeros["exact_match_ood"] == pytest.approx(np.mean(ood))
    assert zeros["step_accuracy_3x"] == pytest.approx(float(rows[11]["step_accuracy"]))


# ---------------------------------------------------------------------------- config
def checked(make_cfg, *overrides: str):
    return task_checks.checked(make_cfg, task, "parity/smoke", *overrides)


@pytest.mark.parametrize("fmt, vocab, seq_len", [("standard", 6, 12), ("interleaved", 6, 16), ("mnemonics", 70, 20)])
def test_prepare_sizes_vocabulary_and_length(make_cfg, fmt: str, vocab: int, seq_len: int) -> None:
    cfg = checked(make_cfg, f"task.scratchpad={fmt}")
    assert (cfg.task.vocab_size, cfg.task.seq_len) == (vocab, seq_len)
    assert (cfg.model.vocab_size, cfg.model.max_seq_len) == (vocab, seq_len)
    assert task.positions_needed(cfg.task) == (sequence_length(fmt, 12), "task.eval_multiplier")
    assert task.sizes(cfg.task) == list(range(1, 13))
    assert checked(make_cfg, "task.eval_every=5").task.eval_multiplier == 3
    assert task.sizes(checked(make_cfg, "task.eval_every=5").task) == [4, 5, 8, 10, 12]


@pytest.mark.parametrize("override, message", [
    ("task.scratchpad=other", r"task\.scratchpad='other'; choose one of \['standard', 'interleaved', 'mnemonics'\]"),
    ("task.max_bits=0", r"task\.max_bits=0 must be >= 1"),
    ("task.min_bits=5", r"task\.min_bits=5 must be <= task\.max_bits=4"),
    ("task.eval_sequences=0", r"task\.eval_sequences=0 must be >= 1"),
    ("task.score_copies=maybe", r"task\.score_copies='maybe' must be true or false"),
    ("task.scratchpad=mnemonics task.mnemonics=8", r"task\.mnemonics=8 anchors cannot label the 12 bits"),
    ("task.scratchpad=mnemonics task.vocab_size=6", r"task\.vocab_size=6 is smaller than the mnemonics vocabulary"),
    ("task.seq_len=8", r"task\.seq_len=8 is shorter than a 4-bit training example \(12 tokens\)"),
    ("model.vocab_size=4", r"model\.vocab_size=4 is smaller"),
    ("pe=randpe model.randpe_max_position=16", r"pe\.randpe_max_position"),
])
def test_bad_config_is_one_clear_line(make_cfg, override: str, message: str) -> None:
    task_checks.assert_refused_in_one_line(make_cfg, task, "parity/smoke", override, message)


def test_unprepared_sizes_are_reported(make_cfg) -> None:
    with pytest.raises(PipelineConfigError, match=r"task\.vocab_size / task\.seq_len is null"):
        task.validate(make_cfg("experiment=parity/smoke"))


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_presets_are_valid(preset: str, fmt: str) -> None:
    task_checks.assert_preset_valid(task, "parity", preset, "pe=randpe", f"task.scratchpad={fmt}")


# ---------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("fmt", FORMATS)
def test_smoke_run_end_to_end(make_cfg, fmt: str) -> None:
    run, saved = task_checks.smoke_run(make_cfg, "parity", "tape", f"task.scratchpad={fmt}")
    for m in ("step_accuracy", "exact_match"):
        for s in ("id", "ood", "1x", "2x", "3x"):
            assert 0.0 <= saved[f"{m}_{s}"] <= 100.0
    with open(run / "parity.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["scratchpad", "bits", "tokens", "sequences", "step_accuracy", "exact_match"]
    assert [int(r["bits"]) for r in rows] == list(range(1, 13))
    task_checks.assert_reevaluation_repeats(run, saved, ("step_", "exact_"))


@pytest.mark.slow
def test_smoke_trains_from_the_command_line(tmp_path: Path) -> None:
    """One sweep of the claim's three encodings (one process: three would start Lightning three times)."""
    pes = ["rope", "tape", "nope"]
    proc = run_python(REPO, "-m", "pipelines.train", "-m", "experiment=parity/smoke", f"pe={','.join(pes)}",
                      "logger=none", f"paths.runs_dir={tmp_path}/runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sorted((tmp_path / "runs").rglob("metrics.json"))
    metrics = {m["pe"]: m for m in (json.loads(p.read_text()) for p in found)}
    assert sorted(metrics) == sorted(pes) and len(found) == len(pes)
    assert all(m["task"] == "parity" and m["steps"] == 6 for m in metrics.values())
    assert all((p.parent / "parity.csv").is_file() for p in found)
