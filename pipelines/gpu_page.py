"""results/gpu.md and each window's summary.md: what ``make gpu-check`` found on a GPU, rendered
from its summaries (``render`` refuses any made without a GPU); never typed by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from pipelines.gpu_targets import printed_json, timed_presets_md, window_profiles, window_targets


def _outcome_rows(summary: dict) -> list[str]:
    return [f"| {o['name']} | {'pass' if o['passed'] else _failure(o)} | {o['wall_s']:.0f} s | `{o['log']}` |"
            for o in summary["outcomes"]]


def _failure(outcome: dict) -> str:
    if outcome.get("budget_cut"):
        return "not finished (--budget spent; --continue runs it)"
    return "FAIL" if outcome["returncode"] is not None else "cut off (time limit)"


def _numbers(summary: dict) -> list[str]:
    """The JSON line each in-process step (model, resume, llama7b, throughput) printed last, as a
    list item (the step profiles and the timed presets get tables of their own)."""
    lines = []
    for o in summary["outcomes"]:
        line = printed_json(o)
        if line is not None and "(profiler)" not in o["name"] and not o["name"].startswith("time "):
            lines.append(f"- {o['name']}: `{line}`")
    return lines


FULL_SQUARE = ("TFLOP/s in these tables count attention over the full N x N score matrix (Table 3's convention, "
               "tape/bench/flops.py): a causal kernel does about half that attention work.")


def _window(summary: dict) -> str:
    """One device window: where it ran, then one row per step."""
    env = summary["environment"]
    passed = sum(o["passed"] for o in summary["outcomes"])
    numbers = _numbers(summary)
    window = Path(summary["dir"])
    tables, by_length = window / "benchmark" / "efficiency.md", window / "sweep" / "sweep.md"
    every = window / "benchmark-all" / "efficiency.md"
    return "\n".join([
        f"## Window {window.name}", "",
        f"`{summary['dir']}`: commit {env['commit']} on {env['device']} (driver {env['driver']}; "
        f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}). "
        f"{passed} of {len(summary['outcomes'])} steps passed{_plan_note(summary)}.", "",
        "| check | verdict | wall time | log |", "|---|---|---|---|", *_outcome_rows(summary), "",
        *(["Numbers printed by the in-process steps:", "", *numbers, ""] if numbers else []),
        *([f"The efficiency benchmark's tables (paper Table 4's shape): `{tables}`.", ""] if tables.is_file() else []),
        *([f"The benchmark of every encoding at that shape: `{every}`.", ""] if every.is_file() else []),
        *([FULL_SQUARE, ""] if tables.is_file() or every.is_file() or by_length.is_file() else []),
        *window_targets(window),
        *window_profiles(summary["outcomes"]),
        *timed_presets_md(summary["outcomes"]),
        *([f"The attention operator by length: `{by_length}`.", ""] if by_length.is_file() else []),
    ])


def _plan_note(summary: dict) -> str:
    """What the window meant to run (summaries before the suites did not record it)."""
    if "suite" not in summary:
        return ""
    scope = f"suite {summary['suite']}" + (f", --only {summary['only']}" if summary.get("only") else "")
    calls = summary.get("calls") or []
    continued = (f"; {len(calls)} calls, same GPU, stack and code, started "
                 f"{', '.join(c['started'] for c in calls)}" if len(calls) > 1 else "")
    return f" ({scope}: {len(summary['planned'])} steps planned{continued})"


def summary_md(summary: dict) -> str:
    """One window's page (summary.md beside its logs)."""
    return f"# gpu-check {Path(summary['dir']).name}\n\n" + _window(summary)


def complete_core_run(summary: dict) -> bool:
    """This window ran ``make gpu-check`` whole (the core suite, no --only, every step) and every
    step passed."""
    planned, outcomes = summary.get("planned"), summary["outcomes"]
    return (summary.get("suite") == "core" and summary.get("only") is None and bool(planned)
            and [o["name"] for o in outcomes] == planned and all(o["passed"] for o in outcomes))


def _calls_note(summary: dict) -> str:
    calls = summary.get("calls") or []
    return f"; {len(calls)} calls, same GPU, stack and code (--continue)" if len(calls) > 1 else ""


def _whole_proof(summaries: list[dict]) -> str:
    """Which windows ran make gpu-check whole with every step passing (what issue 21 asks for)."""
    whole = [s for s in summaries if complete_core_run(s)]
    if not whole:
        return ("No window has yet run `make gpu-check` whole (the core suite, every step) with every step "
                "passing; the verdicts below come from windows that ran parts of it.")
    names = ", ".join(f"{Path(s['dir']).name} ({s['environment']['device']}, commit {s['environment']['commit']}"
                      f"{_calls_note(s)})" for s in sorted(whole, key=lambda x: Path(x["dir"]).name))
    return f"`make gpu-check` ran whole with every step passing in: {names}."


def page_md(summaries: list[dict]) -> str:
    """results/gpu.md: the newest verdict of every check, then every window, newest first."""
    latest: dict[str, tuple[dict, dict]] = {}
    for summary in sorted(summaries, key=lambda x: Path(x["dir"]).name):
        for o in summary["outcomes"]:  # a step --budget stopped has no verdict: an older one stands
            if not o.get("budget_cut") or o["name"] not in latest:
                latest[o["name"]] = (summary, o)
    rows = [f"| {name} | {'pass' if o['passed'] else _failure(o)} | {Path(s['dir']).name} | "
            f"{s['environment']['commit']} |" for name, (s, o) in latest.items()]
    return "\n".join([
        "# The CUDA path on a GPU", "",
        "Rendered by `make gpu-page` (`python -m pipelines.gpu_check --render results/gpu.md`) from the "
        "summaries of `make gpu-check` under `results/gpu-check/`, each from a run on a GPU. "
        "Never typed by hand.", "",
        "## The whole proof", "", _whole_proof(summaries), "",
        "## Newest verdict of each check", "",
        "| check | verdict | window | commit |", "|---|---|---|---|", *rows, "",
        *[_window(s) for s in sorted(summaries, key=lambda x: Path(x["dir"]).name, reverse=True)],
    ])


def render(summary_dirs: Sequence[Path], out: Path) -> None:
    """results/gpu.md from gpu-check summaries; any summary made without a GPU is refused."""
    summaries = [json.loads((d / "summary.json").read_text()) | {"dir": str(d)} for d in summary_dirs]  # where it lies now
    if not summaries:
        raise SystemExit(f"no gpu-check summary to render {out} from: run make gpu-check on a GPU first")
    for d, summary in zip(summary_dirs, summaries):
        if summary["environment"].get("gpu") != "True":
            raise SystemExit(f"{d}: this gpu-check ran without a GPU ({summary['environment']['device']}); "
                             f"{out} is written only from runs on a GPU")
    out.write_text(page_md(summaries))
