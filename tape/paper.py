"""The paper's numbers: one loader for conf/paper_numbers.yaml, which the report, the benchmark
and the claims read (nothing else in the code restates a number of the paper)."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml

PAPER_NUMBERS_FILE = Path(__file__).resolve().parents[1] / "conf" / "paper_numbers.yaml"


@cache
def load_paper_numbers() -> dict[str, Any]:
    """The whole of conf/paper_numbers.yaml (shared: callers must not change it; see
    :func:`paper_number` for a copy)."""
    return yaml.safe_load(PAPER_NUMBERS_FILE.read_text())


def paper_number(key: str) -> Any:
    """A copy of the entry at dotted ``key`` ("addition.fig2.values.tape"; a list item by its
    index, "ablation.table6.values.tape.0"); a KeyError naming the key when there is none."""
    node: Any = load_paper_numbers()
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(f"{key!r}: {PAPER_NUMBERS_FILE.name} has no {part!r} there")
    return copy.deepcopy(node)
