"""Result files a task writes once and never overwrites: metrics.json and tidy CSVs."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any, Sequence

Row = dict[str, Any]


def write_json_once(path: Path, values: dict[str, Any]) -> None:
    """Write JSON to a new file; an existing file is an error, never overwritten."""
    with open(path, "x") as f:
        json.dump(values, f, indent=2, sort_keys=True)
        f.write("\n")


def write_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str], path: Path) -> None:
    """A new CSV file (never overwritten) with ``fields`` as columns: a task's tidy results."""
    with open(path, "x", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def keep_earlier(paths: Sequence[Path]) -> None:
    """Rename files about to be replaced to ``<stem>-<time of the first>.<suffix>``, so that a
    new result (the benchmark's efficiency.{json,md} pair) never overwrites an earlier one."""
    present = [p for p in paths if p.is_file()]
    if not present:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(present[0].stat().st_mtime))
    tag, n = stamp, 1
    while any(p.with_name(f"{p.stem}-{tag}{p.suffix}").exists() for p in present):
        tag, n = f"{stamp}-{n}", n + 1  # kept twice in one second: never rename onto a kept file
    for old in present:
        old.rename(old.with_name(f"{old.stem}-{tag}{old.suffix}"))


def _number(text: str) -> Any:
    """A CSV cell as int or float where it is one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_csv_rows(path: Path) -> list[Row]:
    with open(path, newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def read_jsonl_rows(path: Path) -> list[Row]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
