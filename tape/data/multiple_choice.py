"""Multiple-choice benchmarks (MMLU, ARC-Challenge, ARC-Easy; the paper's Table 9): items from
local JSONL files and the prompts that score them.

Layout: ``<data_dir>/<benchmark>/test.jsonl`` (the scored items) and, for few-shot prompts,
``<data_dir>/<benchmark>/fewshot.jsonl``; one item per line: ``question``, ``choices`` (a list of
strings), ``answer`` (0-based index or letter) and, for MMLU, ``subject``. ``python -m
tape.data.multiple_choice --out data/multiple_choice`` writes them from the Hugging Face hub
(``cais/mmlu``, ``allenai/ai2_arc``; needs ``datasets`` and a network).

The prompts follow lm-evaluation-harness's documented formats: MMLU asks for a letter after the
lettered choices under a subject header; ARC scores each choice's text after "Answer:".
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

LETTERS = "ABCDEFGHIJ"
BENCHMARKS = ("mmlu", "arc_challenge", "arc_easy")

# MMLU's 57 subjects in the four groups Table 9 reports (lm-evaluation-harness's grouping)
MMLU_GROUPS: Mapping[str, tuple[str, ...]] = {
    "humanities": (
        "formal_logic", "high_school_european_history", "high_school_us_history",
        "high_school_world_history", "international_law", "jurisprudence", "logical_fallacies",
        "moral_disputes", "moral_scenarios", "philosophy", "prehistory", "professional_law",
        "world_religions"),
    "social_sciences": (
        "econometrics", "high_school_geography", "high_school_government_and_politics",
        "high_school_macroeconomics", "high_school_microeconomics", "high_school_psychology",
        "human_sexuality", "professional_psychology", "public_relations", "security_studies",
        "sociology", "us_foreign_policy"),
    "stem": (
        "abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry",
        "college_computer_science", "college_mathematics", "college_physics", "computer_security",
        "conceptual_physics", "electrical_engineering", "elementary_mathematics",
        "high_school_biology", "high_school_chemistry", "high_school_computer_science",
        "high_school_mathematics", "high_school_physics", "high_school_statistics",
        "machine_learning"),
    "other": (
        "business_ethics", "clinical_knowledge", "college_medicine", "global_facts", "human_aging",
        "management", "marketing", "medical_genetics", "miscellaneous", "nutrition",
        "professional_accounting", "professional_medicine", "virology"),
}
MMLU_GROUP_OF = {subject: group for group, subjects in MMLU_GROUPS.items() for subject in subjects}


class MultipleChoiceDataError(ValueError):
    """Benchmark files are missing or malformed (the message says which and how to fix it)."""


@dataclass(frozen=True)
class Item:
    """One question: its choices, the index of the right one, and MMLU's subject ("" for ARC)."""

    question: str
    choices: tuple[str, ...]
    answer: int
    subject: str = ""

    @property
    def group(self) -> str:
        """MMLU's group of the subject; "all" elsewhere."""
        return MMLU_GROUP_OF.get(self.subject, "all")


@dataclass(frozen=True)
class Prompt:
    """What is scored: the shared context and one continuation per choice."""

    context: str
    continuations: tuple[str, ...]
    choice_texts: tuple[str, ...]  # the choices themselves (acc_norm divides by their length)


def parse_item(row: Mapping[str, Any], benchmark: str, where: str) -> Item:
    """A JSONL row of ``benchmark`` -> Item; ``where`` (file:line) names a bad row."""
    try:
        question, choices, answer = str(row["question"]), [str(c) for c in row["choices"]], row["answer"]
    except (KeyError, TypeError) as err:
        raise MultipleChoiceDataError(f"{where}: a row needs question, choices (a list) and answer ({err!r})") from None
    if isinstance(answer, str) and not answer.isdigit():
        index = LETTERS.find(answer.strip().upper()) if len(answer.strip()) == 1 else -1
    else:
        index = int(answer)
    if not 0 <= index < len(choices) or len(choices) < 2:
        raise MultipleChoiceDataError(
            f"{where}: answer={answer!r} is not one of the {len(choices)} choices (0-based index or letter)")
    subject = str(row.get("subject") or "")
    if benchmark == "mmlu" and subject not in MMLU_GROUP_OF:
        raise MultipleChoiceDataError(f"{where}: subject={subject!r} is not one of MMLU's 57 subjects "
                                      "(e.g. abstract_algebra)")
    return Item(question, tuple(choices), index, subject)


def benchmark_file(data_dir: str | Path, benchmark: str, split: str) -> Path:
    return Path(data_dir) / benchmark / f"{split}.jsonl"


def read_items(data_dir: str | Path, benchmark: str, split: str = "test") -> list[Item]:
    """The items of ``<data_dir>/<benchmark>/<split>.jsonl``; a missing file says how to get it."""
    if benchmark not in BENCHMARKS:
        raise MultipleChoiceDataError(f"benchmark {benchmark!r}: choose from {', '.join(BENCHMARKS)}")
    path = benchmark_file(data_dir, benchmark, split)
    if not path.is_file():
        raise MultipleChoiceDataError(
            f"{path} not found: write the benchmarks with `python -m tape.data.multiple_choice --out "
            f"{data_dir}` (needs datasets and the Hugging Face hub), or put JSONL files there with "
            "question, choices, answer (and subject for MMLU) per line")
    items = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise MultipleChoiceDataError(f"{path}:{n}: not JSON ({err.msg})") from None
                items.append(parse_item(row, benchmark, f"{path}:{n}"))
    if not items:
        raise MultipleChoiceDataError(f"{path}: no items")
    return items


def _mmlu_question(item: Item) -> str:
    lines = [item.question.strip(), *(f"{LETTERS[i]}. {c}" for i, c in enumerate(item.choices))]
    return "\n".join(lines) + "\nAnswer:"


def _arc_question(item: Item) -> str:
    return f"Question: {item.question}\nAnswer:"


def prompt(benchmark: str, item: Item, shots: Sequence[Item] = ()) -> Prompt:
    """The context (few-shot examples first, each with its answer) and the continuations."""
    if benchmark == "mmlu":
        header = f"The following are multiple choice questions (with answers) about {item.subject.replace('_', ' ')}.\n\n"
        solved = [f"{_mmlu_question(s)} {LETTERS[s.answer]}" for s in shots]
        context = header + "".join(f"{s}\n\n" for s in solved) + _mmlu_question(item)
        continuations = tuple(f" {LETTERS[i]}" for i in range(len(item.choices)))
    else:
        solved = [f"{_arc_question(s)} {s.choices[s.answer]}" for s in shots]
        context = "".join(f"{s}\n\n" for s in solved) + _arc_question(item)
        continuations = tuple(f" {c}" for c in item.choices)
    return Prompt(context, continuations, item.choices)


def shots_for(item: Item, pool: Sequence[Item], k: int) -> list[Item]:
    """The first ``k`` few-shot items (of MMLU's same subject); fewer there is an error."""
    if k == 0:
        return []
    same = [s for s in pool if s.subject == item.subject] if item.subject else list(pool)
    if len(same) < k:
        raise MultipleChoiceDataError(
            f"{k} shots asked, the few-shot file has {len(same)} items"
            + (f" of subject {item.subject!r}" if item.subject else ""))
    return same[:k]


# ----------------------------------------------------------------------------- from the hub
def hub_rows(benchmark: str, split: str) -> Iterable[dict[str, Any]]:
    """The rows of one benchmark split from the hub (``datasets``), in this module's format."""
    from datasets import load_dataset

    if benchmark == "mmlu":
        for row in load_dataset("cais/mmlu", "all", split=split):
            yield {"question": row["question"], "choices": list(row["choices"]), "answer": int(row["answer"]),
                   "subject": row["subject"]}
        return
    name = {"arc_challenge": "ARC-Challenge", "arc_easy": "ARC-Easy"}[benchmark]
    for row in load_dataset("allenai/ai2_arc", name, split=split):
        yield arc_row(row)


def arc_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An ai2_arc row (choices {text, label}, answerKey a letter or digit) in this module's format."""
    labels = list(row["choices"]["label"])
    return {"question": row["question"], "choices": list(row["choices"]["text"]),
            "answer": labels.index(row["answerKey"])}


FEWSHOT_SPLIT = {"mmlu": "dev", "arc_challenge": "train", "arc_easy": "train"}  # the hub split of fewshot.jsonl


def write_benchmarks(out: Path, benchmarks: Sequence[str] = BENCHMARKS) -> list[Path]:
    """Write ``<out>/<benchmark>/{test,fewshot}.jsonl`` from the hub; existing files are kept."""
    from tape.data.hub import hub_usable

    if not hub_usable():
        raise MultipleChoiceDataError("the Hugging Face hub cannot be reached (or HF_HUB_OFFLINE is set): "
                                      "run this where it can, then copy the files")
    written = []
    for benchmark in benchmarks:
        for file, split in (("test", "test"), ("fewshot", FEWSHOT_SPLIT[benchmark])):
            path = benchmark_file(out, benchmark, file)
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".part")
            with open(tmp, "w", encoding="utf-8") as f:
                for row in hub_rows(benchmark, split):
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            tmp.rename(path)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write MMLU / ARC as local JSONL from the Hugging Face hub.")
    parser.add_argument("--out", type=Path, default=Path("data/multiple_choice"))
    parser.add_argument("--benchmarks", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    args = parser.parse_args(argv)
    try:
        for path in write_benchmarks(args.out, args.benchmarks):
            print(f"wrote {path}")
    except MultipleChoiceDataError as err:
        raise SystemExit(str(err)) from None


if __name__ == "__main__":
    main()
