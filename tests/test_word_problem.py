"""The group word problem (claim C5): the groups' axioms and the generator's properties
(hypothesis), the task's config checks and evaluation, and a smoke run end to end through
pipelines.train."""

from __future__ import annotations

import csv
import functools
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
from pipelines.tasks import word_problem as task
from pipelines.train import train
from tape.data.labels import IGNORE_INDEX
from tape.data.word_problem import (
    GROUPS, WordProblemStream, eval_set, generate, get_group, is_even, model_inputs, multiply,
    prefix_products, training_batch,
)

ORDERS = {"parity": 2, "s3": 6, "a5": 60}


def compose(p: np.ndarray, q: np.ndarray) -> tuple[int, ...]:
    """The permutation p after q, (p q)(x) = p(q(x)), by a plain loop."""
    return tuple(int(p[int(q[x])]) for x in range(len(q)))


@st.composite
def group_and_elements(draw, k: int = 3):
    name = draw(st.sampled_from(GROUPS))
    n = ORDERS[name]
    return name, [draw(st.integers(0, n - 1)) for _ in range(k)]


# ---------------------------------------------------------------------------- groups
@pytest.mark.parametrize("name", GROUPS)
def test_table_is_a_group(name: str) -> None:
    g = get_group(name)
    n = g.order
    assert n == ORDERS[name] and g.table.shape == (n, n) and g.vocab_size == n + 2
    assert g.table.min() >= 0 and g.table.max() < n  # closure
    ids = np.arange(n)
    assert (g.table[g.identity] == ids).all() and (g.table[:, g.identity] == ids).all()  # identity
    assert tuple(g.perms[g.identity]) == tuple(range(g.perms.shape[1]))
    assert (g.table[ids, g.inverse] == g.identity).all() and (g.table[g.inverse, ids] == g.identity).all()
    for row in g.table:  # Latin square: each row and column a permutation of the elements
        assert sorted(row) == list(ids)
    assert all(sorted(col) == list(ids) for col in g.table.T)
    assert len({tuple(p) for p in g.perms}) == n  # distinct permutations
    for a in range(n):  # the table is the composition of the permutations
        for b in range(n):
            assert compose(g.perms[a], g.perms[b]) == tuple(g.perms[g.table[a, b]])


@settings(max_examples=300, deadline=None)
@given(group_and_elements())
def test_associativity(case: tuple[str, list[int]]) -> None:
    name, (a, b, c) = case
    g = get_group(name)
    assert multiply(g, multiply(g, a, b), c) == multiply(g, a, multiply(g, b, c))


def test_group_facts() -> None:
    parity, s3, a5 = (get_group(n) for n in ("parity", "s3", "a5"))
    assert (parity.order, s3.order, a5.order) == (2, 6, 60)
    assert (parity.table == parity.table.T).all()  # Z2 is abelian
    assert not (s3.table == s3.table.T).all()  # S3 and A5 are not
    assert not (a5.table == a5.table.T).all()
    assert all(is_even(p) for p in a5.perms) and a5.perms.shape == (60, 5)
    assert sum(is_even(p) for p in s3.perms) == 3  # S3 = A3 and its odd coset
    assert parity.table.tolist() == [[0, 1], [1, 0]]  # the running parity
    a5_centre = [z for z in range(60) if (a5.table[z] == a5.table[:, z]).all()]
    assert a5_centre == [0]  # A5 is simple: a trivial centre
    assert s3.decode([0, 5, s3.pad, s3.bos]) == ["012", "210", "<pad>", "<bos>"]
    with pytest.raises(ValueError, match="unknown group 's4'.*parity.*s3.*a5"):
        get_group("s4")


# ---------------------------------------------------------------------------- generator
@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(GROUPS), seed=st.integers(0, 2**32 - 1), length=st.integers(1, 40),
       batch=st.integers(1, 5))
def test_targets_are_the_left_fold(name: str, seed: int, length: int, batch: int) -> None:
    g = get_group(name)
    tokens, targets = generate(np.random.default_rng(seed), g, batch, length)
    assert tokens.shape == targets.shape == (batch, length) and tokens.dtype == targets.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < g.order
    index = {tuple(p): i for i, p in enumerate(g.perms)}
    for seq, want in zip(tokens, targets):
        for t in range(length):  # brute force: fold the permutations themselves, left to right
            perm = functools.reduce(lambda acc, e: compose(acc, g.perms[e]), seq[1:t + 1], tuple(g.perms[seq[0]]))
            assert index[perm] == want[t]
    assert np.array_equal(prefix_products(g, tokens), targets)


def test_seeded_and_distinct() -> None:
    g = get_group("s3")
    a = generate(np.random.default_rng(3), g, 4, 32)
    assert all(np.array_equal(x, y) for x, y in zip(a, generate(np.random.default_rng(3), g, 4, 32)))
    assert not np.array_equal(a[0], generate(np.random.default_rng(4), g, 4, 32)[0])
    assert np.array_equal(eval_set(42, g, 16, 10)[0], eval_set(42, g, 16, 10)[0])
    assert not np.array_equal(eval_set(42, g, 16, 10)[0], eval_set(43, g, 16, 10)[0])
    s = WordProblemStream(seed=0, group_name="a5", length=8, batch_size=4)
    assert torch.equal(s.batch(5)["input_ids"], WordProblemStream(0, "a5", 8, 4, start=5).batch(5)["input_ids"])
    assert not torch.equal(s.batch(5)["input_ids"], s.batch(6)["input_ids"])
    assert not torch.equal(s.batch(5)["input_ids"], WordProblemStream(1, "a5", 8, 4).batch(5)["input_ids"])
    with pytest.raises(ValueError, match="length"):
        generate(np.random.default_rng(0), g, 1, 0)


@pytest.mark.parametrize("bos", [True, False])
def test_training_labels_score_every_prefix_product(bos: bool) -> None:
    """CausalLMModule scores logits[t] against labels[t + 1]: the position that has just read
    g_t must be scored against prefix product t, for all N of them."""
    g = get_group("s3")
    tokens, targets = generate(np.random.default_rng(0), g, 3, 7)
    batch = training_batch(g, tokens, targets, bos)
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (3, 7 + int(bos) + 1)
    assert (ids[:, -1] == g.pad).all() and ((ids[:, 0] == g.bos).all() if bos else True)
    scored = labels[:, 1:] != IGNORE_INDEX  # (B, N+bos): which logits positions count
    assert scored.sum(dim=1).tolist() == [7, 7, 7]
    reads = ids[:, :-1][scored].view(3, 7)  # the token at each scored position ...
    assert torch.equal(reads, torch.from_numpy(tokens))  # ... is g_t,
    assert torch.equal(labels[:, 1:][scored].view(3, 7), torch.from_numpy(targets))  # scored with p_t
    assert torch.equal(model_inputs(g, tokens, bos), ids[:, :-1])  # evaluation reads the same prefix


# ---------------------------------------------------------------------------- evaluation
class Oracle(torch.nn.Module):
    """A perfect word-problem model (or one that always answers the identity)."""

    def __init__(self, name: str, perfect: bool) -> None:
        super().__init__()
        self.g, self.perfect = get_group(name), perfect
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor):
        g = self.g
        logits = torch.zeros(*ids.shape, g.vocab_size)
        logits[..., g.bos] = 5.0  # never an answer: evaluation must look at the elements only
        for b, seq in enumerate(ids.tolist()):
            acc = g.identity
            for pos, tok in enumerate(seq):
                if tok < g.order:
                    acc = int(g.table[acc, tok])
                logits[b, pos, acc if self.perfect else g.identity] = 1.0
        return type("Out", (), {"logits": logits})()


def test_evaluate_counts_right_products(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("experiment=word_problem/smoke")
    perfect = task.evaluate(Oracle("s3", True), cfg.task, tmp_path, "oracle")
    assert {k: v for k, v in perfect.items() if "accuracy" in k} == {
        **{f"{m}_accuracy_{x}x": 100.0 for m in ("token", "sequence") for x in (1, 2, 4)}, "token_accuracy": 100.0}
    (tmp_path / "b").mkdir()
    ident = task.evaluate(Oracle("s3", False), cfg.task, tmp_path / "b", "identity")
    with open(tmp_path / "b" / "word_problem.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["multiplier"]), int(r["length"])) for r in rows] == [(1, 8), (2, 16), (4, 32)]
    g = get_group("s3")
    for r in rows:  # "always the identity" is right exactly where the prefix product is
        _, targets = eval_set(int(cfg.task.eval_seed), g, int(r["length"]), int(cfg.task.eval_sequences))
        want = 100.0 * (targets == g.identity).mean()
        assert float(r["token_accuracy"]) == pytest.approx(want)
        assert ident[f"token_accuracy_{r['multiplier']}x"] == pytest.approx(want)
        assert float(r["sequence_accuracy"]) == pytest.approx(100.0 * (targets == g.identity).all(axis=1).mean())
    assert ident["token_accuracy"] == ident["token_accuracy_1x"]


def test_evaluate_scores_every_prefix_length(make_cfg, tmp_path: Path) -> None:
    """word_problem_positions.csv: token accuracy at each prefix length, for every length multiple."""
    cfg = make_cfg("experiment=word_problem/smoke")
    task.evaluate(Oracle("s3", False), cfg.task, tmp_path, "identity")
    with open(tmp_path / "word_problem_positions.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["multiplier", "position", "token_accuracy"]
    g, n = get_group("s3"), int(cfg.task.seq_len)
    for m in (1, 2, 4):
        mine = [r for r in rows if int(r["multiplier"]) == m]
        assert [int(r["position"]) for r in mine] == list(range(1, m * n + 1))
        _, targets = eval_set(int(cfg.task.eval_seed), g, m * n, int(cfg.task.eval_sequences))  # (B, m*n)
        want = 100.0 * (targets == g.identity).mean(axis=0)  # the identity is right where p_t is
        assert [float(r["token_accuracy"]) for r in mine] == pytest.approx(want.tolist())


# ---------------------------------------------------------------------------- config
def checked(make_cfg, *overrides: str):
    cfg = make_cfg("experiment=word_problem/smoke", *overrides)
    task.prepare(cfg)
    task.validate(cfg)
    return cfg


@pytest.mark.parametrize("group, vocab", [("parity", 4), ("s3", 8), ("a5", 62)])
def test_prepare_sizes_the_vocabulary(make_cfg, group: str, vocab: int) -> None:
    cfg = checked(make_cfg, f"task.group={group}")
    assert cfg.task.vocab_size == vocab and cfg.model.vocab_size == vocab
    assert checked(make_cfg, f"task.group={group}", "task.vocab_size=70").task.vocab_size == 70


@pytest.mark.parametrize("override, message", [
    ("task.group=s4", r"task\.group='s4' is not a known group; choose one of \['parity', 's3', 'a5'\]"),
    ("task.seq_len=0", r"task\.seq_len=0 must be >= 1"),
    ("task.batch_size=0", r"task\.batch_size=0 must be >= 1"),
    ("task.eval_sequences=0", r"task\.eval_sequences=0 must be >= 1"),
    ("task.eval_multipliers=[]", r"task\.eval_multipliers=\[\] must be a non-empty list"),
    ("task.eval_multipliers=[1,0]", r"task\.eval_multipliers=\[1, 0\] must be"),
    ("task.eval_multipliers=[2,4]", r"task\.eval_multipliers=\[2, 4\] must include 1"),
    ("task.bos=maybe", r"task\.bos='maybe' must be true or false"),
    ("task.group=a5 task.vocab_size=8", r"task\.vocab_size=8 is smaller than the a5 vocabulary"),
    ("model.vocab_size=4", r"model\.vocab_size=4 is smaller"),
    ("pe=randpe model.randpe_max_position=16", r"pe\.randpe_max_position"),
])
def test_bad_config_is_one_clear_line(make_cfg, override: str, message: str) -> None:
    with pytest.raises(PipelineConfigError, match=message) as err:
        checked(make_cfg, *override.split())
    assert "\n" not in str(err.value)


def test_unprepared_vocabulary_is_reported(make_cfg) -> None:
    with pytest.raises(PipelineConfigError, match=r"task\.vocab_size is null"):
        task.validate(make_cfg("experiment=word_problem/smoke"))


@pytest.mark.parametrize("preset", ["smoke", "cpu", "paper"])
def test_presets_are_valid(preset: str) -> None:
    cfg = compose_config("config", [f"experiment=word_problem/{preset}", "pe=tape"])
    task.prepare(cfg)
    task.validate(cfg)
    assert cfg.experiment_name == f"word_problem/{preset}" and cfg.scale == preset
    assert cfg.trainer.max_steps % cfg.trainer.val_check_interval == 0
    if preset == "cpu":
        assert (cfg.task.group, cfg.task.seq_len, cfg.model.n_layers) == ("s3", 16, 2)
    if preset == "paper":
        assert (cfg.task.group, cfg.model.n_layers) == ("a5", 4)


# ---------------------------------------------------------------------------- end to end
def test_smoke_run_end_to_end(make_cfg) -> None:
    cfg = make_cfg("experiment=word_problem/smoke", "pe=tape")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["task"] == "word_problem" and saved["pe"] == "tape" and saved["steps"] == 6
    assert saved == json.loads(json.dumps(metrics))
    for m in (1, 2, 4):
        for kind in ("token", "sequence"):
            assert isinstance(saved[f"{kind}_accuracy_{m}x"], float)
            assert 0.0 <= saved[f"{kind}_accuracy_{m}x"] <= 100.0
    assert saved["token_accuracy"] == saved["token_accuracy_1x"]
    with open(run / "word_problem.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["multiplier", "length", "token_accuracy", "sequence_accuracy"]
    assert [int(r["length"]) for r in rows] == [8, 16, 32]
    with open(run / "word_problem_positions.csv") as f:
        positions = list(csv.DictReader(f))
    assert len(positions) == 8 + 16 + 32
    ecfg = compose_config("evaluate", [f"run_dir={run}"])  # re-evaluating the run gives its numbers
    with open_dict(ecfg):
        ecfg.paths.output_dir = str(run / "eval" / "again")
    again = evaluate(ecfg)
    assert {k: v for k, v in again.items() if "accuracy_" in k} == {
        k: v for k, v in saved.items() if "accuracy_" in k}


def test_prepare_gives_tokens_per_second_the_groups_pad_id():
    """Element 0 is the identity: throughput must not skip it as padding."""
    from omegaconf import OmegaConf

    from pipelines.tasks.word_problem import prepare

    cfg = OmegaConf.create({"task": {"group": "s3", "vocab_size": None},
                            "callbacks": {"tokens_per_second": {"_target_": "tape.lightning.TokensPerSecond"}}})
    prepare(cfg)
    assert cfg.task.vocab_size == 8 and cfg.callbacks.tokens_per_second.pad_id == 6
