"""Find and load run directories (never W&B).

A run directory is ``<runs>/<experiment...>/<pe>/<seed>/<time>-<id>[-<job>]/`` (for example
``runs/addition/cpu/tape/0/20261122-205210-0835a8-0/``) holding ``command.txt``, ``config.yaml``
and, once the run finished, ``metrics.json``. A run without ``metrics.json`` is unfinished: it
is listed as such and never contributes a number. Evaluations of a run live in
``<run>/eval/<time>-<id>/`` with the same files; the run's own ``metrics.json`` wins, and the
newest evaluation only fills metrics the run does not have (a run trained with evaluate=false).
``runs/multirun/`` (Hydra's sweep records), ``runs/*/models/`` (stored models) and anything
under ``wandb/`` are never read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from tape.report.settings import setting_values

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: the same documents, parsed about ten
times faster (the report reads every record's config.yaml)."""

RUN_NAME = re.compile(r"^\d{8}-\d{6}-[0-9a-f]+(-\d+)?$")
SKIP_DIRS = {"multirun", "models", "wandb", "eval", "checkpoints", "csv", ".hydra"}


@dataclass
class Run:
    """One run directory and what it recorded."""

    path: Path
    experiment: str  # e.g. "addition/cpu" (from metrics.json, else the path)
    pe: str
    seed: int
    metrics: dict[str, Any] | None  # None: unfinished
    command: str = ""  # the job command (first line of command.txt)
    launched_as: str = ""
    commit: str = ""
    started: str = ""  # "# time:" of command.txt
    machine: str = ""  # "# machine:" of command.txt ("" for runs made before it was recorded)
    threads: str = ""  # "# threads:" of command.txt: torch's CPU threads ("" before 2026-11-26)
    metric_sources: dict[str, str] = field(default_factory=dict)  # key -> "run" | eval dir name
    _config: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _setting: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.metrics is not None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def family(self) -> str:
        """The experiment's first part: "addition" for "addition/cpu"."""
        return self.experiment.split("/")[0]

    @property
    def scale(self) -> str:
        """metrics.json ``scale``, else config.yaml ``scale``, else the experiment's second part
        (``addition/cpu`` -> cpu; ``scrolls/cpu/qasper`` -> cpu)."""
        if self.metrics and self.metrics.get("scale"):
            return str(self.metrics["scale"])
        if self.config().get("scale"):
            return str(self.config()["scale"])
        parts = self.experiment.split("/")
        return parts[1] if len(parts) > 1 else parts[0]

    @property
    def task(self) -> str:
        if self.metrics and self.metrics.get("task"):
            return str(self.metrics["task"])
        return str((self.config().get("task") or {}).get("name", self.family))

    @property
    def method(self) -> str:
        """The row a run belongs to: its ``pe``, or ``"<pe> [pe.<option>=<value>]"`` when one of
        its PE options makes another published method (tape.pe ``variants``: FoX's CABLE gate)."""
        import tape.pe as pe_registry

        options = self.config().get("pe") or {}
        for option, value in options.items() if isinstance(options, dict) else ():
            if pe_registry.variant(self.pe, option, value):
                return f"{self.pe} [pe.{option}={value}]"
        return self.pe

    @property
    def variant(self) -> bool:
        """A run of our own variant of a protocol, kept out of the paper-style tables: context
        extension with passkey rows mixed into the extension (``extend.passkey_rows > 0``)."""
        return bool((self.config().get("extend") or {}).get("passkey_rows"))

    def config(self) -> dict[str, Any]:
        """The resolved config.yaml ({} when missing or unreadable); read once."""
        if self._config is None:
            try:
                loaded = yaml.load((self.path / "config.yaml").read_text(), Loader=YAML_LOADER)
            except (OSError, yaml.YAMLError):
                loaded = {}
            self._config = loaded if isinstance(loaded, dict) else {}
        return self._config

    def setting(self) -> dict[str, Any]:
        """The flattened config minus the keys that never change a run (tape.report.settings);
        computed once: grouping compares it with every other run's."""
        if self._setting is None:
            self._setting = setting_values(self.config())
        return self._setting


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def read_command(path: Path) -> dict[str, str]:
    """command.txt: the job command on the first line, then ``# key: value`` lines."""
    out = {"command": "", "launched_as": "", "commit": "", "time": "", "machine": "", "threads": "", "versions": ""}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    if lines and not lines[0].startswith("#"):
        out["command"] = lines[0].strip()
    for line in lines:
        key, sep, value = line.lstrip("# ").partition(": ")
        if line.startswith("#") and sep and key.replace(" ", "_") in out:
            out[key.replace(" ", "_")] = value.strip()
    return out


def _merged_metrics(run_dir: Path) -> tuple[dict[str, Any] | None, dict[str, str]]:
    own = _read_json(run_dir / "metrics.json")
    if own is None:
        return None, {}
    sources = {k: "run" for k in own}
    evals = sorted(p for p in (run_dir / "eval").glob("*") if (p / "metrics.json").is_file())
    if evals:
        newest = _read_json(evals[-1] / "metrics.json") or {}
        for key, value in newest.items():
            if key not in own:
                own[key] = value
                sources[key] = f"eval/{evals[-1].name}"
    return own, sources


def load_run(run_dir: Path, runs_root: Path) -> Run:
    """The run at ``run_dir``; experiment, pe and seed from metrics.json, else from the path."""
    parts = run_dir.relative_to(runs_root).parts
    metrics, sources = _merged_metrics(run_dir)
    cmd = read_command(run_dir / "command.txt")
    m = metrics or {}
    try:
        seed = int(m.get("seed", parts[-2]))
    except (TypeError, ValueError):
        seed = -1
    return Run(
        path=run_dir,
        experiment=str(m.get("experiment") or "/".join(parts[:-3])),
        pe=str(m.get("pe") or parts[-3]),
        seed=seed,
        metrics=metrics,
        command=cmd["command"],
        launched_as=cmd["launched_as"],
        commit=cmd["commit"],
        started=cmd["time"],
        machine=cmd["machine"],
        threads=cmd["threads"],
        metric_sources=sources,
    )


def _claimed(run_dir: Path) -> bool:
    """Whether a run ever claimed this directory (command.txt, or metrics.json from before
    command.txt was written). A directory left by a try that failed its checks is no run."""
    return (run_dir / "command.txt").is_file() or (run_dir / "metrics.json").is_file()


def find_runs(runs_root: str | Path, under: str | None = None) -> list[Run]:
    """Every run directory under ``runs_root`` (finished or not), sorted by path; with ``under``
    (e.g. ``pretrain/cpu/tape/0``), only those in that folder of it."""
    root = Path(runs_root)
    start = root / under if under else root
    if not start.is_dir():
        return []
    found: list[Run] = []
    stack = [start]
    while stack:
        here = stack.pop()
        for child in sorted(p for p in here.iterdir() if p.is_dir()):
            if child.name in SKIP_DIRS:
                continue
            rel = child.relative_to(root).parts
            if RUN_NAME.match(child.name) and len(rel) >= 4:
                if _claimed(child):
                    found.append(load_run(child, root))
            else:
                stack.append(child)
    return sorted(found, key=lambda r: str(r.path))


def latest_finished(runs: Iterable[Run]) -> dict[tuple[str, str, int], Run]:
    """The newest finished run per (experiment, pe, seed), variants left out; run names start
    with their time."""
    best: dict[tuple[str, str, int], Run] = {}
    for run in runs:
        key = (run.experiment, run.pe, run.seed)
        if run.finished and not run.variant and (key not in best or run.name > best[key].name):
            best[key] = run
    return best


def is_finished(runs: Iterable[Run], experiment: str, pe: str, seed: int) -> bool:
    """Whether some run of this experiment, PE and seed has a metrics.json."""
    return (experiment, pe, seed) in latest_finished(runs)
