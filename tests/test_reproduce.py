"""pipelines.reproduce: the command list of each profile and the skip logic, with a fake runner
that only writes run directories (no training runs here)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from pipelines import reproduce
from pipelines.reproduce import commands, execute, pending, plan, summary
from tape.report.runs import find_runs


def finish(runs: Path, experiment: str, pe: str, seed: int, name: str, done: bool = True) -> Path:
    run = runs / experiment / pe / str(seed) / name
    run.mkdir(parents=True)
    (run / "command.txt").write_text(f"python -m pipelines.train experiment={experiment} pe={pe}\n")
    if done:
        (run / "metrics.json").write_text(json.dumps(
            {"experiment": experiment, "pe": pe, "seed": seed, "scale": experiment.split("/")[1]}))
    return run


class FakeRunner:
    """Records commands; 'runs' a pipelines.train/extend command by writing finished run dirs
    (except for the PEs in ``fail``), and the benchmark by writing its JSON."""

    launched = 0  # over all runners: later runs get later (newer) directory names

    def __init__(self, runs: Path, out: Path, fail: tuple[str, ...] = ()) -> None:
        self.runs, self.out, self.fail, self.calls = runs, out, fail, []

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(shlex.join(argv))
        args = dict(a.split("=", 1) for a in argv if "=" in a)
        if argv[2] == "pipelines.benchmark":
            Path(args["output_dir"]).mkdir(parents=True, exist_ok=True)
            (Path(args["output_dir"]) / "efficiency.json").write_text("{}")
            return 0
        pes = args.get("pe", "llama").split(",")
        exps = [f"{args['experiment']}/{d}" for d in args["task.dataset"].split(",")] \
            if "task.dataset" in args else [args["experiment"]]
        FakeRunner.launched += 1
        for exp in exps:
            for pe in pes:
                finish(self.runs, exp, pe, int(args["seed"]), f"20261123-{FakeRunner.launched:06d}-abcdef",
                       done=pe not in self.fail)
        return 1 if any(pe in self.fail for pe in pes) else 0


def step(steps: list, name: str):
    return next(s for s in steps if s.name == name)


def test_cpu_plan_lists_every_experiment_in_order(tmp_path: Path) -> None:
    steps = plan("cpu", out_dir=tmp_path / "results", scrolls_data=tmp_path / "none")
    assert [s.name for s in steps] == ["addition", "pretrain", "scrolls", "context_extension", "benchmark"]
    assert [shlex.join(c) for c in commands(step(steps, "addition"))] == [
        "python -m pipelines.train -m experiment=addition/cpu pe=rope,randpe,nope,fire,tape seed=0"]
    assert [shlex.join(c) for c in commands(step(steps, "pretrain"))] == [
        "python -m pipelines.train -m experiment=pretrain/cpu pe=rope,alibi,randpe,fire,xpos,nope,tape seed=0"]
    assert [shlex.join(c) for c in commands(step(steps, "context_extension"))] == [
        "python -m pipelines.extend experiment=context_extension/cpu seed=0"]
    assert shlex.join(commands(step(steps, "benchmark"))[0]).startswith("python -m pipelines.benchmark")
    assert step(steps, "scrolls").unavailable.startswith("not run: data unavailable")


def test_paper_plan_prints_multiruns_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def refuse(argv: list[str]) -> int:
        raise AssertionError(f"the paper profile must not run {argv}")

    reproduce.main(["--profile", "paper", "--runs", str(tmp_path / "runs"), "--out",
                    str(tmp_path / "results"), "--no-report"], runner=refuse)
    out = capsys.readouterr().out
    assert "python -m pipelines.train -m experiment=addition/paper pe=rope,randpe,nope,fire,tape seed=0" in out
    assert "experiment=scrolls/paper" in out and "task.dataset=qasper,contract_nli" in out
    assert "experiment=context_extension/paper" in out and "model.pretrained_path=" in out
    assert "python -m pipelines.benchmark device=cuda scale=paper" in out


def test_finished_runs_are_skipped_unfinished_ones_rerun(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    finish(runs, "addition/cpu", "rope", 0, "20261122-205210-0835a8-0")
    finish(runs, "addition/cpu", "tape", 0, "20261122-205210-0835a8-4", done=False)  # killed
    finish(runs, "addition/cpu", "fire", 1, "20261122-205210-0835a8-8")
    addition = step(plan("cpu", seeds=(0, 1), scrolls_data=None), "addition")
    todo = pending(addition, find_runs(runs))
    assert ("addition/cpu", "rope", 0) not in todo and ("addition/cpu", "tape", 0) in todo
    assert len(todo) == 8
    assert [shlex.join(c) for c in commands(addition, todo)] == [
        "python -m pipelines.train -m experiment=addition/cpu pe=randpe,nope,fire,tape seed=0",
        "python -m pipelines.train -m experiment=addition/cpu pe=rope,randpe,nope,tape seed=1"]


def test_execute_runs_what_is_left_then_skips_everything(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "results"
    finish(runs, "pretrain/cpu", "rope", 0, "20261122-205210-0835a8-0")
    steps = plan("cpu", out_dir=out, scrolls_data=None)
    runner = FakeRunner(runs, out, fail=("fire",))
    logs: list[str] = []
    outcomes = {o.step.name: o for o in execute(steps, runs, runner, log=logs.append)}
    assert (outcomes["addition"].ran, outcomes["addition"].skipped, outcomes["addition"].left) == (4, 0, 1)
    assert (outcomes["pretrain"].ran, outcomes["pretrain"].skipped, outcomes["pretrain"].left) == (5, 1, 1)
    assert "pe=rope" not in runner.calls[1] and "pe=alibi,randpe,fire" in runner.calls[1]
    assert (outcomes["context_extension"].ran, outcomes["benchmark"].ran) == (1, 1)
    assert outcomes["scrolls"].ran == 0 and outcomes["scrolls"].note.startswith("not run")
    table = summary(list(outcomes.values()))
    assert "| addition | 4 | 0 | 1 |" in table and "exit 1" in table

    again = FakeRunner(runs, out)
    second = {o.step.name: o for o in execute(steps, runs, again, log=logs.append)}
    assert [c for c in again.calls] == [  # only the failed FIRE runs are left
        "python -m pipelines.train -m experiment=addition/cpu pe=fire seed=0",
        "python -m pipelines.train -m experiment=pretrain/cpu pe=fire seed=0"]
    assert second["context_extension"].skipped == 1 and second["benchmark"].skipped == 1
    assert sum(o.left for o in second.values()) == 0


def test_dry_run_runs_nothing(tmp_path: Path) -> None:
    def refuse(argv: list[str]) -> int:
        raise AssertionError(argv)

    outcomes = execute(plan("cpu", out_dir=tmp_path / "r", scrolls_data=None), tmp_path / "runs",
                       refuse, dry_run=True, log=lambda _: None)
    assert [o.left for o in outcomes] == [5, 7, 0, 1, 1] and not any(o.ran for o in outcomes)


def test_scrolls_runs_only_datasets_with_local_data(tmp_path: Path) -> None:
    data = tmp_path / "scrolls"
    for split in ("train", "validation"):
        (data / "qasper").mkdir(parents=True, exist_ok=True)
        (data / "qasper" / f"{split}.jsonl").write_text("{}\n")
    (data / "quality").mkdir()
    (data / "quality" / "train.jsonl").write_text("{}\n")  # no validation split: not present
    scrolls = step(plan("cpu", scrolls_data=data), "scrolls")
    assert scrolls.datasets == ("qasper",) and not scrolls.unavailable
    (cmd,) = commands(scrolls, pending(scrolls, []))
    assert "experiment=scrolls/cpu" in cmd and "task.dataset=qasper" in cmd
    assert f"task.data_dir={data}" in cmd and "task.pretrained_run=last" in cmd


def test_main_cpu_renders_the_report_after_running(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "results"
    runner = FakeRunner(runs, out)
    reproduce.main(["--runs", str(runs), "--out", str(out), "--scrolls-data", str(tmp_path / "x")],
                   runner=runner)
    assert len(runner.calls) == 4
    assert (out / "README.md").is_file() and (out / "tables" / "addition_cpu.csv").is_file()
