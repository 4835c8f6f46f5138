"""A gpu-check window as one archive: packed on the device (``--pack``), unpacked into
results/gpu-check/ here (``--unpack``; never over a committed window unless it continues it), and
the steps a cut-off window left (``--continue``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
from pathlib import Path


def pending_steps(summary: dict) -> list[str]:
    """The planned steps a continuation runs: those without an outcome, and those --budget cut."""
    finished = {o["name"] for o in summary["outcomes"] if not o.get("budget_cut")}
    return [name for name in summary["planned"] if name not in finished]


def read_window(window: Path) -> dict:
    path = window / "summary.json"
    if not path.is_file():
        raise SystemExit(f"{window}: no summary.json; --continue takes a window folder that gpu_check wrote")
    summary = json.loads(path.read_text())
    if "calls" not in summary or "code" not in summary["environment"]:
        raise SystemExit(f"{window}: written before windows could be continued (no plan or no code digest); "
                         f"run make gpu-check afresh")
    return summary


WINDOW_NAME = re.compile(r"\d{8}-\d{6}")


def pack_window(window: Path, archive: Path) -> None:
    """The window's record (summary, logs, tables) as one gzipped tar at ``archive``, replaced
    whole: a device tool that brings back few files and shallow folders gets all of it."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(window, arcname=window.name)
    os.replace(partial, archive)


def _not_a_continuation(old: Path, tar: tarfile.TarFile, top: str) -> str | None:
    """Why the packed window ``top`` does not continue the window ``old`` (None when it does:
    same run and plan, more calls, every finished outcome kept, every file kept byte for byte,
    at its place or where the continuation set it aside)."""
    def member(name: str) -> bytes | None:
        try:
            f = tar.extractfile(f"{top}/{name}")
        except KeyError:
            return None
        return None if f is None else f.read()

    was, now = json.loads((old / "summary.json").read_text()), json.loads(member("summary.json") or b"{}")
    calls = now.get("calls") or []
    if not was.get("calls") or calls[:len(was["calls"])] != was["calls"] or len(calls) <= len(was["calls"]):
        return "it is not a later call of the same window"
    if now.get("environment") != was.get("environment") or now.get("planned") != was.get("planned"):
        return "its machine, code or plan differ"
    kept = now.get("outcomes", []) + now.get("superseded", [])
    if any(o not in kept for o in was["outcomes"]):
        return "an outcome of the committed window is missing from it"
    for path in sorted(p for p in old.rglob("*") if p.is_file()):
        rel = path.relative_to(old).as_posix()
        if rel in ("summary.json", "summary.md"):
            continue
        place = rel
        for call in calls[len(was["calls"]):]:  # each later call's moves, in order
            moved = call.get("moved", {})
            place = next((moved[k] + place[len(k):] for k in moved if place == k or place.startswith(k + "/")), place)
        if member(place) != path.read_bytes():
            return f"{rel} is not in it as committed"
    return None


def unpack_window(archive: Path, records: Path) -> Path:
    """Extract a window packed by ``pack_window`` into ``records/<time>/`` and return that folder.
    Refuses an archive that is not one window with its summary.json, and a window already in
    ``records`` (records are never overwritten) unless the archive is that window continued
    (``--continue``), which then replaces it: it holds every file of it."""
    if not archive.is_file():
        raise SystemExit(f"{archive}: no such file; pass the <time>.tar.gz that gpu_check --pack wrote")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tops = {Path(n).parts[0] for n in names}
        top = tops.pop() if len(tops) == 1 else ""
        if not WINDOW_NAME.fullmatch(top) or f"{top}/summary.json" not in names:
            raise SystemExit(f"{archive}: not one gpu-check window (<time>/summary.json); "
                             f"pack one with python -m pipelines.gpu_check --pack DIR")
        target = records / top
        if not target.exists():
            records.mkdir(parents=True, exist_ok=True)
            tar.extractall(records, filter="data")  # no absolute paths, no links out, no devices
            return target
        why = _not_a_continuation(target, tar, top) if (target / "summary.json").is_file() else "no summary there"
        if why is not None:
            raise SystemExit(f"{target} exists and {archive} does not continue it ({why}): a committed window "
                             f"is never overwritten; compare them by hand")
        incoming = records / f".{top}.incoming"
        shutil.rmtree(incoming, ignore_errors=True)
        incoming.mkdir()
        tar.extractall(incoming, filter="data")
    old = records / f".{top}.replaced"
    target.rename(old)
    (incoming / top).rename(target)
    shutil.rmtree(old)
    incoming.rmdir()
    return target
