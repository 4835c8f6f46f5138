"""Flip-flop language modelling: the generator's properties (hypothesis), the task's config
checks and evaluation, and a smoke run end to end through pipelines.train."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import open_dict

from conftest import compose_config
from pipelines.errors import PipelineConfigError
from pipelines.evaluate import evaluate
from pipelines.tasks import flipflop as task
from pipelines.train import train
from tape.data.labels import IGNORE_INDEX
from tape.data.flipflop import (
    IGNORE, ONE, READ, WRITE, ZERO, FlipFlopStream, decode, eval_set, generate, labels_for, read_mask,
)


def reference_reads(seq: np.ndarray) -> list[tuple[int, int]]:
    """(position of each read bit, the last written bit), by a plain loop over the text."""
    out, last = [], None
    for pos in range(0, len(seq), 2):
        op, bit = seq[pos], seq[pos + 1]
        if op == WRITE:
            last = bit
        elif op == READ:
            out.append((pos + 1, last))
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pairs=st.integers(2, 80), batch=st.integers(1, 6),
       p_ignore=st.floats(0.0, 0.99))
def test_every_read_returns_the_last_written_bit(seed: int, pairs: int, batch: int, p_ignore: float) -> None:
    x = generate(np.random.default_rng(seed), batch, 2 * pairs, p_ignore)
    assert x.shape == (batch, 2 * pairs) and x.dtype == np.int64
    assert set(np.unique(x[:, 0::2])) <= {WRITE, READ, IGNORE}
    assert set(np.unique(x[:, 1::2])) <= {ZERO, ONE}
    assert (x[:, 0] == WRITE).all() and (x[:, -2] == READ).all()  # a write first, a read last
    for seq in x:
        reads = reference_reads(seq)
        assert reads and all(seq[pos] == bit for pos, bit in reads)
        mask = read_mask(seq)
        assert sorted(np.flatnonzero(mask)) == [pos for pos, _ in reads]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), p_ignore=st.sampled_from([0.1, 0.5, 0.8, 0.98]))
def test_sparsity_matches_p_ignore(seed: int, p_ignore: float) -> None:
    x = generate(np.random.default_rng(seed), 400, 130, p_ignore)
    inner = x[:, 2:-2:2]  # the freely drawn instructions (not the first write / last read)
    share = (inner == IGNORE).mean()
    sd = np.sqrt(p_ignore * (1 - p_ignore) / inner.size)
    assert abs(share - p_ignore) < 6 * sd + 1e-9
    writes, reads = (inner == WRITE).mean(), (inner == READ).mean()
    assert abs(writes - reads) < 6 * np.sqrt((1 - p_ignore) / inner.size) + 1e-9


def test_seeded_and_distinct() -> None:
    a = generate(np.random.default_rng(3), 4, 64, 0.8)
    assert np.array_equal(a, generate(np.random.default_rng(3), 4, 64, 0.8))
    assert not np.array_equal(a, generate(np.random.default_rng(4), 4, 64, 0.8))
    assert np.array_equal(eval_set(42, 128, 0.98, 10), eval_set(42, 128, 0.98, 10))
    assert not np.array_equal(eval_set(42, 128, 0.98, 10)[:, :64], eval_set(42, 128, 0.1, 10)[:, :64])
    s = FlipFlopStream(seed=0, length=32, batch_size=4, p_ignore=0.8)
    assert torch.equal(s.batch(5)["input_ids"], FlipFlopStream(0, 32, 4, 0.8, start=5).batch(5)["input_ids"])
    assert not torch.equal(s.batch(5)["input_ids"], s.batch(6)["input_ids"])


def test_text_and_labels() -> None:
    x = torch.tensor([[WRITE, ONE, IGNORE, ZERO, READ, ONE]])
    assert decode(x[0].tolist()) == "w1i0r1"
    assert labels_for(x, "reads").tolist() == [[IGNORE_INDEX] * 5 + [ONE]]
    assert torch.equal(labels_for(x, "all"), x)
    with pytest.raises(ValueError, match="loss_on"):
        labels_for(x, "some")
    with pytest.raises(ValueError, match="even"):
        generate(np.random.default_rng(0), 1, 7, 0.5)


class Oracle(torch.nn.Module):
    """A perfect flip-flop model (or one that always says 0), to check the read-error count."""

    def __init__(self, perfect: bool) -> None:
        super().__init__()
        self.perfect = perfect
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor):
        logits = torch.zeros(*ids.shape, 6)
        for b, seq in enumerate(ids.tolist()):
            for pos, bit in reference_reads(np.array(seq)):
                logits[b, pos - 1, bit if self.perfect else ZERO] = 1.0
        return type("Out", (), {"logits": logits})()


def test_evaluate_counts_read_errors(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("experiment=flipflop/smoke")
    perfect = task.evaluate(Oracle(True), cfg.task, tmp_path, "oracle")
    assert all(v == 0.0 for k, v in perfect.items() if k.startswith("read_error"))
    (tmp_path / "b").mkdir()
    zeros = task.evaluate(Oracle(False), cfg.task, tmp_path / "b", "zeros")
    with open(tmp_path / "b" / "flipflop.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 3  # 1x-4x, three sparsities
    for r in rows:  # "always 0" is wrong exactly on the reads of a 1
        tokens = eval_set(int(cfg.task.eval_seed), int(r["length"]), float(r["p_ignore"]), int(r["sequences"]))
        ones = sum(bit == ONE for seq in tokens for _, bit in reference_reads(seq))
        assert int(r["errors"]) == ones
        assert zeros[f"read_error_{r['sparsity']}_{r['multiplier']}x"] == pytest.approx(float(r["error"]))
    assert zeros["read_error_ood"] == pytest.approx((zeros["read_error_2x"] + zeros["read_error_3x"]) / 2)


@pytest.mark.parametrize("override, key", [
    ("task.seq_len=15", "task.seq_len"), ("task.p_ignore=1.0", "task.p_ignore"),
    ("task.loss_on=some", "task.loss_on"), ("task.primary_multipliers=[5]", "task.primary_multipliers"),
    ("task.eval_p_ignore.sparse=1.5", "task.eval_p_ignore.sparse"),
    ("pe=randpe model.randpe_max_position=32", "pe.randpe_max_position"),
])
def test_bad_config_names_the_key(make_cfg, override: str, key: str) -> None:
    cfg = make_cfg("experiment=flipflop/smoke", *override.split())
    with pytest.raises(PipelineConfigError, match=key.replace(".", r"\.")):
        task.validate(cfg)


@pytest.mark.parametrize("pe", ["tape", "alibi"])
def test_smoke_run_end_to_end(make_cfg, pe: str) -> None:
    cfg = make_cfg("experiment=flipflop/smoke", f"pe={pe}")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["task"] == "flipflop" and saved["pe"] == pe and saved["steps"] == 6
    assert saved == json.loads(json.dumps(metrics))
    for m in (1, 2, 3, 4):
        for s in ("in_dist", "sparse", "dense"):
            assert 0.0 <= saved[f"read_error_{s}_{m}x"] <= 100.0
    with open(run / "flipflop.csv") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["length"]) for r in rows} == {16, 32, 48, 64} and all(int(r["reads"]) > 0 for r in rows)
    ecfg = compose_config("evaluate", [f"run_dir={run}"])  # re-evaluating the run gives its numbers
    with open_dict(ecfg):
        ecfg.paths.output_dir = str(run / "eval" / "again")
    again = evaluate(ecfg)
    assert {k: v for k, v in again.items() if k.startswith("read_error")} == {
        k: v for k, v in saved.items() if k.startswith("read_error")}


@pytest.mark.parametrize("override, message", [
    ("task.eval_multipliers=[1,abc]", r"task\.eval_multipliers=\[1, 'abc'\] must be a non-empty list of integers >= 1"),
    ("task.eval_multipliers=[1,2.5]", r"task\.eval_multipliers=\[1, 2\.5\] must be a non-empty list of integers"),
    ("task.eval_multipliers=4", r"task\.eval_multipliers=4 must be a non-empty list"),
    ("task.primary_multipliers=[2,abc]", r"task\.primary_multipliers=\[2, 'abc'\] must be a non-empty list"),
    ("task.primary_multipliers=[]", r"task\.primary_multipliers=\[\] must be a non-empty list"),
    ("task.p_ignore=abc", r"task\.p_ignore='abc' must be a number in \[0, 1\)"),
    ("task.eval_p_ignore.dense=abc", r"task\.eval_p_ignore\.dense='abc' must be a number in \[0, 1\)"),
    ("task.seq_len=abc", r"task\.seq_len='abc' must be an integer"),
    ("task.batch_size=abc", r"task\.batch_size='abc' must be an integer"),
    ("task.eval_seed=abc", r"task\.eval_seed='abc' must be an integer"),
])
def test_malformed_values_name_their_key_not_a_traceback(make_cfg, override: str, message: str) -> None:
    """A value of the wrong type (task.eval_multipliers=[1,abc] once gave a raw int() traceback,
    [1,2.5] was truncated to [1,2]) is a config error naming the key."""
    cfg = make_cfg("experiment=flipflop/smoke", override)
    with pytest.raises(PipelineConfigError, match=message):
        task.validate(cfg)


def test_malformed_multipliers_fail_before_the_run_dir(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("experiment=flipflop/smoke", "logger=none", "task.eval_multipliers=[1,abc]")
    with pytest.raises(PipelineConfigError, match=r"task\.eval_multipliers="):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists() and not any((tmp_path / "runs").rglob("*"))
