"""Read an offline W&B run the way `wandb sync` would: the records of its .wandb file (a LevelDB
log of protobuf Records) and its files/ folder, so tests check what W&B will show."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32768, 7  # LevelDB log blocks; each chunk: crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)  # ident, magic, version


def records(path: Path) -> list[Any]:
    """Every Record in a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:HEADER] == FILE_HEADER, f"{path} is not a W&B run file"
    out, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # the rest of a block too small for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += BLOCK - pos % BLOCK
            continue
        if pos + HEADER + length > len(data):  # cut off mid-record (a writer still flushing or killed)
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def _items(update: Any) -> dict[str, Any]:
    """A config/summary/history update as a dict (nested keys become nested dicts)."""
    out: dict[str, Any] = {}
    for item in update:
        *parents, last = list(item.nested_key) or [item.key]
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = json.loads(item.value_json)
    return out


@dataclass
class OfflineRun:
    """What one offline W&B run folder holds, decoded."""

    folder: Path
    run_id: str = ""
    group: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)  # the last value of every key
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # None: the run ended without an exit record

    def table(self, key: str) -> dict[str, Any]:
        """The last wandb.Table logged under ``key``: {"columns": [...], "data": [[...]]}."""
        ref = next(h[key] for h in reversed(self.history) if key in h)
        assert ref["_type"] == "table-file", ref
        return json.loads((self.folder / "files" / ref["path"]).read_text())

    def image(self, key: str) -> Path:
        ref = next(h[key] for h in reversed(self.history) if key in h)
        assert ref["_type"] == "image-file", ref
        return self.folder / "files" / ref["path"]


def read_offline_run(folder: Path, wait_s: float = 15.0) -> OfflineRun:
    """The run's records; waits up to ``wait_s`` for its exit record, because wandb's service
    process may still be writing the file when ``wandb.finish()`` has returned."""
    deadline = time.monotonic() + wait_s
    while True:
        run = _read(folder)
        if run.exit_code is not None or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _read(folder: Path) -> OfflineRun:
    (path,) = folder.glob("run-*.wandb")
    run = OfflineRun(folder)
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.group, run.name = rec.run.run_id, rec.run.run_group, rec.run.display_name
            run.config.update(_items(rec.run.config.update))
        elif kind == "config":
            run.config.update(_items(rec.config.update))
        elif kind == "history":
            run.history.append(_items(rec.history.item))
        elif kind == "summary":
            run.summary.update(_items(rec.summary.update))
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    return run


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """The offline W&B runs under a run directory, oldest first."""
    return [read_offline_run(p) for p in sorted((run_dir / "wandb").glob("offline-run-*"))]
