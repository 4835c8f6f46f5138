"""Local corpora, the BPE, the token files and the packed-block stream (tape/data/{corpus,tokenizer,text}.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tape.data.corpus import Document, kjv_books, load_corpus, shakespeare_plays, split_documents
from tape.data.text import TokenBlockStream, prepare_text_data, spread_blocks
from tape.data.tokenizer import BPETokenizer, load_tokenizer, train_bpe

WORDS = "the king and queen of the land spake unto them saying come hither now 12 345".split()


def invented_docs(prefix: str, n: int, seed: int = 0) -> list[Document]:
    rng = random.Random(seed)
    return [Document(f"{prefix}/{i:03d}", " ".join(rng.choice(WORDS) for _ in range(400)))
            for i in range(n)]


@pytest.fixture(scope="module")
def small_bpe() -> BPETokenizer:
    return train_bpe((d.text for d in invented_docs("t", 20)), vocab_size=300)


def test_installed_books_corpus_has_every_play_and_book():
    plays, books = shakespeare_plays(), kjv_books()
    assert len(plays) == 38 and len(books) == 66
    assert books[0].name == "kjv/01-genesis" and books[-1].name == "kjv/66-revelation"
    assert books[0].text.startswith("# Genesis\n\n1:1 In the beginning God created")
    assert "hamlet" in {d.name.split("/")[1] for d in plays}
    assert len({d.name for d in plays + books}) == 104  # names are unique


def test_split_is_by_document_deterministic_and_disjoint():
    docs = load_corpus("books")
    train, heldout = split_documents(docs, 10)
    assert {d.name for d in train}.isdisjoint(d.name for d in heldout)
    assert len(train) + len(heldout) == len(docs)
    assert split_documents(docs[::-1], 10)[1] == heldout[::-1]  # membership does not depend on order
    with pytest.raises(ValueError, match="heldout_percent"):
        split_documents(docs, 0)


def test_unknown_corpus_lists_the_choices():
    with pytest.raises(ValueError, match="books.*stdlib"):
        load_corpus("pg19")


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab c\n0123456789éß,.")), max_size=60))
def test_bpe_round_trips_any_text_and_never_adds_specials(small_bpe, text):
    ids = small_bpe.encode(text)
    assert small_bpe.decode(ids) == text
    assert not {small_bpe.pad_id, small_bpe.bos_id, small_bpe.eos_id} & set(ids)


def test_bpe_digits_are_one_token_each(small_bpe):
    ids = small_bpe.encode("key 40213")
    assert len(ids) == len(small_bpe.encode("key ")) + 5
    assert small_bpe.encode("40213") == [small_bpe.encode(c)[0] for c in "40213"]


def test_bpe_save_load_and_transformers_view_agree(small_bpe, tmp_path):
    small_bpe.save(tmp_path / "tok.json")
    again = BPETokenizer.load(tmp_path / "tok.json")
    text = "the queen spake 345"
    assert again.encode(text) == small_bpe.encode(text)
    hf = small_bpe.to_transformers()
    assert hf(text, add_special_tokens=False)["input_ids"] == small_bpe.encode(text)
    hf.save_pretrained(tmp_path / "hf")  # as passkey's task.tokenizer=<dir> loads it
    literal = "a literal <s> and </s> and <pad> in a document"
    assert load_tokenizer(tmp_path / "hf").encode(literal) == small_bpe.encode(literal) != []
    assert not {0, 1, 2} & set(small_bpe.encode(literal))  # special ids only where the pipeline adds them
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
    with pytest.raises(FileNotFoundError):
        BPETokenizer.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(["x"], vocab_size=100)


def test_prepare_text_data_writes_token_files_once(tmp_path):
    corpora = {"books": invented_docs("b", 30), "stdlib": invented_docs("s", 3, seed=1)}
    data = prepare_text_data(tmp_path, vocab_size=300, heldout_percent=20, load=corpora.__getitem__)
    meta = json.loads((data.root / "meta.json").read_text())
    tok = data.tokenizer()
    train_names = meta["splits"]["books_train"]["documents"]
    held_names = meta["splits"]["books_heldout"]["documents"]
    assert set(train_names).isdisjoint(held_names) and len(train_names) + len(held_names) == 30
    stdlib = np.asarray(data.tokens("stdlib"))
    # BOS + tokens of each document, in order, nothing else
    expected = np.concatenate([[tok.bos_id, *tok.encode(d.text)] for d in corpora["stdlib"]])
    np.testing.assert_array_equal(stdlib, expected)
    assert meta["splits"]["stdlib"]["tokens"] == len(stdlib)
    # a second call reuses the directory and never rebuilds
    mtime = (data.root / "books_train.bin").stat().st_mtime_ns
    again = prepare_text_data(tmp_path, vocab_size=300, heldout_percent=20, load=lambda _: 1 / 0)
    assert again.root == data.root and (data.root / "books_train.bin").stat().st_mtime_ns == mtime
    with pytest.raises(FileNotFoundError, match="books_heldout"):
        data.tokens("pg19")


def test_block_stream_is_a_function_of_seed_rank_and_index():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = TokenBlockStream(tokens, 16, 4, seed=0)
    b = TokenBlockStream(tokens, 16, 4, seed=0, start=5)
    first = next(iter(b))
    assert int(first["batch_index"]) == 5
    assert first["input_ids"].equal(a.batch(5)["input_ids"])
    assert not a.batch(5)["input_ids"].equal(TokenBlockStream(tokens, 16, 4, seed=1).batch(5)["input_ids"])
    assert not a.batch(5)["input_ids"].equal(TokenBlockStream(tokens, 16, 4, seed=0, rank=1).batch(5)["input_ids"])
    ids = a.batch(0)["input_ids"]
    assert ids.shape == (4, 16) and (ids.diff(dim=1) == 1).all()  # contiguous windows
    assert a.batch(0)["labels"].equal(ids)


def test_spread_blocks_are_disjoint_and_fixed():
    tokens = np.arange(1000)
    blocks = spread_blocks(tokens, 100, 4)
    assert blocks.shape == (4, 100)
    assert blocks[:, 0].tolist() == [0, 300, 600, 900]
    assert spread_blocks(tokens, 100, 50).shape == (10, 100)  # no more than there are


def test_the_shared_padding_id_is_each_vocabularys_pad(small_bpe):
    """tape.data.labels.PAD_ID (what the tokens-per-second callback skips) is every padded
    vocabulary's pad."""
    from tape.data import addition, flipflop
    from tape.data.labels import PAD_ID

    assert addition.PAD == flipflop.PAD == PAD_ID
    assert small_bpe.tokenizer.token_to_id("<pad>") == PAD_ID


def test_literal_special_token_text_is_encoded_as_text(small_bpe, tmp_path):
    """Hugging Face tokenizers split "<s>" out of a document as BOS even without special tokens
    (the stdlib corpus has regexes with (?P<s>...)); here it stays text and round-trips."""
    text = r"regex (?P<s>\d{2}) then </s> and <pad>."
    ids = small_bpe.encode(text)
    assert not {small_bpe.pad_id, small_bpe.bos_id, small_bpe.eos_id} & set(ids)
    assert small_bpe.decode(ids) == text
    small_bpe.save(tmp_path / "tok.json")
    assert BPETokenizer.load(tmp_path / "tok.json").encode(text) == ids


def test_a_directory_of_the_older_format_is_re_encoded_with_its_own_vocabulary(tmp_path):
    """Format 1 wrote "<s>" inside a document as BOS: such a directory is re-encoded in place,
    token files and meta, with its tokenizer.json untouched."""
    docs = invented_docs("s", 3, seed=1)
    docs[1] = Document(docs[1].name, docs[1].text + " (?P<s>12) </s>")
    corpora = {"books": invented_docs("b", 30), "stdlib": docs}
    data = prepare_text_data(tmp_path, vocab_size=300, heldout_percent=20, load=corpora.__getitem__)
    tok = data.tokenizer()
    assert int((np.asarray(data.tokens("stdlib")) == tok.bos_id).sum()) == 3  # one per document
    new_bytes = {split: (data.root / f"{split}.bin").read_bytes() for split in ("books_train", "stdlib")}
    vocab = (data.root / "tokenizer.json").read_bytes()
    old = BPETokenizer.load(data.root / "tokenizer.json")
    old.tokenizer.encode_special_tokens = False  # format 1's encoding
    old_ids = np.concatenate([[old.bos_id, *old.encode(d.text)] for d in docs]).astype(np.uint16)
    old_ids.tofile(data.root / "stdlib.bin")
    meta = json.loads((data.root / "meta.json").read_text())
    meta["format"], meta["splits"]["stdlib"]["tokens"] = 1, len(old_ids)
    (data.root / "meta.json").write_text(json.dumps(meta))
    assert int((old_ids == tok.bos_id).sum()) == 4 and int((old_ids == tok.eos_id).sum()) == 1
    again = prepare_text_data(tmp_path, vocab_size=300, heldout_percent=20, load=corpora.__getitem__)
    for split, content in new_bytes.items():
        assert (again.root / f"{split}.bin").read_bytes() == content, split
    assert (again.root / "tokenizer.json").read_bytes() == vocab
    meta = json.loads((again.root / "meta.json").read_text())
    assert meta["format"] == 2 and meta["splits"]["stdlib"]["tokens"] == len(new_bytes["stdlib"]) // 2
    assert not list(again.root.glob("*.tmp-*"))
    (again.root / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(RuntimeError, match="lacks its documents.*delete that directory"):
        prepare_text_data(tmp_path, vocab_size=300, heldout_percent=20,
                          load={"books": invented_docs("b", 30), "stdlib": []}.__getitem__)
