"""Result files a task writes once and never overwrites: metrics.json and tidy CSVs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence


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
