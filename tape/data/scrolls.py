"""SCROLLS data (tape-spec D.2): loaders, task metadata, and the paper's formatting and truncation.

Seven tasks: qasper, contract_nli, narrative_qa, quality (QA/NLI) and qmsum, summ_screen_fd,
gov_report (summarisation). Every row has the fields ``id, pid, input, output``; the QA tasks put
the question in front of the document inside ``input``. Validation has one row per reference
output, so several rows share an id: :func:`group_references` collapses them for scoring.

Data comes from one of two places, never from anywhere else (there is no fake-data fallback):

* ``data_dir`` (Hydra key ``task.data_dir``): local JSONL files ``<data_dir>/<task>/<split>.jsonl``.
  This is exactly the layout inside the hub's ``<task>.zip``, so unzipping the hub files into
  ``data_dir`` gives a working offline copy.
* the Hugging Face hub ``tau/scrolls``: current ``datasets`` no longer runs its loading script, so
  we download the data file ``<task>.zip`` itself (``huggingface_hub``, cached, works offline once
  cached), extract ``<task>/<split>.jsonl`` and read those with the ``json`` builder.

Formatting follows the official ``finetune_scrolls.py`` / ``generate_scrolls.py`` with every
length a parameter (:class:`Lengths`) so a CPU run can scale them down:

* QA/NLI: the input cut to its first 20,000 words (generation: 15,000), tokenised with BOS, cut to
  7,991 tokens; then the answer (<= 200 tokens) and EOS.
* summaries: ``"Context:\\n" + input + "\\n Please summarize this report:"`` tokenised with BOS;
  when longer than 7,184 + 7 tokens, its first 7,184 tokens plus its last 7 (the instruction);
  then the summary (<= 1,000 tokens) and EOS.
* the loss covers the answer and EOS only (labels IGNORE_INDEX elsewhere); rows are right-padded
  to ``seq_len`` (8,192).

Where we deliberately differ from the official code:

1. It tokenised prompt and answer separately with a tokenizer that adds BOS to each, so a row was
   ``<s> prompt <s> answer </s>`` and the model learned to emit ``<s>`` before every answer (which
   ``skip_special_tokens`` then hid). We also encode prompt and answer separately (the boundary
   must not depend on how the tokenizer merges across it), but put one BOS at the start of the row
   and none before the answer: training rows then continue exactly like generation prompts, and a
   mid-sequence BOS (a "new document" marker in pretraining) never sits between question and
   answer. The answer budget (200 / 1,000) therefore holds answer tokens only, where the official
   one included that BOS; the total length is unchanged.
2. Official summaries took ``ids[:7184] + ids[-7:]`` unconditionally, which repeats the last 7
   tokens (the instruction) in every prompt shorter than 7,191 tokens. We keep a short prompt whole
   and cut only prompts that are longer than head + tail, where both forms agree.
3. A "word" is a run between single spaces (``text.split(" ")``), as the official code cut it, so
   the cut is an exact prefix of the input and newlines inside the text survive.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from tape.data.hub import hub_usable
from tape.data.labels import IGNORE_INDEX
from tape.optional import require

if TYPE_CHECKING:  # datasets is imported lazily: it is slow to import and only the loaders use it
    from datasets import DatasetDict

HUB_REPO = "tau/scrolls"
HUB_REVISION = "main"  # pin a full commit sha here once one has been checked against the paper
FIELDS = ("id", "pid", "input", "output")
SPLITS = ("train", "validation", "test")

SUMMARY_PREFIX = "Context:\n"
SUMMARY_SUFFIX = "\n Please summarize this report:"


def suffix_tokens(encode: Callable[[str], list[int]]) -> int:
    """Tokens of SUMMARY_SUFFIX where it ends a prompt (Llama-2: 7). Counted after a character:
    encoded alone, a SentencePiece tokenizer puts a lone '▁' before its newline (8)."""
    return len(encode("." + SUMMARY_SUFFIX)) - len(encode("."))


@dataclass(frozen=True)
class GenerationSettings:
    """How the paper decoded a task: greedy for QA/NLI, seeded sampling for summaries."""

    max_new_tokens: int
    do_sample: bool
    top_k: int | None = None
    top_p: float | None = None


@dataclass(frozen=True)
class ScrollsTask:
    """One SCROLLS task: its format (``qa`` covers NLI too), its metric and Table 1 column."""

    name: str
    kind: str  # "qa" or "summary"
    metric: str  # "f1", "exact_match" or "rouge" (ROUGE-1/2/L and their geometric mean)
    column: str  # the paper's Table 1 header
    generation: GenerationSettings

    @property
    def is_summary(self) -> bool:
        return self.kind == "summary"


GREEDY = GenerationSettings(max_new_tokens=200, do_sample=False)
# GovReport: the paper's generate(do_sample=True, top_p=1) also applied Hugging Face's default
# top_k=50 (GenerationConfig), so it sampled among the 50 likeliest tokens: so does ours.
SAMPLE_TOP_P1 = GenerationSettings(max_new_tokens=1000, do_sample=True, top_k=50, top_p=1.0)
SAMPLE_TOP_K3 = GenerationSettings(max_new_tokens=1000, do_sample=True, top_k=3)

# In the column order of the paper's Table 1.
TASKS: dict[str, ScrollsTask] = {
    t.name: t
    for t in (
        ScrollsTask("qasper", "qa", "f1", "QAS", GREEDY),
        ScrollsTask("contract_nli", "qa", "exact_match", "CNLI", GREEDY),
        ScrollsTask("narrative_qa", "qa", "f1", "NQA", GREEDY),
        ScrollsTask("quality", "qa", "exact_match", "QuAL", GREEDY),
        ScrollsTask("qmsum", "summary", "rouge", "QMS", SAMPLE_TOP_K3),
        ScrollsTask("summ_screen_fd", "summary", "rouge", "SumS", SAMPLE_TOP_K3),
        ScrollsTask("gov_report", "summary", "rouge", "GovR", SAMPLE_TOP_P1),
    )
}


def get_task(name: str) -> ScrollsTask:
    """The task called ``name``, or a ValueError listing the seven names."""
    if name not in TASKS:
        raise ValueError(f"unknown SCROLLS task {name!r}: expected one of {', '.join(TASKS)}")
    return TASKS[name]


@dataclass(frozen=True)
class Lengths:
    """Every cut in tape-spec D.2 (defaults: the paper's); scale them down for CPU runs."""

    words: int = 20_000  # QA/NLI training prompt: first N words of the input
    generate_words: int = 15_000  # QA/NLI generation prompt
    qa_prompt: int = 7_991  # QA/NLI prompt tokens, BOS included
    qa_answer: int = 200  # answer tokens, EOS not included
    summary_head: int = 7_184  # summary prompt tokens kept from the start, BOS included
    summary_tail: int = 7  # ... and from the end: the instruction's length under the tokenizer
    summary_answer: int = 1_000
    seq_len: int = 8_192  # every training row is right-padded to this

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < (0 if name == "summary_tail" else 1):
                raise ValueError(f"Lengths.{name}={value} must be positive")
        qa = self.qa_prompt + self.qa_answer + 1
        summary = self.summary_head + self.summary_tail + self.summary_answer + 1
        if max(qa, summary) > self.seq_len:
            raise ValueError(
                f"Lengths.seq_len={self.seq_len} is shorter than the longest row: QA "
                f"qa_prompt + qa_answer + 1 = {qa}, summary summary_head + summary_tail + "
                f"summary_answer + 1 = {summary}; raise seq_len or lower the others"
            )


PAPER_LENGTHS = Lengths()

Encode = Callable[[str], Sequence[int]]  # text -> token ids, without any special tokens


def cut_words(text: str, n: int) -> str:
    """The first ``n`` space-separated words of ``text``: an exact prefix, newlines kept."""
    return " ".join(text.split(" ")[:n])


def keep_ends(ids: Sequence[int], head: int, tail: int) -> list[int]:
    """``ids`` whole if it fits in head + tail tokens, else its first ``head`` and last ``tail``."""
    ids = list(ids)
    if len(ids) <= head + tail:
        return ids
    return ids[:head] + (ids[-tail:] if tail else [])


def _with_bos(ids: Sequence[int], bos_id: int | None) -> list[int]:
    return ([] if bos_id is None else [bos_id]) + list(ids)


def prompt_ids(
    task: str | ScrollsTask,
    text: str,
    encode: Encode,
    bos_id: int | None,
    lengths: Lengths = PAPER_LENGTHS,
    generation: bool = False,
) -> list[int]:
    """The prompt for one input: BOS + the cut input (QA/NLI) or the cut summary prompt."""
    task = task if isinstance(task, ScrollsTask) else get_task(task)
    if task.is_summary:
        ids = _with_bos(encode(SUMMARY_PREFIX + text + SUMMARY_SUFFIX), bos_id)
        return keep_ends(ids, lengths.summary_head, lengths.summary_tail)
    words = lengths.generate_words if generation else lengths.words
    return _with_bos(encode(cut_words(text, words)), bos_id)[: lengths.qa_prompt]


def answer_ids(
    task: str | ScrollsTask,
    output: str,
    encode: Encode,
    eos_id: int,
    lengths: Lengths = PAPER_LENGTHS,
    answer_prefix: str = "",
) -> list[int]:
    """The target: the output's first qa_answer / summary_answer tokens, then EOS."""
    task = task if isinstance(task, ScrollsTask) else get_task(task)
    limit = lengths.summary_answer if task.is_summary else lengths.qa_answer
    return list(encode(answer_prefix + output))[:limit] + [eos_id]


def training_row(
    task: str | ScrollsTask,
    text: str,
    output: str | None,
    encode: Encode,
    *,
    bos_id: int | None,
    eos_id: int,
    pad_id: int,
    lengths: Lengths = PAPER_LENGTHS,
    answer_prefix: str = "",
) -> dict[str, list[int]]:
    """One fine-tuning row of exactly ``seq_len`` tokens: input_ids, labels (the answer and EOS,
    IGNORE_INDEX elsewhere) and attention_mask (0 on the right padding)."""
    if output is None:
        raise ValueError("this row has no output (test split?): it cannot be a training row")
    prompt = prompt_ids(task, text, encode, bos_id, lengths)
    answer = answer_ids(task, output, encode, eos_id, lengths, answer_prefix)
    ids = prompt + answer
    pad = lengths.seq_len - len(ids)
    return {
        "input_ids": ids + [pad_id] * pad,
        "labels": [IGNORE_INDEX] * len(prompt) + answer + [IGNORE_INDEX] * pad,
        "attention_mask": [1] * len(ids) + [0] * pad,
    }


def collate(rows: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, Tensor]:
    """Stack equal-length rows from :func:`training_row` into (B, seq_len) int64 tensors."""
    keys = ("input_ids", "labels", "attention_mask")
    return {k: torch.tensor([list(r[k]) for r in rows], dtype=torch.long) for k in keys}


@dataclass(frozen=True)
class ScrollsExample:
    """One evaluation example: an input and all its reference outputs (one row per reference)."""

    id: str
    pid: str
    input: str
    outputs: tuple[str, ...]


def group_references(rows: Iterable[Mapping[str, object]]) -> list[ScrollsExample]:
    """Collapse rows that share an id into one example with every output, in first-seen order."""
    first: dict[str, Mapping[str, object]] = {}
    outputs: dict[str, list[str]] = {}
    for row in rows:
        id_ = str(row["id"])
        if id_ not in first:
            first[id_], outputs[id_] = row, []
        if row["output"] is not None:
            outputs[id_].append(str(row["output"]))
    return [
        ScrollsExample(id_, str(row["pid"]), str(row["input"]), tuple(outputs[id_]))
        for id_, row in first.items()
    ]


def references(rows: Iterable[Mapping[str, object]]) -> dict[str, list[str]]:
    """``{id: [reference outputs]}`` for scoring predictions."""
    return {ex.id: list(ex.outputs) for ex in group_references(rows)}


class ScrollsDataError(FileNotFoundError):
    """SCROLLS data is not available (no local files, and the hub cannot be reached)."""


def _unavailable(task: str, reason: str) -> ScrollsDataError:
    return ScrollsDataError(
        f"SCROLLS task {task!r}: no data. {reason}\n"
        f"SCROLLS needs {HUB_REPO} from the Hugging Face hub or local JSONL files; nothing is "
        f"made up in their place. Fix one of:\n"
        f"  - set task.data_dir (Hydra key; argument data_dir) to a folder holding "
        f"{task}/{{train,validation}}.jsonl with the fields {', '.join(FIELDS)} (unzip "
        f"{task}.zip from https://huggingface.co/datasets/{HUB_REPO} into that folder);\n"
        f"  - or leave task.data_dir unset and give this machine access to the hub (or a hub "
        f"cache that already holds {HUB_REPO}/{task}.zip)."
    )


def local_files(task: str, data_dir: str | os.PathLike, splits: Sequence[str]) -> dict[str, Path]:
    """``{split: <data_dir>/<task>/<split>.jsonl}``, or ScrollsDataError naming what is missing."""
    files = {s: Path(data_dir) / task / f"{s}.jsonl" for s in splits}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise _unavailable(task, f"task.data_dir={str(data_dir)!r} lacks {', '.join(missing)}.")
    empty = [str(p) for p in files.values() if p.stat().st_size == 0]
    if empty:  # an interrupted unzip: the json reader would fail with a bare StopIteration
        raise _unavailable(task, f"task.data_dir={str(data_dir)!r} has empty {', '.join(empty)}.")
    return files


def extract_members(
    zip_path: Path, task: str, splits: Sequence[str], out_dir: Path
) -> dict[str, Path]:
    """Extract ``<task>/<split>.jsonl`` from a hub zip into ``out_dir`` (skipped when already
    there with the right size); ScrollsDataError if the zip lacks a member."""
    files: dict[str, Path] = {}
    with zipfile.ZipFile(zip_path) as archive:
        names = set(archive.namelist())
        for split in splits:
            member = f"{task}/{split}.jsonl"
            if member not in names:
                raise _unavailable(task, f"{zip_path} has no {member} (it holds {sorted(names)}).")
            target = out_dir / member
            size = archive.getinfo(member).file_size
            if not (target.is_file() and target.stat().st_size == size):
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(".partial")
                with archive.open(member) as src, open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                partial.replace(target)
            files[split] = target
    return files


def hub_files(
    task: str,
    splits: Sequence[str],
    revision: str = HUB_REVISION,
    hub_cache_dir: str | os.PathLike | None = None,
    extract_dir: str | os.PathLike | None = None,
) -> dict[str, Path]:
    """Download ``<task>.zip`` from tau/scrolls (offline or unreachable: take it from the hub
    cache) and extract the splits; ScrollsDataError at once when neither has it."""
    import huggingface_hub

    online = hub_usable()
    try:
        zip_path = Path(
            huggingface_hub.hf_hub_download(
                HUB_REPO, f"{task}.zip", repo_type="dataset", revision=revision,
                cache_dir=hub_cache_dir, local_files_only=not online,
            )
        )
    except Exception as err:  # not cached, or a hub error: either way there is no data
        where = "" if online else " (offline or hub unreachable: only the hub cache was checked)"
        raise _unavailable(
            task, f"Could not fetch {HUB_REPO}/{task}.zip@{revision}{where}: "
            f"{type(err).__name__}: {err}"
        ) from err
    if extract_dir is None:
        datasets = require("datasets", "reading SCROLLS")
        extract_dir = Path(datasets.config.HF_DATASETS_CACHE) / "tape_scrolls"
    # The hub cache names the snapshot folder after the commit: one extracted copy per revision.
    return extract_members(zip_path, task, splits, Path(extract_dir) / zip_path.parent.name)


def load_scrolls(
    task: str,
    data_dir: str | os.PathLike | None = None,
    splits: Sequence[str] = ("train", "validation"),
    *,
    revision: str = HUB_REVISION,
    cache_dir: str | os.PathLike | None = None,
    hub_cache_dir: str | os.PathLike | None = None,
) -> "DatasetDict":
    """The raw rows (``id, pid, input, output``) of ``splits``: from ``data_dir`` when given,
    else from the hub; ScrollsDataError (never fake data) when neither has them. ``cache_dir``
    holds the Arrow cache (and extracted hub files); ``hub_cache_dir`` the downloaded zips."""
    get_task(task)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown SCROLLS split(s) {unknown}: expected some of {SPLITS}")
    if data_dir is not None and str(data_dir) != "":
        files = local_files(task, data_dir, splits)
    else:
        extract_dir = None if cache_dir is None else Path(cache_dir) / "tape_scrolls"
        files = hub_files(task, splits, revision, hub_cache_dir, extract_dir)

    datasets = require("datasets", "reading SCROLLS")
    data = datasets.load_dataset(
        "json", data_files={s: str(p) for s, p in files.items()},
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    for split, ds in data.items():
        lacking = [f for f in FIELDS if f not in ds.column_names]
        if lacking:
            raise ScrollsDataError(
                f"SCROLLS task {task!r}: {files[split]} lacks the field(s) {lacking}; every row "
                f"needs {', '.join(FIELDS)}"
            )
    return data
