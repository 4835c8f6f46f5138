"""Run the experiments of one profile, then render results/: ``python -m pipelines.reproduce
--profile P`` loads the plan, conf/reproduce/<P>.yaml (pipelines/plan.py; docs/reproduction.md),
finds the runs it still lacks, runs them and renders results/ (a print-only profile, ``paper``,
prints its Hydra multiruns instead, runs nothing and writes nothing). A profile runs the claims
of conf/claims.yaml it names, every arm at the seeds its claim's plan gives it (primary arms
first, seed by seed, so an interrupted reproduction leaves whole pairs), and the paper's tables at
``--seeds``; the profiles are listed below.

A run is finished when a run directory of its experiment / PE / seed, of the setting its step's
command composes (a claim arm's; a table's preset), holds metrics.json, or a committed record
does (``<out>/records``, tape/report/records.py), so an interrupted reproduction, or one in a
fresh clone, continues where it stopped. Each finished run's record is written as soon as its
command returns, and results/ renders from the records. ``--dry-run`` shows the plan and its estimated time, and runs nothing.

``--jobs N`` runs N runs at once, each with cpu_count // N torch threads and its output in
``<runs>/reproduce-logs/``: the small cpu-profile models use a second core poorly, so two
one-thread runs finish sooner than two two-thread runs one after the other. A step waits for
the steps before the one it runs ``after`` (SCROLLS fine-tunes the pretraining runs), and an
``alone`` step (the benchmark; a claim experiment in the profile's ``minutes.alone``, such as
context extension, whose runs use every core well) runs by itself, with every core, after the
other runs of its wave.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from pipelines.plan import Step, bench_dir, load_profile, plan, profiles
from pipelines.presets import is_preset_run, preset_setting
from pipelines.result_files import keep_earlier
from pipelines.run_dirs import live_owner
from tape.report.claim_registry import has_values
from tape.report.render import WouldLoseResults, render
from tape.report.records import RecordConflict, export_all, finished_runs
from tape.report.runs import Run

WANDB_GROUP_VAR = "TAPE_WANDB_GROUP"  # read by conf/logger/wandb.yaml
WANDB_ARM_VAR = "TAPE_WANDB_ARM"  # the same: a claim arm's W&B run name and arm tag


@dataclass
class Outcome:
    """What happened to one step: runs ran / skipped / left, and its wall time."""

    step: Step
    skipped: int = 0
    ran: int = 0
    left: int = 0
    wall_s: float = 0.0
    returncodes: list[int] = field(default_factory=list)
    note: str = ""


# ---------------------------------------------------------------------------- the runs
def publish_benchmark(runs_dir: Path, profile: str, out_dir: Path) -> bool:
    """Copy the profile's benchmark output into ``out_dir`` (the report links it), keeping an
    earlier, different pair there under its time (``keep_earlier``); False when the benchmark
    has not run."""
    src = bench_dir(runs_dir, profile)
    if not (src / "efficiency.json").is_file():
        return False
    out_dir.mkdir(parents=True, exist_ok=True)
    names = ("efficiency.md", "efficiency.json")
    if all((out_dir / n).is_file() and filecmp.cmp(src / n, out_dir / n, shallow=False) for n in names):
        return True  # published already
    keep_earlier([out_dir / "efficiency.json", out_dir / "efficiency.md"])
    for name in names:
        shutil.copy2(src / name, out_dir / name)
    return True


def pending(step: Step, runs: Sequence[Run]) -> list[tuple[str, str, int]]:
    """(experiment, pe, seed) of the step's runs that have not finished (for a step whose runs a
    later one starts from, finished with a checkpoint here: a record holds none)."""
    if step.unavailable or step.done_file is not None:
        return []
    done = {(r.experiment, r.pe, r.seed) for r in runs
            if r.finished and _steps_run(step, r) and (not step.feeds or _has_checkpoint(r))}
    return [(exp, pe, seed) for exp in step.experiments() for pe in step.pes for seed in step.seeds
            if (exp, pe, seed) not in done]


def resumable(step: Step, runs: Sequence[Run]) -> dict[tuple[str, str, int], Path]:
    """{(experiment, pe, seed): run dir} of the step's unfinished runs to resume: the newest of
    each with checkpoints/last.ckpt, no live process training in it, and the step's setting (a
    claim arm's values too). Single-run steps (context extension) and steps that write a file
    start afresh."""
    if step.single or step.done_file is not None or step.entry != "pipelines.train":
        return {}
    found: dict[tuple[str, str, int], Run] = {}
    for r in runs:
        key = (r.experiment, r.pe, r.seed)
        if (r.finished or r.seed not in step.seeds or not _has_checkpoint(r) or live_owner(r.path) is not None
                or not _steps_run(step, r)):
            continue
        if key not in found or r.name > found[key].name:
            found[key] = r
    return {key: r.path for key, r in found.items()}


def _steps_run(step: Step, run: Run) -> bool:
    """Whether ``run`` is one of the step's: its PE, a claim arm's values (only runs of the arm's
    command count: the report pools no other) and the setting its command composes (a table's:
    the preset's, which the table prefers)."""
    return (run.pe in step.pes and has_values(run.pe, run.config(), step.match)
            and _steps_setting(step, run))


def _has_checkpoint(run: Run) -> bool:
    """A run directory's last checkpoint is here (a record holds none)."""
    return (run.path / "checkpoints" / "last.ckpt").is_file()


def _steps_setting(step: Step, run: Run) -> bool:
    """Whether ``run``'s setting is the one the step's command composes (tape.report.settings:
    keys only one of them has do not count; a step whose runs' experiment does not compose, as
    SCROLLS' per-dataset names, takes any): a run made by hand with another learning rate is not
    the arm's, though it has the arm's pinned values."""
    return is_preset_run(run.config(), run.experiment, run.pe,
                         tuple(o for o in step.overrides if not o.startswith("paths.")))


def total(step: Step) -> int:
    if step.unavailable:
        return 0
    return 1 if step.done_file is not None else len(step.experiments()) * len(step.pes) * len(step.seeds)


def commands(step: Step, todo: Sequence[tuple[str, str, int]] | None = None) -> list[list[str]]:
    """The commands that run ``todo`` (default: all of the step's runs); one Hydra multirun per
    seed (and per SCROLLS dataset set), over the PEs still missing for that seed."""
    base = ["python", "-m", step.entry]
    if step.done_file is not None:
        return [base + list(step.overrides)]
    if step.single:
        seeds = sorted({s for _, _, s in todo}) if todo is not None else list(step.seeds)
        return [base + [f"experiment={step.experiment}", f"seed={s}", *step.overrides] for s in seeds]
    todo = list(todo) if todo is not None else [(e, p, s) for e in step.experiments()
                                                  for p in step.pes for s in step.seeds]
    out = []
    for seed in sorted({s for _, _, s in todo}):
        for pe_set, exps in _by_pe_set([(e, p) for e, p, s in todo if s == seed]).items():
            argv = base + ["-m", f"experiment={step.experiment}", f"pe={','.join(pe_set)}", f"seed={seed}"]
            if step.datasets:
                argv.append("task.dataset=" + ",".join(e.rsplit("/", 1)[-1] for e in exps))
            out.append(argv + list(step.overrides))
    return out


def with_runs_dir(steps: Sequence[Step], runs_dir: Path) -> list[Step]:
    """The training steps told to write under ``runs_dir`` (paths.runs_dir) where it is not the
    default ``runs/`` of this directory: the reproduction looks for their runs there."""
    if Path(runs_dir).resolve() == (Path.cwd() / "runs").resolve():
        return list(steps)
    where = f"paths.runs_dir={Path(runs_dir).resolve()}"
    return [replace(s, overrides=(*s.overrides, where)) if s.entry == "pipelines.train" else s for s in steps]


def resume_commands(step: Step, todo: Sequence[tuple[str, str, int]], resume: dict[tuple[str, str, int], Path]
                    ) -> tuple[list[list[str]], list[tuple[str, str, int]]]:
    """The commands that resume the runs of ``todo`` found in ``resume`` (one each, with
    ``ckpt_path=<its run dir>``), and the rest of ``todo``, which start afresh."""
    labelled = run_commands(step, [t for t in todo if t in resume], resume)
    return [argv for _, argv in labelled], [t for t in todo if t not in resume]


def run_commands(step: Step, todo: Sequence[tuple[str, str, int]],
                 resume: dict[tuple[str, str, int], Path] | None = None) -> list[tuple[str, list[str]]]:
    """(label, command) per run of ``todo`` for --jobs: single runs, not multiruns; a run in
    ``resume`` continues from its run dir (``ckpt_path``). The label names the run's log file."""
    if step.done_file is not None:
        return [(step.name, argv) for argv in commands(step)]
    if step.single:
        return [(f"{step.name}-seed{seed}", argv)
                for seed, argv in zip(sorted({s for _, _, s in todo}), commands(step, todo))]
    out = []
    for exp, pe, seed in todo:
        argv = ["python", "-m", step.entry, f"experiment={step.experiment}", f"pe={pe}", f"seed={seed}"]
        dataset = [exp.rsplit("/", 1)[-1]] if step.datasets else []
        argv += [f"task.dataset={d}" for d in dataset]
        again = (resume or {}).get((exp, pe, seed))
        argv += [*step.overrides, *([f"ckpt_path={again}"] if again else [])]
        out.append(("-".join([step.name, *dataset, pe, f"seed{seed}"]), argv))
    return out


def _by_pe_set(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, ...], list[str]]:
    """Experiments grouped by the PEs they still need, so a multirun never repeats a finished run."""
    need: dict[str, list[str]] = {}
    for exp, pe in pairs:
        need.setdefault(exp, []).append(pe)
    grouped: dict[tuple[str, ...], list[str]] = {}
    for exp, pes in need.items():
        grouped.setdefault(tuple(pes), []).append(exp)
    return grouped


# ---------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Launch:
    """One command to run: with ``threads`` torch threads (None: inherit) and its output in
    ``log`` (None: this console)."""

    argv: list[str]
    threads: int | None = None
    log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables


Runner = Callable[[Launch], int]


def run_command(launch: Launch) -> int:
    """Run one command with this interpreter (``python`` -> sys.executable); its return code."""
    argv = [sys.executable if a == "python" and i == 0 else a for i, a in enumerate(launch.argv)]
    env = {**os.environ, **launch.env}
    if launch.threads is not None:  # torch reads these when it starts
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(launch.threads)
    if launch.log is None:
        return subprocess.run(argv, env=env).returncode
    with open(launch.log, "x") as out:  # a new file per run: never overwrite an earlier log
        return subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


@dataclass(frozen=True)
class Where:
    """Where a reproduction's runs go and where their records are kept (None: no records)."""

    runs: Path
    records: Path | None = None

    def finished(self) -> list[Run]:
        """The runs under runs/ and the records (a run and its record once)."""
        return finished_runs(self.runs, *([self.records] if self.records else []))

    def record(self, log: Callable[[str], None]) -> None:
        """Write the record of every finished run under runs/ that has none yet."""
        if self.records is None or not self.runs.is_dir():
            return
        try:
            for path in export_all(self.runs, self.records):
                log(f"record: {path}")
        except RecordConflict as err:
            log(f"record: {err}")


def execute(steps: Sequence[Step], runs_dir: Path, runner: Runner = run_command,
            dry_run: bool = False, log: Callable[[str], None] = print, jobs: int = 1,
            records_dir: Path | None = None) -> list[Outcome]:
    """Run each step's unfinished runs, never re-running a finished one, wave by wave: a wave's
    runs to do are found when every earlier wave has finished (a table step then skips the runs
    a claim arm finished before it). Inside a wave claim arms go seed by seed, primary arms first
    (``_launch_order``): with ``jobs`` = 1 as Hydra multiruns, one step and seed at a time, each
    finding its runs just before it starts; else ``jobs`` single runs at once. A command is never
    launched twice in one call. Every run of one call logs to one W&B group,
    ``reproduce-<time>`` (conf/logger/wandb.yaml). A run with a record under ``records_dir``
    counts as finished; each finished run's record is written there as soon as its command
    returns."""
    where = Where(runs_dir, records_dir)
    group = {WANDB_GROUP_VAR: f"reproduce-{time.strftime('%Y%m%d-%H%M%S')}"}
    lock = threading.Lock()
    log = _serialised(log, lock)  # one whole line at a time from the worker threads
    started: dict[int, tuple[Outcome, list]] = {}  # by the step's index
    spans: dict[str, list[float]] = {}  # step name -> [first start, last finish]
    launched: set[tuple[str, ...]] = set()
    running = _Wave(where, runner, dry_run, log, group, lock, threading.Lock(), spans, launched)
    if not dry_run:
        where.record(log)  # runs an earlier call finished but never recorded (it was interrupted)
    try:
        for wave in sorted({s.wave for s in steps}):
            indexed = {i: _start(s, where, log) for i, s in enumerate(steps) if s.wave == wave}
            started.update(indexed)
            here = list(indexed.values())
            if jobs > 1:
                running.parallel(here, jobs)
            else:
                running.serial(here)
    finally:  # a Ctrl-C or a crash: what finished still gets its record
        if not dry_run:
            with running.record_lock:
                where.record(log)
    outcomes = []
    for _, (out, todo) in sorted(started.items()):
        first, last = spans.get(out.step.name, (0.0, 0.0))
        out.wall_s = last - first
        _finish(out, todo, where)
        outcomes.append(out)
    return outcomes


@dataclass
class _Wave:
    """What running one wave's commands needs: where runs and records go, how to launch, and the
    call's shared record of spans and launched commands."""

    where: Where
    runner: Runner
    dry_run: bool
    log: Callable[[str], None]
    env: dict[str, str]
    lock: threading.Lock  # the log's, the spans' and the launched set's
    record_lock: threading.Lock  # one records export at a time
    spans: dict[str, list[float]]
    launched: set[tuple[str, ...]]

    def serial(self, here: list[tuple[Outcome, list]]) -> None:
        """One command at a time in this console: per step and seed (claim arms seed by seed),
        the runs still to do found just before it starts."""
        items = [(out, seed) for out, todo in here if todo
                 for seed in ([None] if out.step.done_file is not None else sorted({t[2] for t in todo}))]
        for out, seed in sorted(items, key=lambda item: _order(item[0], item[1] or 0)):
            todo, again = None, []  # a step with a done file: its one command
            if seed is not None:
                runs = self.where.finished()
                now = next(t for o, t in here if o is out) if self.dry_run else pending(out.step, runs)
                todo = [t for t in now if t[2] == seed]
                if not todo:  # finished by an earlier command of this wave
                    continue
                again, todo = resume_commands(out.step, todo, resumable(out.step, runs))
            for argv in [*again, *(commands(out.step, todo) if todo or seed is None else [])]:
                self.launch(out, argv)

    def parallel(self, here: list[tuple[Outcome, list]], jobs: int) -> None:
        """``jobs`` single runs at once (cpu_count // jobs threads each, output in
        ``<runs>/reproduce-logs/``), then the ``alone`` steps one by one with every thread."""
        threads = max(1, (os.cpu_count() or 1) // jobs)
        runs = self.where.finished()
        items = sorted(((out, label, argv) for out, todo in here if todo
                        for label, argv in run_commands(out.step, todo, resumable(out.step, runs))),
                       key=_launch_order)
        if items and not self.dry_run:
            (self.where.runs / "reproduce-logs").mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda i: self.launch(i[0], i[2], i[1], threads), [i for i in items if not i[0].step.alone]))
        for out, label, argv in (i for i in items if i[0].step.alone):
            self.launch(out, argv, label, None)

    def launch(self, out: Outcome, argv: list[str], label: str | None = None, threads: int | None = None) -> None:
        """Run one command (``label``: with its own log file and ``threads``; else in this
        console), unless this call launched it already; then write the records of what finished."""
        with self.lock:
            if tuple(argv) in self.launched:
                return
            self.launched.add(tuple(argv))
        path = None
        where_to = ""
        if label is not None:
            path = self.where.runs / "reproduce-logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}.log"
            where_to = f" ({'every core' if threads is None else f'{threads} thread(s)'}; log: {path})"
        self.log(f"[{out.step.name}] {'would run' if self.dry_run else 'running'}: {shlex.join(argv)}"
                 + ("" if self.dry_run else where_to))
        if self.dry_run:
            return
        t0 = time.perf_counter()
        code = self.runner(Launch(argv, threads, path, {**self.env, **arm_env(out.step)}))
        t1 = time.perf_counter()
        with self.lock:
            out.returncodes.append(code)
            span = self.spans.setdefault(out.step.name, [t0, t1])
            span[0], span[1] = min(span[0], t0), max(span[1], t1)
        with self.record_lock:  # one export at a time: the worker threads take turns
            self.where.record(self.log)
        if label is not None:
            self.log(f"[{out.step.name}] {label}: {'finished' if code == 0 else f'exited with {code}'} "
                     f"after {(t1 - t0) / 60:.1f} min")
        elif code:
            self.log(f"[{out.step.name}] exited with {code}; going on with the next command")


def arm_env(step: Step) -> dict[str, str]:
    """A claim arm's step names its runs in W&B (``C1-rope_abacus-seed0``, tag ``arm:C1-rope_abacus``):
    arms of one PE (C1's Abacus on and off, C5's depths) would otherwise share a name."""
    return {WANDB_ARM_VAR: step.name} if step.match else {}


def _order(out: Outcome, seed: int) -> tuple[int, int, float]:
    """Claim arms (tier, seed, minutes): every primary arm's seed 0, then seed 1, ... so finished
    runs form pairs early, the cheapest first; other steps keep their order (sorted() is stable)."""
    if not out.step.match:
        return (out.step.tier, 0, 0.0)
    return (out.step.tier, seed, out.step.minutes)


def _launch_order(item: tuple[Outcome, str, list[str]]) -> tuple[int, int, float]:
    """``_order`` of a single run's command (its ``seed=``)."""
    out, _, argv = item
    seed = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("seed=")), 0)
    return _order(out, seed)


def _serialised(log: Callable[[str], None], lock: threading.Lock) -> Callable[[str], None]:
    """``log`` that holds ``lock`` while it writes, so lines from worker threads never mix."""
    def locked(line: str) -> None:
        with lock:
            log(line)
    return locked


def _start(step: Step, where: Where, log: Callable[[str], None]) -> tuple[Outcome, list]:
    """The step's outcome so far (what is skipped, or why it cannot run) and its runs to do."""
    out = Outcome(step, note=step.unavailable)
    if step.unavailable:
        log(f"[{step.name}] {step.unavailable}")
        return out, []
    if step.done_file is not None:
        if step.done_file.is_file():
            out.skipped = 1
            log(f"[{step.name}] skipped: {step.done_file} exists (delete it to re-run)")
            return out, []
        return out, [step.done_file]
    todo = pending(step, where.finished())
    out.skipped = total(step) - len(todo)
    log(f"[{step.name}] {out.skipped} finished run(s) skipped, {len(todo)} to run")
    return out, todo


def _finish(out: Outcome, todo: list, where: Where) -> None:
    """Count what ran and what is still left once the step's commands have returned."""
    if out.step.done_file is not None:
        done = out.step.done_file.is_file()
        out.ran, out.left = (1, 0) if done and todo else (0, 0 if done else 1)
    elif todo:
        left = pending(out.step, where.finished())
        out.ran, out.left = len(todo) - len(left), len(left)


def estimate(steps: Sequence[Step], runs_dir: Path, jobs: int, records_dir: Path | None = None,
             note: str = "", at_once: int | None = None) -> str:
    """The expected wall time of the runs left, from each step's ``minutes`` (claims only), and
    ``note`` on those minutes (the profile's ``minutes.note``). ``at_once``: how many of the
    ``jobs`` really run side by side (default: no more than the cores; one on one GPU)."""
    runs = Where(runs_dir, records_dir).finished()
    known = [(len(pending(s, runs)), s.minutes, s.alone) for s in steps if s.minutes]
    unknown = [s.name for s in steps if not s.minutes and (
        pending(s, runs) or (s.done_file is not None and not s.done_file.is_file()))]
    at_once = max(1, min(jobs, os.cpu_count() or 1) if at_once is None else at_once)
    minutes = (sum(n * m for n, m, by_itself in known if not by_itself) / at_once  # runs side by side
               + sum(n * m for n, m, by_itself in known if by_itself))  # an alone step's, one after another
    line = (f"estimate: {sum(n for n, _, _ in known)} claim run(s) left, about {minutes:.0f} min with --jobs {jobs}"
            + (f" ({at_once} at once here)" if at_once != jobs else ""))
    if note:
        line += f" ({note})"
    return line + (f" (plus {', '.join(unknown)}: no estimate)" if unknown else "")


def summary(outcomes: Sequence[Outcome], dry_run: bool = False) -> str:
    """The progress table: per step, runs ran / skipped / left and its wall time (none for a
    dry run, which runs nothing)."""
    wall = [] if dry_run else ["wall time (min, first start to last finish)"]
    header = ["step", "ran", "skipped (finished before)", "left", *wall, "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for o in outcomes:
        note = o.note or ("; ".join(f"exit {c}" for c in o.returncodes if c) or "")
        cells = [o.step.name, o.ran, o.skipped, o.left, *([] if dry_run else [f"{o.wall_s / 60:.1f}"]), note]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- entry point
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.reproduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=_profiles_help())
    p.add_argument("--profile", choices=profiles(), default="cpu")
    p.add_argument("--seeds", type=int, nargs="+", default=[0],
                   help="seeds of the table steps (profiles tables, cpu-full); claim arms take "
                        "their seeds from their plan in conf/claims.yaml")
    p.add_argument("--claims", nargs="+", default=[], metavar="ID",
                   help="run only these claims of conf/claims.yaml (e.g. --claims C2 C3), no table "
                        "steps; default: all")
    p.add_argument("--steps", nargs="+", default=[], metavar="NAME",
                   help="run only these steps (names as --dry-run lists them, e.g. C3-fire or "
                        "pretrain), in the profile's order; default: all")
    p.add_argument("--runs", type=Path, default=Path("runs"))
    p.add_argument("--out", type=Path, default=Path("results"),
                   help="rendered results; the runs' records go to <out>/records/")
    p.add_argument("--scrolls-data", type=Path, default=Path("data/scrolls"),
                   help="local SCROLLS JSONL (<dataset>/{train,validation}.jsonl); datasets "
                        "missing there are not run at the cpu profile")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each with cpu_count // jobs threads and its own log file")
    p.add_argument("--dry-run", action="store_true", help="show what would run; run nothing")
    p.add_argument("--no-report", action="store_true", help="do not render results/ at the end")
    return p.parse_args(argv)


def _profiles_help() -> str:
    """The profiles and what each runs, for --help."""
    lines = ["profiles (conf/reproduce/<profile>.yaml):"]
    for name in profiles():
        try:
            description = load_profile(name).description
        except ValueError as err:  # main says so when it is the profile asked for
            description = f"(unreadable: {err})"
        lines += textwrap.wrap(description, width=96, initial_indent=f"  {name}: ", subsequent_indent="    ")
    return "\n".join(lines)


def only_steps(steps: Sequence[Step], names: Sequence[str]) -> list[Step]:
    """The steps named in ``names`` (all when none is named); an unknown name is an error that
    lists the profile's step names."""
    if not names:
        return list(steps)
    unknown = sorted(set(names) - {s.name for s in steps})
    if unknown:
        raise ValueError(f"--steps {' '.join(unknown)}: no such step in this plan; its steps: "
                         f"{', '.join(s.name for s in steps)}")
    return [s for s in steps if s.name in names]


def folders_problem(runs: Path, out: Path) -> str | None:
    """Why --runs and --out cannot hold a reproduction (None when they can): a file where a folder
    goes, or the records (<out>/records) inside the runs or the runs inside the records (each
    launch would record the records again, one level deeper)."""
    for flag, path in (("--runs", runs), ("--out", out)):
        if path.exists() and not path.is_dir():
            return f"{flag} {path} is a file; give a folder"
    records, runs_at = (out / "records").resolve(), runs.resolve()
    if records != runs_at and (records.is_relative_to(runs_at) or runs_at.is_relative_to(records)):
        return (f"--out {out}: its records ({out / 'records'}) would lie inside --runs {runs} (or the runs inside "
                "them); give an --out outside the runs folder (e.g. --out results or --out report)")
    return None


def main(argv: Sequence[str] | None = None, runner: Runner = run_command) -> int:
    args = parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: give at least 1 (runs at once)")
    if bad := [s for s in args.seeds if not 0 <= s < 2**32]:
        raise SystemExit(f"--seeds {' '.join(map(str, bad))}: seeds are in [0, 2**32) (NumPy's seed range)")
    args.seeds = list(dict.fromkeys(args.seeds))  # --seeds 1 1 is one seed
    if problem := folders_problem(args.runs, args.out):
        raise SystemExit(f"pipelines.reproduce: {problem}")
    try:
        profile = load_profile(args.profile)
        steps = with_runs_dir(only_steps(plan(args.profile, args.seeds, args.runs, args.scrolls_data,
                                              only=args.claims), args.steps), args.runs)
    except ValueError as err:
        raise SystemExit(f"pipelines.reproduce: {err}") from None
    if profile.print_only:
        print(profile.heading)
        for step in steps:
            for argv_ in commands(step):
                print("  " + shlex.join(argv_))
    else:
        t0 = time.perf_counter()
        records = args.out / "records"
        outcomes = execute(steps, args.runs, runner, dry_run=args.dry_run, jobs=args.jobs,
                           records_dir=records)
        if args.dry_run:
            at_once = 1 if profile.scale == "gpu" else None  # a gpu profile's minutes are one run on one GPU
            print(estimate(steps, args.runs, args.jobs, records, profile.minutes_note, at_once))
        print(summary(outcomes, args.dry_run))
        took = (time.perf_counter() - t0) / 60
        print(f"the dry run took {took:.1f} min (it ran nothing)" if args.dry_run
              else f"total wall time: {took:.1f} min")
    if not args.no_report and not args.dry_run and not profile.print_only:
        scale = profile.scale
        ran = any(o.step.done_file is not None and o.ran for o in outcomes)  # this call ran the benchmark
        if ran and publish_benchmark(args.runs, scale, args.out):
            print(f"benchmark: {bench_dir(args.runs, scale)}/efficiency.{{md,json}} copied to {args.out}/")
        elif (bench_dir(args.runs, scale) / "efficiency.json").is_file():
            print(f"benchmark: {bench_dir(args.runs, scale)}/efficiency.json was not run by this call: "
                  f"{args.out}/efficiency.* kept")
        try:
            # from the records (the runs of this call and every committed one); sections with no
            # record yet are carried over from the previous render, never lost
            done = render(args.out / "records", args.out, carry_over=True, preset=preset_setting)
        except WouldLoseResults as err:
            print(f"report: not rendered, {args.out}/ left as it was: {err}", file=sys.stderr)
            return 1
        print(f"report: {len(done.files)} files under {args.out}/ ({args.out / 'README.md'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
