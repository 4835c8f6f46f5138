"""The suite's own environment handling (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import absolute_pythonpath


def test_relative_pythonpath_entries_become_absolute_and_others_stay(tmp_path: Path) -> None:
    value = os.pathsep.join([".", "/opt/site", "", "lib/sub"])
    parts = absolute_pythonpath(value, tmp_path).split(os.pathsep)
    assert parts == [str(tmp_path.resolve()), "/opt/site", "", str((tmp_path / "lib/sub").resolve())]


def test_this_sessions_pythonpath_holds_no_relative_entry() -> None:
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    assert all(os.path.isabs(p) for p in entries), entries
