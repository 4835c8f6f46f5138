"""SCROLLS data: task metadata, tape-spec D.2 truncation and loss mask with a byte tokenizer,
reference grouping, the fixture loaded end to end, the hub zip layout (no network), and the
error when there is no data."""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tape.data.scrolls import (
    IGNORE_INDEX, PAPER_LENGTHS, SUMMARY_PREFIX, SUMMARY_SUFFIX, TASKS, Lengths, ScrollsDataError,
    ScrollsExample, answer_ids, collate, cut_words, get_task, group_references, keep_ends,
    load_scrolls, prompt_ids, references, suffix_tokens, training_row,
)
from tape.metrics.scrolls import score_predictions

FIXTURES = Path(__file__).parent / "fixtures" / "scrolls"
BOS, EOS, PAD = 256, 257, 258


def encode(text: str) -> list[int]:
    """A byte tokenizer: one token per UTF-8 byte, no special tokens."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8")


TAIL = len(encode(SUMMARY_SUFFIX))  # the instruction's length under the byte tokenizer (31)
SMALL = Lengths(words=6, generate_words=3, qa_prompt=40, qa_answer=8,
                summary_head=30, summary_tail=TAIL, summary_answer=12, seq_len=80)


def test_task_metadata_follows_the_paper() -> None:
    assert list(TASKS) == ["qasper", "contract_nli", "narrative_qa", "quality",
                           "qmsum", "summ_screen_fd", "gov_report"]  # Table 1 column order
    metric = {name: t.metric for name, t in TASKS.items()}
    assert metric == {"qasper": "f1", "narrative_qa": "f1", "quality": "exact_match",
                      "contract_nli": "exact_match", "qmsum": "rouge",
                      "summ_screen_fd": "rouge", "gov_report": "rouge"}
    for name, t in TASKS.items():
        g = t.generation
        if t.is_summary:
            assert g.do_sample and g.max_new_tokens == 1000
            assert (g.top_k, g.top_p) == ((50, 1.0) if name == "gov_report" else (3, None))
        else:
            assert t.kind == "qa" and not g.do_sample and g.max_new_tokens == 200
    with pytest.raises(ValueError, match="unknown SCROLLS task 'squad'.*qasper, contract_nli"):
        get_task("squad")


def test_paper_lengths_fill_exactly_8192_tokens() -> None:
    L = PAPER_LENGTHS
    assert (L.words, L.generate_words, L.qa_prompt, L.qa_answer) == (20_000, 15_000, 7_991, 200)
    assert (L.summary_head, L.summary_tail, L.summary_answer) == (7_184, 7, 1_000)
    assert L.qa_prompt + L.qa_answer + 1 == L.seq_len == 8_192
    assert L.summary_head + L.summary_tail + L.summary_answer + 1 == L.seq_len


def test_lengths_that_cannot_fit_name_the_fields() -> None:
    with pytest.raises(ValueError, match="seq_len=100 is shorter.*8192"):
        Lengths(seq_len=100)
    with pytest.raises(ValueError, match="Lengths.qa_answer=0 must be positive"):
        Lengths(qa_answer=0)


def test_cut_words_is_an_exact_prefix_split_on_spaces() -> None:
    text = "q? \n\nline one\nline two  three"
    # words are runs between single spaces, as the official cut: newlines stay inside words
    assert cut_words(text, 2) == "q? \n\nline"
    assert cut_words(text, 3) == "q? \n\nline one\nline"
    assert cut_words(text, 99) == text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=" ab\n", max_size=40), st.integers(1, 12))
def test_cut_words_property(text: str, n: int) -> None:
    cut = cut_words(text, n)
    assert text.startswith(cut)
    assert len(cut.split(" ")) == min(n, len(text.split(" ")))


def test_qa_prompt_cuts_words_then_tokens() -> None:
    text = "Who won?\n\nRed won the first race and Blue the second race"
    assert prompt_ids("qasper", text, encode, BOS, SMALL) == [BOS] + encode(cut_words(text, 6))
    gen = prompt_ids("qasper", text, encode, BOS, SMALL, generation=True)
    assert gen == [BOS] + encode("Who won?\n\nRed won")  # generate_words = 3 ("won?\n\nRed" is one)
    tight = Lengths(words=6, qa_prompt=10, seq_len=80, qa_answer=8, summary_head=30,
                    summary_tail=TAIL, summary_answer=12)
    assert prompt_ids("contract_nli", text, encode, BOS, tight) == [BOS] + encode(text)[:9]
    assert prompt_ids("quality", text, encode, None, tight) == encode(text)[:10]  # no BOS


def test_summary_truncation_keeps_the_instruction_at_the_end() -> None:
    report = "The committee met twelve times. " * 20
    ids = prompt_ids("gov_report", report, encode, BOS, SMALL)
    assert len(ids) == SMALL.summary_head + SMALL.summary_tail
    assert ids[: SMALL.summary_head] == ([BOS] + encode(SUMMARY_PREFIX + report))[:30]
    assert decode(ids[-TAIL:]) == SUMMARY_SUFFIX == "\n Please summarize this report:"
    assert decode(ids).startswith("Context:\nThe committee")


def test_a_short_summary_prompt_is_kept_whole_without_a_repeated_instruction() -> None:
    ids = prompt_ids("qmsum", "Short.", encode, BOS, SMALL)
    assert ids == [BOS] + encode("Context:\nShort.\n Please summarize this report:")
    assert decode(ids).count("Please summarize") == 1  # ids[:head] + ids[-tail:] would give 2
    assert keep_ends(list(range(10)), 4, 3) == [0, 1, 2, 3, 7, 8, 9]
    assert keep_ends(list(range(7)), 4, 3) == list(range(7))
    assert keep_ends(list(range(10)), 4, 0) == [0, 1, 2, 3]


def labelled(row: dict[str, list[int]]) -> list[int]:
    return [i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX]


def test_loss_mask_covers_exactly_the_answer_and_eos() -> None:
    text, answer = "Who won?\n\nRed won the first race", "Red"
    row = training_row("qasper", text, answer, encode, bos_id=BOS, eos_id=EOS, pad_id=PAD,
                       lengths=SMALL)
    prompt = prompt_ids("qasper", text, encode, BOS, SMALL)
    n = len(prompt) + len(answer) + 1
    assert all(len(v) == SMALL.seq_len for v in row.values())
    assert labelled(row) == list(range(len(prompt), n))
    assert [row["labels"][i] for i in labelled(row)] == encode("Red") + [EOS]
    assert row["input_ids"][:n] == prompt + encode("Red") + [EOS]
    assert row["input_ids"][n:] == [PAD] * (SMALL.seq_len - n)
    assert row["attention_mask"] == [1] * n + [0] * (SMALL.seq_len - n)
    assert row["input_ids"].count(BOS) == 1  # one BOS at the start, none before the answer


def test_answers_are_cut_before_eos() -> None:
    long_answer = "abcdefghijklmnopqrstuvwxyz"
    assert answer_ids("narrative_qa", long_answer, encode, EOS, SMALL) == encode("abcdefgh") + [EOS]
    summary = answer_ids("gov_report", long_answer, encode, EOS, SMALL)
    assert summary == encode(long_answer[:12]) + [EOS]
    spaced = answer_ids("qasper", "Red", encode, EOS, SMALL, answer_prefix=" ")
    assert spaced == encode(" Red") + [EOS]
    row = training_row("gov_report", "Rain fell. " * 30, long_answer, encode, bos_id=BOS,
                       eos_id=EOS, pad_id=PAD, lengths=SMALL)
    start = SMALL.summary_head + SMALL.summary_tail  # the prompt was cut to head + tail
    assert labelled(row) == list(range(start, start + 12 + 1))
    assert decode(row["input_ids"][start - TAIL : start]) == SUMMARY_SUFFIX


def test_a_row_without_output_cannot_be_trained_on() -> None:
    with pytest.raises(ValueError, match="no output"):
        training_row("qasper", "x", None, encode, bos_id=BOS, eos_id=EOS, pad_id=PAD, lengths=SMALL)


def test_group_references_collapses_rows_with_the_same_id() -> None:
    rows = [
        {"id": "a", "pid": "a_0", "input": "A?", "output": "one"},
        {"id": "b", "pid": "b_0", "input": "B?", "output": "two"},
        {"id": "a", "pid": "a_1", "input": "A?", "output": "uno"},
        {"id": "t", "pid": "t_0", "input": "T?", "output": None},  # test split: no output
    ]
    assert group_references(rows) == [
        ScrollsExample("a", "a_0", "A?", ("one", "uno")),
        ScrollsExample("b", "b_0", "B?", ("two",)),
        ScrollsExample("t", "t_0", "T?", ()),
    ]
    assert references(rows[:3]) == {"a": ["one", "uno"], "b": ["two"]}


@pytest.mark.datasets
def test_fixture_end_to_end_qa_and_summary(tmp_path: Path) -> None:
    qa = load_scrolls("qasper", FIXTURES, cache_dir=tmp_path)
    assert {s: len(d) for s, d in qa.items()} == {"train": 3, "validation": 3}
    refs = references(qa["validation"])
    assert refs == {"q-val-1": ["spreadsheet formulas",
                                "formulas in spreadsheets into vectorised code"],
                    "q-val-2": ["No"]}
    lengths = Lengths(words=40, generate_words=30, qa_prompt=120, qa_answer=24,
                      summary_head=90, summary_tail=TAIL, summary_answer=40, seq_len=170)
    rows = [training_row("qasper", r["input"], r["output"], encode, bos_id=BOS, eos_id=EOS,
                         pad_id=PAD, lengths=lengths) for r in qa["train"]]
    batch = collate(rows)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (3, 170), "labels": (3, 170), "attention_mask": (3, 170)}
    first = batch["labels"][0]
    assert decode(first[first != IGNORE_INDEX].tolist()) == "eleven"  # EOS is dropped by decode
    assert first[first != IGNORE_INDEX].tolist()[-1] == EOS

    summ = load_scrolls("gov_report", FIXTURES, cache_dir=tmp_path)
    for r in summ["validation"]:
        ids = prompt_ids("gov_report", r["input"], encode, BOS, lengths, generation=True)
        assert len(ids) == 90 + TAIL and decode(ids[-TAIL:]) == SUMMARY_SUFFIX
    # perfect predictions score 100 with the task's metric
    gold = {ex.id: ex.outputs[0] for ex in group_references(summ["validation"])}
    scores = score_predictions("gov_report", gold, references(summ["validation"]))
    assert scores["scrolls_score"] == pytest.approx(100.0)


def test_missing_local_files_name_the_key_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ScrollsDataError) as err:
        load_scrolls("qasper", tmp_path)
    text = str(err.value)
    for needle in ("tau/scrolls", "local JSONL", "task.data_dir", "data_dir",
                   str(tmp_path / "qasper" / "train.jsonl"), "id, pid, input, output"):
        assert needle in text


def test_an_empty_local_file_is_named_and_its_dataset_not_counted(tmp_path: Path) -> None:
    """An empty train.jsonl (an interrupted unzip) failed with a bare StopIteration traceback,
    and the reproduction's plan counted its dataset as present."""
    from pipelines.plan import scrolls_datasets

    (tmp_path / "qasper").mkdir()
    (tmp_path / "qasper" / "train.jsonl").write_text("")
    (tmp_path / "qasper" / "validation.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(ScrollsDataError, match=r"has empty .*qasper/train\.jsonl"):
        load_scrolls("qasper", tmp_path)
    assert scrolls_datasets(tmp_path)[0] == ()


def test_no_data_dir_and_no_hub_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    for data_dir in (None, ""):
        with pytest.raises(ScrollsDataError) as err:
            load_scrolls("gov_report", data_dir, hub_cache_dir=tmp_path / "empty_hub_cache")
        text = str(err.value)
        assert "tau/scrolls/gov_report.zip" in text and "task.data_dir" in text
        assert "from the Hugging Face hub or local JSONL files" in text
    assert time.perf_counter() - start < 10


def test_an_unreachable_hub_only_checks_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    import huggingface_hub

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy",
                "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    def no_network(*args: object, **kw: object) -> None:
        raise OSError("Name or service not known")

    seen: list[object] = []

    def cache_only(repo_id: str, filename: str, **kw: object) -> str:
        seen.append(kw["local_files_only"])
        raise FileNotFoundError("not in the local cache")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cache_only)
    with pytest.raises(ScrollsDataError, match="hub unreachable: only the hub cache was checked"):
        load_scrolls("qmsum", None, cache_dir=tmp_path)
    assert seen == [True]  # no download with its ~25 s of retries


def make_hub_zip(path: Path, task: str, members: dict[str, Path]) -> Path:
    """A zip laid out like tau/scrolls' <task>.zip: <task>/<split>.jsonl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for split, src in members.items():
            z.write(src, f"{task}/{split}.jsonl")
    return path


@pytest.mark.datasets
def test_hub_zip_is_read_without_a_loading_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    snapshot = tmp_path / "hub" / "snapshots" / "c0ffee"  # the hub cache names it after the commit
    members = {s: FIXTURES / "qasper" / f"{s}.jsonl" for s in ("train", "validation")}
    zip_path = make_hub_zip(snapshot / "qasper.zip", "qasper", members)
    calls = []

    def fake_download(repo_id: str, filename: str, **kw: object) -> str:
        calls.append((repo_id, filename, kw["repo_type"], kw["revision"]))
        return str(zip_path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    data = load_scrolls("qasper", None, splits=("validation",), cache_dir=tmp_path / "cache")
    assert calls == [("tau/scrolls", "qasper.zip", "dataset", "main")]
    assert references(data["validation"])["q-val-2"] == ["No"]
    extracted = tmp_path / "cache" / "tape_scrolls" / "c0ffee" / "qasper" / "validation.jsonl"
    assert extracted.read_bytes() == (FIXTURES / "qasper" / "validation.jsonl").read_bytes()

    with pytest.raises(ScrollsDataError, match="has no qasper/test.jsonl"):
        load_scrolls("qasper", None, splits=("test",), cache_dir=tmp_path / "cache")


@pytest.mark.datasets
def test_rows_without_the_scrolls_fields_are_refused(tmp_path: Path) -> None:
    (tmp_path / "qasper").mkdir()
    row = json.dumps({"id": "x", "text": "y"})
    (tmp_path / "qasper" / "validation.jsonl").write_text(row + "\n")
    lacking = r"lacks the field\(s\) \['pid', 'input', 'output'\]"
    with pytest.raises(ScrollsDataError, match=lacking):
        load_scrolls("qasper", tmp_path, splits=("validation",), cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="unknown SCROLLS split"):
        load_scrolls("qasper", tmp_path, splits=("dev",))


def _llama_like_tokenizer():
    """A SentencePiece-style BPE as Hugging Face's Llama-2 tokenizer normalises: '▁' prepended
    to the text and spaces turned into '▁', so a text encoded alone starts a word."""
    tokenizers = pytest.importorskip("tokenizers")
    pieces = ["▁Please", "▁summar", "ize", "▁this", "▁report", "▁.", "▁Con", "text"]
    vocab = {"<unk>": 0}
    for ch in sorted(set("".join(pieces) + "\n:")):
        vocab.setdefault(ch, len(vocab))
    merges = []
    for piece in pieces:
        cur = piece[0]
        for ch in piece[1:]:
            merges.append((cur, ch))
            cur += ch
            vocab.setdefault(cur, len(vocab))
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend("▁"),
                                                      tokenizers.normalizers.Replace(" ", "▁")])
    return lambda text: tok.encode(text).ids


def test_the_summary_instruction_is_counted_as_it_ends_a_prompt() -> None:
    """Encoded alone, Llama's tokenizer gives the instruction a lone '▁' (8 tokens); at the end of
    a prompt it is 7, and 7184 + 8 + 1000 + 1 would not fit the paper's 8192."""
    encode = _llama_like_tokenizer()
    assert len(encode(SUMMARY_SUFFIX)) == 8  # the lone '▁' before the newline
    prompt = encode("Context" + SUMMARY_SUFFIX)
    assert suffix_tokens(encode) == 7 and prompt[-7:] == encode("." + SUMMARY_SUFFIX)[-7:]
    assert Lengths(summary_tail=suffix_tokens(encode)).summary_tail == 7  # the paper's lengths fit
    with pytest.raises(ValueError, match="seq_len=8192 is shorter"):
        Lengths(summary_tail=len(encode(SUMMARY_SUFFIX)))
    # why scrolls/paper (Llama's tokenizer) joins prompt and answer with "": a space adds a lone '▁'
    assert encode("Please") == answer_ids("qasper", "Please", encode, 99, answer_prefix="")[:-1]
    assert len(answer_ids("qasper", "Please", encode, 99, answer_prefix=" ")) == 3
