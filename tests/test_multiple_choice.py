"""MMLU / ARC (Table 9): local items and their errors, the prompts, log-likelihood scoring equal
to scoring each choice alone, acc against acc_norm, standard errors, and the task's checks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from model_helpers import randomize, tiny_config
from pipelines.errors import PipelineConfigError
from pipelines.tasks import multiple_choice as task
from tape.data.multiple_choice import (MMLU_GROUP_OF, MMLU_GROUPS, Item, MultipleChoiceDataError, arc_row,
                                       parse_item, prompt, read_items, shots_for)
from tape.metrics.multiple_choice import accuracy, loglikelihoods, score, split_ids
from tape.model import DecoderLM


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


MMLU_ROWS = [{"question": f"q{i}", "choices": ["w", "x", "y", "z"], "answer": i % 4,
              "subject": ("anatomy", "philosophy", "sociology")[i % 3]} for i in range(9)]


def test_mmlu_groups_split_the_57_subjects_once_each():
    subjects = [s for group in MMLU_GROUPS.values() for s in group]
    assert len(subjects) == len(set(subjects)) == len(MMLU_GROUP_OF) == 57


@pytest.mark.parametrize("answer, index", [(2, 2), ("C", 2), ("c", 2), ("2", 2), (0, 0)])
def test_an_answer_is_an_index_or_a_letter(answer, index):
    row = {"question": "q", "choices": ["a", "b", "c"], "answer": answer}
    assert parse_item(row, "arc_easy", "f:1").answer == index


@pytest.mark.parametrize("row, benchmark, message", [
    ({"question": "q", "choices": ["a", "b"], "answer": 2}, "arc_easy", "f:3: answer=2 is not one of the 2 choices"),
    ({"question": "q", "choices": ["a", "b"], "answer": "E"}, "arc_easy", "answer='E' is not one of"),
    ({"question": "q", "answer": 0}, "arc_easy", "f:3: a row needs question, choices"),
    ({"question": "q", "choices": ["a", "b"], "answer": 0, "subject": "cooking"}, "mmlu", "subject='cooking'"),
    ({"question": "q", "choices": ["a", "b"], "answer": 0}, "mmlu", "subject=''"),
])
def test_a_bad_row_is_named_with_its_file_and_line(row, benchmark, message):
    with pytest.raises(MultipleChoiceDataError, match=message):
        parse_item(row, benchmark, "f:3")


def test_missing_files_say_how_to_write_them(tmp_path):
    with pytest.raises(MultipleChoiceDataError, match=r"python -m tape.data.multiple_choice --out"):
        read_items(tmp_path, "mmlu")
    (tmp_path / "arc_easy").mkdir()
    (tmp_path / "arc_easy" / "test.jsonl").write_text('{"question": "q"\n')
    with pytest.raises(MultipleChoiceDataError, match=r"test.jsonl:1: not JSON"):
        read_items(tmp_path, "arc_easy")


def test_arc_rows_from_the_hub_take_the_answer_by_label():
    row = {"question": "Which?", "choices": {"text": ["a", "b", "c", "d"], "label": ["1", "2", "3", "4"]},
           "answerKey": "3"}
    assert arc_row(row) == {"question": "Which?", "choices": ["a", "b", "c", "d"], "answer": 2}


def test_prompts_in_lm_evaluation_harness_formats():
    item = Item("What is 2 + 2?", ("3", "4"), 1, "elementary_mathematics")
    shot = Item("What is 1 + 1?", ("2", "5"), 0, "elementary_mathematics")
    p = prompt("mmlu", item, [shot])
    assert p.context == ("The following are multiple choice questions (with answers) about elementary mathematics.\n\n"
                         "What is 1 + 1?\nA. 2\nB. 5\nAnswer: A\n\nWhat is 2 + 2?\nA. 3\nB. 4\nAnswer:")
    assert p.continuations == (" A", " B")
    arc = prompt("arc_easy", Item("Why?", ("because", "no"), 0), [Item("How?", ("so", "not"), 1)])
    assert arc.context == "Question: How?\nAnswer: not\n\nQuestion: Why?\nAnswer:"
    assert arc.continuations == (" because", " no")


def test_shots_come_from_the_same_subject_and_run_out_clearly():
    pool = [Item("p", ("a", "b"), 0, s) for s in ("anatomy", "virology", "anatomy")]
    item = Item("q", ("a", "b"), 0, "anatomy")
    assert [s.subject for s in shots_for(item, pool, 2)] == ["anatomy", "anatomy"]
    with pytest.raises(MultipleChoiceDataError, match="3 shots asked, the few-shot file has 2 items of subject 'anatomy'"):
        shots_for(item, pool, 3)


def test_the_continuation_is_cut_from_the_whole_encoding():
    def merging(text: str) -> list[int]:  # one token for " A" wherever it appears, else bytes
        return [t for part in text.split(" A") for t in [*part.encode(), 999]][:-1]

    assert split_ids(merging, "Answer:", " A") == (list(b"Answer:"), [999])
    assert split_ids(lambda s: list(s.encode()), "ab", "cd") == ([97, 98], [99, 100])
    glued = lambda s: [len(s)]  # noqa: E731 (the whole never starts with the context's ids)
    assert split_ids(glued, "ab", "cd") == ([2], [2])


@pytest.mark.parametrize("pe", ["rope", "tape", "alibi"])
def test_one_padded_pass_equals_scoring_each_choice_alone(pe):
    torch.manual_seed(0)
    model = randomize(DecoderLM(tiny_config(pe)), seed=3).eval()
    context = [1, 5, 9, 2, 7]
    continuations = [[3], [4, 8, 11], [6, 6]]
    batched = loglikelihoods(model, [(context, k) for k in continuations], "cpu")
    for k, ll in zip(continuations, batched):
        seq = torch.tensor([context + k])
        with torch.no_grad():
            logp = model(seq).logits[0].double().log_softmax(-1)
        alone = sum(float(logp[len(context) - 1 + j, t]) for j, t in enumerate(k))
        assert ll == pytest.approx(alone, abs=1e-4)


class Unigram(nn.Module):
    """Logits that ignore the input: log p(byte) fixed, so each choice's score is known."""

    def __init__(self, logp: dict[int, float]) -> None:
        super().__init__()
        logits = torch.full((256,), -1e4)
        for byte, value in logp.items():
            logits[byte] = value
        self.logits = nn.Parameter(logits.log_softmax(-1))

    def forward(self, ids):
        return SimpleNamespace(logits=self.logits.expand(*ids.shape, 256))


def test_acc_takes_the_likeliest_choice_and_acc_norm_the_likeliest_per_byte():
    # ' ' and 'a' likely, 'b' less: " a" (-2 x 0.5 nats) beats " ab" in total, " ab" loses per byte
    # too, but " bbbbbbbb" with far more bytes wins per byte against a short, unlikely " c"
    model = Unigram({ord(" "): 0.0, ord("a"): 0.0, ord("b"): -0.1, ord("c"): -3.0})
    encode = lambda s: list(s.encode())  # noqa: E731
    p = SimpleNamespace(context="Q:", continuations=(" c", " bbbbbbbb"), choice_texts=("c", "bbbbbbbb"))
    lls = loglikelihoods(model, [split_ids(encode, p.context, c) for c in p.continuations], "cpu")
    assert lls[0] > lls[1] and lls[0] / 2 < lls[1] / 9  # the setting is as described
    s = score(model, encode, p, answer=1, device="cpu")
    assert (s.correct, s.correct_norm) == (False, True)
    assert s.loglikelihoods == pytest.approx(tuple(lls))


def test_long_contexts_are_cut_from_the_left():
    model = Unigram({ord("x"): 0.0, ord(" "): 0.0, ord("y"): 0.0})
    p = SimpleNamespace(context="x" * 50, continuations=(" y", " yy"), choice_texts=("y", "yy"))
    s = score(model, lambda t: list(t.encode()), p, answer=0, device="cpu", bos_id=1, max_tokens=10)
    assert s.tokens == 10
    with pytest.raises(ValueError, match="max_tokens=2"):
        score(model, lambda t: list(t.encode()), p, answer=0, device="cpu", max_tokens=2)


def test_accuracy_and_its_standard_error():
    acc, se = accuracy([True, False, True, False])
    assert acc == 50.0 and se == pytest.approx(100 * math.sqrt(0.25 / 3))
    assert accuracy([True, True])[1] == 0.0 and math.isnan(accuracy([True])[1])


def task_cfg(data_dir: Path, **changes) -> OmegaConf:
    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "task" / "multiple_choice.yaml")
    cfg.data_dir, cfg.tokenizer = str(data_dir), "unused"
    return OmegaConf.merge(cfg, changes)


@pytest.mark.parametrize("changes, message", [
    (dict(data_dir=None), "task.data_dir is not set"),
    (dict(benchmarks=["mmlu", "hellaswag"]), r"task.benchmarks=\['mmlu', 'hellaswag'\]: choose from"),
    (dict(shots={"mmlu": -1}), r"task.shots.mmlu=-1: a number of examples >= 0"),
    (dict(max_items=0), "task.max_items=0: a positive integer or null"),
    (dict(bos="yes"), "task.bos"),
    (dict(benchmarks=["arc_easy"]), r"task.data_dir=.*arc_easy/test.jsonl not found"),
    (dict(benchmarks=["mmlu"], shots={"mmlu": 5}), r"mmlu/fewshot.jsonl not found"),
])
def test_the_task_names_a_bad_setting_or_missing_data(tmp_path, changes, message):
    write_jsonl(tmp_path / "mmlu" / "test.jsonl", MMLU_ROWS)
    cfg = OmegaConf.merge(task_cfg(tmp_path, benchmarks=["mmlu"]), changes)
    with pytest.raises(PipelineConfigError, match=message):
        task.check(cfg)


def test_max_items_spreads_over_the_file(tmp_path):
    write_jsonl(tmp_path / "mmlu" / "test.jsonl", MMLU_ROWS)
    items, _ = task._data(task_cfg(tmp_path, max_items=3), "mmlu")
    assert [i.question for i in items] == ["q0", "q3", "q6"]


@pytest.mark.parametrize("seed", range(4))
def test_paired_difference_against_scipy(seed):
    from scipy.stats import binomtest

    from tape.report.paired import paired_difference

    gen = torch.Generator().manual_seed(seed)
    a = (torch.rand(300, generator=gen) < 0.55).tolist()
    b = [x if torch.rand(1, generator=gen) < 0.8 else not x for x in a]
    d = paired_difference(a, b)
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    assert d.delta == pytest.approx(100 * (only_a - only_b) / 300)
    assert d.p_value == pytest.approx(binomtest(only_a, only_a + only_b, 0.5).pvalue, rel=1e-9)
    diffs = torch.tensor([int(x) - int(y) for x, y in zip(a, b)], dtype=torch.float64)
    assert d.high - d.delta == pytest.approx(100 * 1.959964 * float(diffs.std()) / math.sqrt(300))
    assert paired_difference([True, False], [True, False]).p_value == 1.0
    with pytest.raises(ValueError, match="same items"):
        paired_difference([True], [True, False])


def test_the_paired_table_compares_each_model_with_the_reference_item_by_item():
    from pipelines.tasks.context_extension.report import paired_table

    def rec(item, group, correct):
        return {"benchmark": "mmlu", "item": item, "group": group, "correct": correct}

    base = [rec(0, "stem", True), rec(1, "stem", False), rec(2, "other", False), rec(3, "other", True)]
    tape = [rec(3, "other", True), rec(2, "other", True), rec(1, "stem", True), rec(0, "stem", True)]  # another order
    table = paired_table({"base": base, "tape": tape}, "base").splitlines()
    assert table[0] == "| method | mmlu stem | mmlu other | mmlu all |"
    cells = [c.strip() for c in table[2].split("|")[2:-1]]
    assert [c.split(" ")[0] for c in cells] == ["+50.00", "+50.00", "+50.00"]
    assert cells[2].endswith("p 0.5")  # 2 items only TAPE got right: 2 x (1/2)^2


def test_the_hub_writer_makes_the_files_the_task_reads_and_keeps_existing_ones(tmp_path, monkeypatch):
    import tape.data.hub
    import tape.data.multiple_choice as data

    asked = []

    def rows(benchmark, split):
        asked.append((benchmark, split))
        yield {"question": f"{benchmark} {split}", "choices": ["a", "b"], "answer": 1, "subject": "virology"}

    monkeypatch.setattr(data, "hub_rows", rows)
    monkeypatch.setattr(tape.data.hub, "hub_usable", lambda: False)
    with pytest.raises(MultipleChoiceDataError, match="hub cannot be reached"):
        data.write_benchmarks(tmp_path)
    monkeypatch.setattr(tape.data.hub, "hub_usable", lambda: True)
    (tmp_path / "arc_easy").mkdir()
    (tmp_path / "arc_easy" / "test.jsonl").write_text("kept\n")
    written = data.write_benchmarks(tmp_path)
    assert len(written) == 5 and (tmp_path / "arc_easy" / "test.jsonl").read_text() == "kept\n"
    assert ("mmlu", "dev") in asked and ("arc_challenge", "train") in asked and ("arc_easy", "test") not in asked
    assert read_items(tmp_path, "mmlu", "fewshot")[0] == Item("mmlu dev", ("a", "b"), 1, "virology")
