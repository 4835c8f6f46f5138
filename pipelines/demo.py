"""A first look in minutes: ``make demo`` (``python -m pipelines.demo``) trains TAPE and RoPE on
flip-flop at a few seeds (experiment=flipflop/demo, under 2 minutes on 2 cores), then writes
``runs/demo/report/README.md``: read error by length for each encoding (a figure) and the paired
difference TAPE - RoPE beyond the training length (a table). Not a result: a demo's seeds are
too few for a verdict, and the report says so.

The report holds only the runs this call trained. A later call into the same --out keeps the
earlier report and writes its own to ``<out>/report-<time>-<id>/`` (the id of its runs).
Only flip-flop experiments (conf/experiment/flipflop/) can be reported; others are refused
before anything trains.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from tape.report.claim_figures import claim_figure
from tape.report.document import Context
from tape.report.paired import MetricSpec, compare, decide
from tape.report.runs import Run, find_runs

METRIC = MetricSpec("read_error_ood", margin=1.0, better="lower",
                    label="read error at 2x and 3x the training length (%)")
TASK = "flipflop"  # the only task whose metrics and figure the report knows
PES = ("rope", "tape")
# Overrides the demo sets itself; an extra override of one would fight it (or change the task).
DEMO_KEYS = {"experiment": "--experiment", "pe": "", "seed": "--seeds", "logger": "",
             "paths.runs_dir": "--out", "task": "--experiment"}
SWEEP_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]+")  # a run name without its job number


class DemoError(ValueError):
    """A request or an outcome the demo refuses; the message names the option and the fix."""


def reportable_experiments() -> list[str]:
    """The experiment presets the report can read: conf/experiment/flipflop/*.yaml."""
    from pipelines.hydra_conf import CONF_DIR

    return sorted(f"{TASK}/{p.stem}" for p in (CONF_DIR / "experiment" / TASK).glob("*.yaml"))


def check_request(experiment: str, seeds: Sequence[int], extra: Sequence[str]) -> None:
    """Refuse, before anything trains, what the demo cannot run or report: repeated seeds,
    overrides of what the demo sets itself, an unknown experiment, a task other than flip-flop."""
    from pipelines.hydra_conf import CONF_DIR, compose_or_none

    if len(set(seeds)) != len(seeds):
        raise DemoError(f"--seeds {' '.join(map(str, seeds))}: give each seed once")
    for override in extra:
        key = override.lstrip("+~").split("=", 1)[0]
        if "=" not in override:
            raise DemoError(f"{override!r} is no override: write key=value (e.g. optim.lr=0.01)")
        if key in DEMO_KEYS:
            how = f"use {DEMO_KEYS[key]}" if DEMO_KEYS[key] else "the demo sets it itself"
            raise DemoError(f"override {override!r}: {key} is the demo's own setting; {how}")
    accepted = ", ".join(reportable_experiments())
    cfg = compose_or_none("config", [f"experiment={experiment}"])
    if cfg is None and not (CONF_DIR / "experiment" / f"{experiment}.yaml").is_file():
        raise DemoError(f"--experiment {experiment}: no such experiment (conf/experiment/{experiment}.yaml); "
                        f"the demo reports flip-flop, pass one of: {accepted}")
    if cfg is None:
        raise DemoError(f"--experiment {experiment} does not compose; `python -m pipelines.train "
                        f"experiment={experiment}` shows Hydra's error")
    # with the overrides too (Hydra reports overrides that do not compose itself, before training)
    task = str((compose_or_none("config", [f"experiment={experiment}", *extra]) or cfg).task.name)
    if task != TASK:
        raise DemoError(f"--experiment {experiment} trains task {task!r}, but the demo's report reads "
                        f"flip-flop read errors only; pass one of: {accepted}")


def train(experiment: str, seeds: Sequence[int], runs_dir: Path, extra: Sequence[str] = ()) -> int:
    """One Hydra multirun of TAPE and RoPE at ``seeds``; its return code."""
    argv = [sys.executable, "-m", "pipelines.train", "-m", f"experiment={experiment}", f"pe={','.join(PES)}",
            f"seed={','.join(map(str, seeds))}", "logger=csv", f"paths.runs_dir={runs_dir.resolve()}", *extra]
    return subprocess.run(argv).returncode


def new_runs(runs_dir: Path, before: set[Path], seeds: Sequence[int]) -> dict[str, list[Run]]:
    """This call's finished run of each encoding at each seed, in ``seeds`` order: the runs
    under ``runs_dir`` that are not in ``before`` (those there before the call)."""
    runs = [r for r in find_runs(runs_dir) if r.path not in before and r.finished]
    arms: dict[str, list[Run]] = {}
    for pe in PES:
        by_seed = {r.seed: r for r in runs if r.pe == pe}
        missing = [s for s in seeds if s not in by_seed]
        if missing:
            raise DemoError(f"no finished {pe} run at seed {', '.join(map(str, missing))} among the runs this "
                            f"call made under {runs_dir}; see the training output above")
        arms[pe] = [by_seed[s] for s in seeds]
    return arms


def sweep_id(runs: Sequence[Run]) -> str:
    """The multirun id the runs' names share (``<time>-<id>``, less the job number); "" if none."""
    ids = {m.group(0) for m in (SWEEP_ID.match(r.name) for r in runs) if m}
    return ids.pop() if len(ids) == 1 else ""


def report_dir(out: Path, runs: Sequence[Run]) -> Path:
    """``<out>/report`` for the first demo there; else ``<out>/report-<time>-<id>`` (the runs'
    sweep id), so an earlier report is never overwritten."""
    path = out / "report"
    if not path.exists():
        return path
    stamp = sweep_id(runs) or time.strftime("%Y%m%d-%H%M%S")
    path, n = out / f"report-{stamp}", 1
    while path.exists():
        n += 1
        path = out / f"report-{stamp}-{n}"
    return path


def setting(runs: Sequence[Run], *keys: str) -> str:
    """The runs' config value at ``keys`` (e.g. "trainer", "max_steps"): "6", "6-8" when they
    differ, "?" when none has it. For the steps, what a run recorded it trained wins."""
    values = set()
    for run in runs:
        value: object = run.config()
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if keys == ("trainer", "max_steps") and run.metrics and isinstance(run.metrics.get("steps"), int):
            value = run.metrics["steps"]  # metrics.json: the steps trained; config: the steps planned
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values.add(int(value))
    if not values:
        return "?"
    return str(min(values)) if len(values) == 1 else f"{min(values)}-{max(values)}"


def report(arms: Mapping[str, list[Run]], out: Path, experiment: str) -> Path:
    """``out``/README.md with the figure and the paired table of ``arms`` (PES -> this call's
    finished runs, one a seed); ``out`` must not exist yet."""
    values = {pe: {r.seed: float(r.metrics[METRIC.key]) for r in rs if r.metrics} for pe, rs in arms.items()}
    [c] = decide([compare(values["tape"], values["rope"], METRIC, ("tape", "rope"))])
    out.mkdir(parents=True, exist_ok=False)  # never into an earlier report
    runs = [r for rs in arms.values() for r in rs]
    ctx = Context(runs=runs, out_dir=out, stamp="demo")
    fig = claim_figure(ctx, "demo", "flip-flop, TAPE and RoPE", {"RoPE": arms["rope"], "TAPE": arms["tape"]},
                       TASK)
    rows = [f"| {s} | {values['rope'][s]:.2f} | {values['tape'][s]:.2f} | {values['tape'][s] - values['rope'][s]:+.2f} |"
            for s in c.seeds]
    in_dist = {pe: sum(float(r.metrics["read_error_1x"]) for r in rs if r.metrics) / max(len(rs), 1)
               for pe, rs in arms.items()}
    model = f"a {setting(runs, 'model', 'n_layers')}-layer decoder of width {setting(runs, 'model', 'd_model')}"
    trained = f"{setting(runs, 'trainer', 'max_steps')} steps at length {setting(runs, 'task', 'seq_len')}"
    text = "\n".join([
        "# Demo: TAPE and RoPE on flip-flop", "",
        f"Trained on {experiment} ({model}, {trained}) at seeds {', '.join(map(str, c.seeds))}; "
        f"this report reads only those {len(runs)} runs (multirun {sweep_id(runs) or '?'}). "
        f"Mean read error at the training length: RoPE {in_dist['rope']:.2f} %, TAPE {in_dist['tape']:.2f} %; "
        "beyond it:", "",
        f"![read error by length]({fig.path.as_posix()})" if fig else "(no figure: no finished run)", "",
        f"| seed | RoPE: {METRIC.label} | TAPE | Δ TAPE - RoPE |", "|---|---|---|---|", *rows, "",
        f"Paired over {c.n} seeds: {c.effect()}; {c.verdict}: {c.reason}. A demo is not evidence: "
        "results/README.md has the claims at planned seed counts.", ""])
    (out / "README.md").write_text(text)
    return out / "README.md"


def main(argv: Sequence[str] | None = None) -> int:
    """Check the request, train, report; 0, training's exit code, or 2 for a refused request."""
    p = argparse.ArgumentParser(prog="python -m pipelines.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/demo"),
                   help="folder of the runs (<out>/runs) and the report (default: runs/demo)")
    p.add_argument("--experiment", default="flipflop/demo", help="a flip-flop preset (default: flipflop/demo)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("extra", nargs="*",
                   help="more overrides for the runs (key=value; after --seeds, put -- before them)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    runs_dir = args.out / "runs"
    try:
        if args.out.exists() and not args.out.is_dir():
            raise DemoError(f"--out {args.out} is a file; give a folder")
        check_request(args.experiment, args.seeds, args.extra)
    except DemoError as err:
        print(f"pipelines.demo: {err}", file=sys.stderr)
        return 2
    before = {r.path for r in find_runs(runs_dir)}
    code = train(args.experiment, args.seeds, runs_dir, args.extra)
    if code != 0:
        print(f"pipelines.demo: training failed (exit {code}); see the output above", file=sys.stderr)
        return code
    try:
        arms = new_runs(runs_dir, before, args.seeds)
    except DemoError as err:
        print(f"pipelines.demo: {err}", file=sys.stderr)
        return 1
    path = report(arms, report_dir(args.out, [r for rs in arms.values() for r in rs]), args.experiment)
    print(f"demo: {path} ({(time.perf_counter() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
