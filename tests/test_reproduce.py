"""pipelines.reproduce: the command list of each profile and the skip logic, with a fake runner
that only writes run directories (no training runs here)."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from pipelines import reproduce
from pipelines.plan import _override
from pipelines.reproduce import Launch, commands, execute, pending, plan, summary
from tape.report.runs import find_runs


def finish(runs: Path, experiment: str, pe: str, seed: int, name: str, done: bool = True) -> Path:
    run = runs / experiment / pe / str(seed) / name
    run.mkdir(parents=True)
    (run / "command.txt").write_text(f"python -m pipelines.train experiment={experiment} pe={pe}\n")
    if done:
        (run / "metrics.json").write_text(json.dumps(
            {"experiment": experiment, "pe": pe, "seed": seed, "scale": experiment.split("/")[1]}))
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_bytes(b"")  # as pipelines.train leaves it; a record has none
    return run


class FakeRunner:
    """Records commands; 'runs' a pipelines.train command by writing finished run dirs
    (except for the PEs in ``fail``), and the benchmark by writing its JSON."""

    launched = itertools.count(1)  # over all runners: later runs get later (newer) directory names

    def __init__(self, runs: Path, out: Path, fail: tuple[str, ...] = ()) -> None:
        self.runs, self.out, self.fail = runs, out, fail
        self.calls: list[str] = []
        self.launches: list[Launch] = []

    def __call__(self, launch: Launch) -> int:
        argv = launch.argv
        self.launches.append(launch)
        self.calls.append(shlex.join(argv))
        args = dict(a.split("=", 1) for a in argv if "=" in a)
        if argv[2] == "pipelines.benchmark":
            Path(args["output_dir"]).mkdir(parents=True, exist_ok=True)
            (Path(args["output_dir"]) / "efficiency.json").write_text("{}")
            (Path(args["output_dir"]) / "efficiency.md").write_text("# Efficiency (fake run)\n")
            return 0
        pes = args.get("pe", "llama").split(",")
        exps = [f"{args['experiment']}/{d}" for d in args["task.dataset"].split(",")] \
            if "task.dataset" in args else [args["experiment"]]
        number = next(FakeRunner.launched)
        for exp in exps:
            for pe in pes:
                finish(self.runs, exp, pe, int(args["seed"]), f"20261123-{number:06d}-abcdef",
                       done=pe not in self.fail)
        return 1 if any(pe in self.fail for pe in pes) else 0


def step(steps: list, name: str):
    return next(s for s in steps if s.name == name)


def test_cpu_plan_lists_every_experiment_in_order(tmp_path: Path) -> None:
    steps = plan("tables", runs_dir=tmp_path / "runs", scrolls_data=tmp_path / "none")
    assert [s.name for s in steps] == ["context_extension", "addition", "pretrain", "scrolls", "benchmark"]
    assert [shlex.join(c) for c in commands(step(steps, "addition"))] == [
        "python -m pipelines.train -m experiment=addition/cpu pe=rope,randpe,nope,fire,tape seed=0"]
    assert [shlex.join(c) for c in commands(step(steps, "pretrain"))] == [
        "python -m pipelines.train -m experiment=pretrain/cpu pe=rope,alibi,randpe,fire,xpos,nope,tape seed=0"]
    assert [shlex.join(c) for c in commands(step(steps, "context_extension"))] == [
        "python -m pipelines.train experiment=context_extension/cpu seed=0"]
    assert shlex.join(commands(step(steps, "benchmark"))[0]).startswith("python -m pipelines.benchmark")
    assert step(steps, "scrolls").unavailable.startswith("not run: data unavailable")


def test_paper_plan_prints_multiruns_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(launch: Launch) -> int:
        raise AssertionError(f"the paper profile must not run {launch}")

    def no_render(*args: object, **kwargs: object) -> None:
        raise AssertionError("the paper profile prints only: it must not render results/")

    monkeypatch.setattr(reproduce, "render", no_render)
    reproduce.main(["--profile", "paper", "--runs", str(tmp_path / "runs"), "--out",
                    str(tmp_path / "results")], runner=refuse)
    out = capsys.readouterr().out
    assert not (tmp_path / "results").exists()  # prints only: never renders (or touches) results/
    assert "python -m pipelines.train -m experiment=addition/paper pe=rope,randpe,nope,fire,tape seed=0" in out
    assert "python -m pipelines.train -m experiment=addition/paper_fig2 pe=rope,randpe,nope,fire,tape seed=0" in out
    assert "experiment=scrolls/paper" in out and "task.dataset=qasper,contract_nli" in out
    assert "experiment=context_extension/paper" in out and "model.pretrained_path=" in out
    assert "python -m pipelines.benchmark device=cuda scale=paper" in out


def test_finished_runs_are_skipped_unfinished_ones_rerun(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    finish(runs, "addition/cpu", "rope", 0, "20261122-205210-0835a8-0")
    finish(runs, "addition/cpu", "tape", 0, "20261122-205210-0835a8-4", done=False)  # killed
    finish(runs, "addition/cpu", "fire", 1, "20261122-205210-0835a8-8")
    addition = step(plan("tables", seeds=(0, 1), scrolls_data=None), "addition")
    todo = pending(addition, find_runs(runs))
    assert ("addition/cpu", "rope", 0) not in todo and ("addition/cpu", "tape", 0) in todo
    assert len(todo) == 8
    assert [shlex.join(c) for c in commands(addition, todo)] == [
        "python -m pipelines.train -m experiment=addition/cpu pe=randpe,nope,fire,tape seed=0",
        "python -m pipelines.train -m experiment=addition/cpu pe=rope,randpe,nope,tape seed=1"]


def test_execute_runs_what_is_left_then_skips_everything(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "results"
    finish(runs, "pretrain/cpu", "rope", 0, "20261122-205210-0835a8-0")
    steps = plan("tables", runs_dir=runs, scrolls_data=None)
    runner = FakeRunner(runs, out, fail=("fire",))
    logs: list[str] = []
    outcomes = {o.step.name: o for o in execute(steps, runs, runner, log=logs.append)}
    assert (outcomes["addition"].ran, outcomes["addition"].skipped, outcomes["addition"].left) == (4, 0, 1)
    assert (outcomes["pretrain"].ran, outcomes["pretrain"].skipped, outcomes["pretrain"].left) == (5, 1, 1)
    assert "pe=rope" not in runner.calls[2] and "pe=alibi,randpe,fire" in runner.calls[2]
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
    def refuse(launch: Launch) -> int:
        raise AssertionError(launch)

    outcomes = execute(plan("tables", runs_dir=tmp_path / "runs", scrolls_data=None), tmp_path / "runs",
                       refuse, dry_run=True, log=lambda _: None)
    assert [o.left for o in outcomes] == [1, 5, 7, 0, 1] and not any(o.ran for o in outcomes)


def test_scrolls_runs_only_datasets_with_local_data(tmp_path: Path) -> None:
    data = tmp_path / "scrolls"
    for split in ("train", "validation"):
        (data / "qasper").mkdir(parents=True, exist_ok=True)
        (data / "qasper" / f"{split}.jsonl").write_text("{}\n")
    (data / "quality").mkdir()
    (data / "quality" / "train.jsonl").write_text("{}\n")  # no validation split: not present
    scrolls = step(plan("tables", scrolls_data=data), "scrolls")
    assert scrolls.datasets == ("qasper",) and not scrolls.unavailable
    (cmd,) = commands(scrolls, pending(scrolls, []))
    assert "experiment=scrolls/cpu" in cmd and "task.dataset=qasper" in cmd
    assert f"task.data_dir={data}" in cmd and "task.pretrained_run=last" in cmd


def test_main_cpu_renders_the_report_after_running(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "results"
    runner = FakeRunner(runs, out)
    reproduce.main(["--profile", "tables", "--runs", str(runs), "--out", str(out),
                    "--scrolls-data", str(tmp_path / "x")], runner=runner)
    assert len(runner.calls) == 4
    # --runs reaches the runs it launches (they wrote under ./runs, where it never looked)
    train_calls = [c for c in runner.calls if "pipelines.train" in c]
    assert train_calls and all(c.endswith(f"paths.runs_dir={runs.resolve()}") for c in train_calls)
    assert (out / "README.md").is_file() and (out / "tables" / "addition_cpu.csv").is_file()
    assert (out / "efficiency.md").read_text() == "# Efficiency (fake run)\n"  # published from runs/


def test_a_benchmark_this_call_did_not_run_never_replaces_the_committed_one(tmp_path: Path, capsys) -> None:
    """A quick hand-run benchmark in runs/benchmark/cpu was copied over results/efficiency.* by
    any later reproduction (make reproduce-table CLAIMS=C2 ran no benchmark)."""
    runs, out = tmp_path / "runs", tmp_path / "results"
    quick = runs / "benchmark" / "cpu"
    quick.mkdir(parents=True)
    (quick / "efficiency.json").write_text('{"command": "quick"}')
    (quick / "efficiency.md").write_text("# quick\n")
    out.mkdir()
    (out / "efficiency.md").write_text("# committed\n")
    reproduce.main(["--profile", "tables", "--runs", str(runs), "--out", str(out), "--scrolls-data",
                    str(tmp_path / "x"), "--steps", "addition"], runner=FakeRunner(runs, out))
    assert (out / "efficiency.md").read_text() == "# committed\n"
    assert "was not run by this call: " in capsys.readouterr().out


def test_a_second_benchmark_keeps_the_first_ones_files(tmp_path: Path, monkeypatch) -> None:
    import pipelines.benchmark as benchmark

    monkeypatch.setattr(benchmark, "render_markdown", lambda result, notes: f"{result}\n")
    monkeypatch.setattr(benchmark, "default_notes", lambda result: [])
    benchmark.write_outputs({"first": 1}, tmp_path)
    first = (tmp_path / "efficiency.json").read_text()
    benchmark.write_outputs({"second": 2}, tmp_path)
    kept = sorted(p.name for p in tmp_path.glob("efficiency-*"))
    assert len(kept) == 2 and kept[0].endswith(".json") and kept[1].endswith(".md")
    assert (tmp_path / kept[0]).read_text() == first and '"second"' in (tmp_path / "efficiency.json").read_text()
    assert (tmp_path / kept[1]).read_text() == "{'first': 1}\n"


def test_a_checkouts_committed_benchmark_does_not_count_as_run_here(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / "efficiency.json").write_text("{}")  # as in a fresh clone
    bench = step(plan("tables", runs_dir=tmp_path / "runs", scrolls_data=None), "benchmark")
    assert bench.done_file == tmp_path / "runs" / "benchmark" / "cpu" / "efficiency.json"
    assert f"output_dir={tmp_path / 'runs' / 'benchmark' / 'cpu'}" in shlex.join(commands(bench)[0])
    assert not reproduce.publish_benchmark(tmp_path / "runs", "cpu", out)


def test_publishing_a_new_benchmark_keeps_the_one_it_replaces(tmp_path: Path) -> None:
    """results/ holds the committed benchmark: a new one is copied in beside it, the old pair
    renamed with its time; publishing the same pair again changes nothing."""
    runs, out = tmp_path / "runs", tmp_path / "results"
    src = runs / "benchmark" / "cpu"
    src.mkdir(parents=True)
    out.mkdir()
    (out / "efficiency.json").write_text('{"old": 1}')
    (out / "efficiency.md").write_text("old table")
    (src / "efficiency.json").write_text('{"new": 2}')
    (src / "efficiency.md").write_text("new table")
    assert reproduce.publish_benchmark(runs, "cpu", out)
    kept = sorted(p.name for p in out.glob("efficiency-*"))
    assert [(out / k).read_text() for k in kept] == ['{"old": 1}', "old table"]
    assert (out / "efficiency.md").read_text() == "new table"
    assert reproduce.publish_benchmark(runs, "cpu", out)
    assert sorted(p.name for p in out.glob("efficiency*")) == sorted(kept + ["efficiency.json", "efficiency.md"])


def test_jobs_run_single_runs_side_by_side_then_the_benchmark_alone(tmp_path: Path) -> None:
    runs, out, data = tmp_path / "runs", tmp_path / "results", tmp_path / "scrolls"
    for split in ("train", "validation"):
        (data / "qasper").mkdir(parents=True, exist_ok=True)
        (data / "qasper" / f"{split}.jsonl").write_text("{}\n")
    finish(runs, "addition/cpu", "rope", 0, "20261122-205210-0835a8-0")
    steps = plan("tables", runs_dir=runs, scrolls_data=data)
    runner = FakeRunner(runs, out, fail=("fire",))
    outcomes = {o.step.name: o for o in execute(steps, runs, runner, log=lambda _: None, jobs=2)}
    calls = runner.calls
    assert len(calls) == 1 + 4 + 7 + 6 + 1  # extension, addition (rope done), pretrain, scrolls, benchmark
    assert not any(" -m experiment" in c for c in calls)  # single runs, no multiruns
    assert "python -m pipelines.train experiment=addition/cpu pe=tape seed=0" in calls
    last_pretrain = max(i for i, c in enumerate(calls) if "experiment=pretrain/cpu" in c)
    first_scrolls = min(i for i, c in enumerate(calls) if "experiment=scrolls/cpu" in c)
    assert last_pretrain < first_scrolls  # SCROLLS fine-tunes the pretraining runs
    assert calls[-1].startswith("python -m pipelines.benchmark")
    threads = max(1, (os.cpu_count() or 1) // 2)
    assert [la.threads for la in runner.launches[:-1]] == [threads] * (len(calls) - 1)
    assert runner.launches[-1].threads is None  # the benchmark times with every core
    logs = [la.log for la in runner.launches]
    assert all(p.parent == runs / "reproduce-logs" for p in logs) and len(set(logs)) == len(logs)
    assert {p.name.split("-", 2)[-1] for p in logs[:2]} == {"context_extension-seed0.log", "addition-randpe-seed0.log"}
    assert (outcomes["addition"].ran, outcomes["addition"].skipped, outcomes["addition"].left) == (3, 1, 1)
    assert (outcomes["scrolls"].ran, outcomes["scrolls"].left) == (5, 1)
    assert outcomes["benchmark"].ran == 1 and outcomes["addition"].returncodes.count(1) == 1

    again = FakeRunner(runs, out)
    execute(steps, runs, again, log=lambda _: None, jobs=2)
    assert sorted(again.calls) == [  # the failed FIRE runs only
        "python -m pipelines.train experiment=addition/cpu pe=fire seed=0",
        "python -m pipelines.train experiment=pretrain/cpu pe=fire seed=0",
        f"python -m pipelines.train experiment=scrolls/cpu pe=fire seed=0 task.dataset=qasper "
        f"task.pretrained_run=last task.data_dir={data}"]


def test_jobs_run_a_claim_experiment_the_profile_runs_alone_by_itself_after_the_rest(tmp_path: Path) -> None:
    """Two context-extension runs side by side took 76-80 min each, one alone 17 min: under
    --jobs its runs go one at a time with every core, after the runs that share the cores."""
    runs = tmp_path / "runs"
    steps = plan("cpu", runs_dir=runs, only=("C3", "C7"))
    assert [s.name for s in steps if s.alone] == ["C7-recipes"]  # C7 alone: seeds 1-8
    runner = FakeRunner(runs, tmp_path / "results")
    execute(steps, runs, runner, log=lambda _: None, jobs=2)
    alone = [i for i, c in enumerate(runner.calls) if "experiment=context_extension/cpu" in c]
    assert len(alone) == 8 and alone == list(range(len(runner.calls) - 8, len(runner.calls)))
    assert {runner.launches[i].threads for i in alone} == {None}  # every core
    assert {la.threads for la in runner.launches[:alone[0]]} == {max(1, (os.cpu_count() or 1) // 2)}


def test_jobs_must_be_positive_and_seeds_in_numpys_range(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--jobs 0"):
        reproduce.main(["--jobs", "0", "--runs", str(tmp_path), "--dry-run"])
    with pytest.raises(SystemExit, match=r"--seeds -1: seeds are in \[0, 2\*\*32\)"):
        reproduce.main(["--profile", "tables", "--seeds", "0", "-1", "--runs", str(tmp_path), "--dry-run"])


def test_run_command_sets_threads_and_never_overwrites_a_log(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    show = ["python", "-c", "import os, sys; print(os.environ['OMP_NUM_THREADS'], sys.executable)"]
    assert reproduce.run_command(Launch(show, threads=3, log=log)) == 0
    threads, exe = log.read_text().split()
    assert threads == "3" and Path(exe).resolve() == Path(sys.executable).resolve()
    with pytest.raises(FileExistsError):
        reproduce.run_command(Launch(show, threads=1, log=log))
    assert log.read_text().startswith("3 ")


def test_one_reproduction_logs_to_one_wandb_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import compose_config

    runs = tmp_path / "runs"
    for jobs in (1, 2):
        runner = FakeRunner(runs, tmp_path / "results")
        execute(plan("tables", runs_dir=runs / str(jobs), scrolls_data=None), runs / str(jobs), runner,
                log=lambda _: None, jobs=jobs)
        groups = {la.env.get(reproduce.WANDB_GROUP_VAR) for la in runner.launches}
        assert len(groups) == 1 and groups.pop().startswith("reproduce-")
    cfg = compose_config("config", ["experiment=addition/smoke", "logger=wandb"])
    assert cfg.logger.wandb.group == "addition/smoke"  # a run on its own: its experiment
    monkeypatch.setenv(reproduce.WANDB_GROUP_VAR, "reproduce-20261123-000000")
    assert cfg.logger.wandb.group == "reproduce-20261123-000000"
    assert "experiment:addition/smoke" in cfg.logger.wandb.tags


@pytest.mark.parametrize("jobs", [1, 2])
def test_arms_of_one_pe_get_their_own_wandb_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  jobs: int) -> None:
    """C1's RoPE with and without Abacus were both ``rope-seed0`` in W&B, with the same tags."""
    from conftest import compose_config

    runs = tmp_path / "runs"
    launches: list[Launch] = []
    execute(plan("cpu", runs_dir=runs), runs, lambda la: launches.append(la) or 0, log=lambda _: None, jobs=jobs)
    arms = {}
    for la in launches:
        args = dict(a.split("=", 1) for a in la.argv if "=" in a)
        if args["experiment"] == "addition_c1/cpu" and args["pe"] == "rope":
            arms[args["model.abacus"]] = la.env[reproduce.WANDB_ARM_VAR]
    assert set(arms) == {"true", "false"} and arms["true"] != arms["false"]
    for abacus, arm in arms.items():
        monkeypatch.setenv(reproduce.WANDB_ARM_VAR, arm)
        wandb = compose_config("config", ["experiment=addition_c1/cpu", "pe=rope", "seed=2",
                                          f"model.abacus={abacus}"]).logger.wandb
        assert wandb.name == f"{arm}-seed2" and f"arm:{arm}" in wandb.tags and "pe:rope" in wandb.tags
    tables = FakeRunner(runs / "tables", tmp_path / "results")
    execute(plan("tables", runs_dir=runs / "tables", scrolls_data=None), runs / "tables", tables,
            log=lambda _: None, jobs=jobs)
    assert not any(reproduce.WANDB_ARM_VAR in la.env for la in tables.launches)  # no arm: named by PE


# ------------------------------------------------------------------ the claims (profile cpu)
def finish_arm(runs: Path, experiment: str, pe: str, seed: int, name: str, config: dict) -> Path:
    """A finished run whose config.yaml holds ``config`` (dotted keys) and paired_init."""
    import yaml

    run = finish(runs, experiment, pe, seed, name)
    nested: dict = {"pe": {"name": pe}, "paired_init": True, "seed": seed}
    for key, value in config.items():
        node = nested
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    (run / "config.yaml").write_text(yaml.safe_dump(nested))
    return run


def test_cpu_profile_runs_every_claim_arm_at_its_planned_seeds(tmp_path: Path) -> None:
    steps = plan("cpu", runs_dir=tmp_path / "runs")
    by_name = {s.name: s for s in steps}
    # C1's 8 planned seeds and C1b's fresh seeds 8-15 of the same arm: one step, both sets
    assert by_name["C1+C1b+C1y-tape_abacus"].seeds == tuple(range(16)) and by_name["C1+C1b+C1y-tape_abacus"].tier == 0
    assert by_name["C1-nope_abacus"].seeds == tuple(range(8)) and by_name["C1-nope_abacus"].tier == 1
    assert "model.abacus=true" in by_name["C1+C1b-rope_abacus"].overrides
    yarn = by_name["C1y-tape_abacus_yarn"]  # YaRN's option, named by the arm, reaches the command
    assert {"pe.rope_yarn_factor=2.0", "pe.rope_yarn_original_length=20"} <= set(yarn.overrides)
    assert "model.abacus=false" in by_name["C1-rope_plain"].overrides
    shared = by_name["C2+C2e+C2f+C2x+C2w+C2wc+C4-tape"]  # one arm, seven claims (0-7, 0-7, 10-17, 10-17, 0-7, 10-23, 0-5): each seed once
    assert shared.experiment == "pretrain/cpu" and shared.seeds == (*range(8), *range(10, 24))
    assert by_name["C4-tape_rowsum"].match["pe.tape_post_attn"] == "rowsum"
    widths = [by_name[name] for name in ("C2w+C2wc-tape_width_1h", "C2w-tape_width_2h", "C2w+C2wc-tape_width_8h")]
    assert [s.match["pe.tape_position_size"] for s in widths] == [4, 8, 32]  # Table 7: I = H, 2H, 8H at H = 4
    assert all(f"pe.tape_position_size={w}" in s.overrides for s, w in zip(widths, (4, 8, 32)))
    assert widths[1].seeds == tuple(range(8))  # C2w's seeds; C2wc's fresh 10-23 for H and 8H
    assert widths[0].seeds == widths[2].seeds == (*range(8), *range(10, 24))
    assert by_name["C4-tape_rowsum"].seeds == tuple(range(6))
    compute = by_name["C2-rope_pretrain_compute"]  # only described: describe_seeds
    assert compute.seeds == (0, 1) and compute.tier == 1
    assert by_name["C3+C3c+C3s+C3d+C3sc+C3dc+C3fp+C3bl-tape"].seeds == tuple(range(24))
    assert by_name["C3+C3bl-nope"].seeds == by_name["C3+C3bl-alibi"].seeds == tuple(range(10))  # C3bl: fresh 2-9
    assert by_name["C3-fire"].seeds == (0, 1)
    assert by_name["C3+C3fp-fox"].seeds == by_name["C3+C3fp-path"].seeds == tuple(range(10))  # C3fp: fresh 2-9
    assert "trainer.max_steps=550" in compute.overrides and "trainer.max_steps=500" not in compute.overrides
    assert "trainer.max_steps=500" in by_name["C2+C2x+C2u-rope"].overrides
    assert by_name["C2+C2x+C2u-rope"].seeds == by_name["C2+C2x-alibi"].seeds == (*range(8), *range(10, 18))  # C2x: fresh 10-17
    for update in ("attn", "mlp"):  # C2's ablation arms at 0-7, C2u's fresh 10-17, one step each
        assert by_name[f"C2+C2u-tape_{update}_only"].seeds == (*range(8), *range(10, 18))
    assert all(s.match.get("paired_init") is True for s in steps)
    assert not any(s.experiment.startswith(("addition/", "scrolls/")) for s in steps)  # tables' steps
    extension = [s for s in steps if s.experiment.startswith("context_extension/")]
    assert [s.name for s in extension] == ["C7+C7s-recipes", "C7a+C7as-recipes", "C7m+C7ms+C7msc-recipes", "C7asc-recipes"]
    assert "extend.recipes=[tape,lora,embed_norm]" in extension[1].overrides
    assert {"extend.recipes=[tape]", "eval.maps_off=[tape]"} <= set(extension[2].overrides)
    assert extension[2].seeds == tuple(range(21, 37))  # C7m/C7ms's seeds 21-26, C7msc's fresh 27-36
    assert not any(o.startswith("extend.recipes") for o in extension[0].overrides)  # the preset's five
    assert "extend.recipes=[tape,embed_norm]" in extension[3].overrides
    assert extension[3].seeds == tuple(range(37, 47))  # C7asc's fresh seeds


def test_a_claim_arm_counts_only_runs_with_its_config_values(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    c1 = {"optim.lr": 0.0003, "trainer.max_steps": 2000}  # claim C1's settings
    finish_arm(runs, "addition_c1/cpu", "rope", 0, "20261123-000001-aaaaaa", {**c1, "model.abacus": False})
    finish_arm(runs, "addition_c1/cpu", "rope", 1, "20261123-000002-aaaaaa", {**c1, "model.abacus": True})
    finish_arm(runs, "addition_c1/cpu", "rope", 3, "20261123-000004-aaaaaa",  # another schedule
               {"optim.lr": 0.001, "trainer.max_steps": 3000, "model.abacus": True})
    finish(runs, "addition_c1/cpu", "rope", 2, "20261123-000003-aaaaaa")  # no config: unknown arm
    finish_arm(runs, "addition_c1/cpu", "rope", 4, "20261123-000005-aaaaaa",  # the arm's values, by hand
               {**c1, "model.abacus": True, "optim.weight_decay": 0.5})  # with another weight decay
    finish_arm(runs, "addition_c1/cpu", "rope", 5, "20261123-000006-aaaaaa",
               {**c1, "model.abacus": True, "optim.weight_decay": 0.01})  # the preset's
    by_name = {s.name: s for s in plan("cpu", runs_dir=runs)}
    found = find_runs(runs)
    abacus = [seed for _, _, seed in pending(by_name["C1+C1b-rope_abacus"], found)]
    plain = [seed for _, _, seed in pending(by_name["C1-rope_plain"], found)]
    assert abacus == [0, 2, 3, 4, *range(6, 16)] and plain == [1, 2, 3, 4, 5, 6, 7]


def test_a_table_step_counts_only_runs_of_its_presets_setting(tmp_path: Path) -> None:
    """The pretraining table counted a RoPE run trained 510 steps as its 500-step preset's."""
    from pipelines.presets import preset_setting

    runs = tmp_path / "runs"
    steps = preset_setting("pretrain/cpu", "rope")["trainer.max_steps"]
    finish_arm(runs, "pretrain/cpu", "rope", 0, "20261123-000001-aaaaaa", {"trainer.max_steps": steps + 10})
    finish_arm(runs, "pretrain/cpu", "tape", 0, "20261123-000002-aaaaaa", {"trainer.max_steps": steps})
    table = step(plan("tables", runs_dir=runs, scrolls_data=None), "pretrain")
    todo = pending(table, find_runs(runs))
    assert ("pretrain/cpu", "rope", 0) in todo and ("pretrain/cpu", "tape", 0) not in todo


class InOrderPool:
    """ThreadPoolExecutor's map, one item after another in submission order: two real workers
    may reach the runner in either order, which would make a test of the launch order flaky."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers

    def __enter__(self) -> "InOrderPool":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn, items):  # noqa: ANN001, ANN201
        return [fn(item) for item in items]


def test_claim_runs_start_seed_by_seed_primary_arms_first(tmp_path: Path, monkeypatch) -> None:
    runs = tmp_path / "runs"
    launched: list[list[str]] = []

    def record(launch: Launch) -> int:
        launched.append(launch.argv)
        return 0

    monkeypatch.setattr(reproduce, "ThreadPoolExecutor", InOrderPool)  # the order items are handed out
    execute(plan("cpu", runs_dir=runs), runs, record, log=lambda _: None, jobs=1 + 1)
    seeds = [int(next(a for a in argv if a.startswith("seed="))[5:]) for argv in launched]
    n_primary = sum(len(s.seeds) for s in plan("cpu") if s.tier == 0 and not s.alone)
    assert seeds[:n_primary] == sorted(seeds[:n_primary])  # whole pairs early
    n_alone = sum(len(s.seeds) for s in plan("cpu") if s.alone)  # context extension: by itself, last
    assert all("experiment=context_extension/cpu" in shlex.join(a) for a in launched[-n_alone:])
    assert len(launched) == sum(len(s.seeds) for s in plan("cpu"))
    first = {shlex.join(a) for a in launched[:n_primary]}
    assert any("experiment=addition_c1/cpu pe=rope seed=0 optim.lr=0.0003 trainer.max_steps=2000 "
               "model.abacus=true" in c for c in first)
    later = ("experiment=addition_c1/cpu pe=nope", "pe=fire", "pe=cope")  # C1's secondary arm, C3's described ones
    assert not any(arm in c for c in first for arm in later)
    assert any(arm in c for c in launched[n_primary:] for arm in later)


def test_one_job_also_runs_claim_arms_seed_by_seed(tmp_path: Path) -> None:
    """--jobs 1 ran every seed of one arm before the next arm started: an interrupted
    reproduction left no pairs (review)."""
    runs = tmp_path / "runs"
    launched: list[list[str]] = []

    def record(launch: Launch) -> int:
        launched.append(launch.argv)
        return 0

    execute(plan("cpu", runs_dir=runs), runs, record, log=lambda _: None, jobs=1)
    n_primary = sum(len(s.seeds) for s in plan("cpu") if s.tier == 0)
    seeds = [int(next(a for a in argv if a.startswith("seed="))[5:]) for argv in launched]
    assert seeds[:n_primary] == sorted(seeds[:n_primary]) and seeds[0] == 0 and len(set(seeds[:n_primary])) > 1
    assert len(launched) == sum(len(s.seeds) for s in plan("cpu"))  # one multirun per arm and seed


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_table_step_skips_the_runs_a_claim_arm_finished_earlier_in_the_call(tmp_path: Path, jobs: int) -> None:
    """cpu-full: the pretraining table step (a later wave) relaunched the RoPE / TAPE / ALiBi
    seed-0 runs the C2 arms had just finished, when --jobs found every wave's runs up front."""
    runs = tmp_path / "runs"
    steps = [s for s in plan("cpu-full", runs_dir=runs, scrolls_data=None)
             if s.name in ("C2+C2e+C2f+C2x+C2w+C2wc+C4-tape", "C2+C2x+C2u-rope", "C2+C2x-alibi", "pretrain")]
    runner = FakeRunner(runs, tmp_path / "results")
    execute(steps, runs, runner, log=lambda _: None, jobs=jobs)
    table = [c for c in runner.calls if "trainer.max_steps" not in c]  # the table step's commands
    table_pes = {pe for c in table for a in shlex.split(c) if a.startswith("pe=") for pe in a[3:].split(",")}
    assert table_pes and not table_pes & {"rope", "tape", "alibi"}
    assert len(runner.calls) == len(set(runner.calls))


def test_cpu_full_runs_the_claims_plan_then_the_tables(tmp_path: Path) -> None:
    steps = plan("cpu-full", runs_dir=tmp_path / "runs", scrolls_data=None)
    claims = [s for s in steps if s.match]
    overnight = ("C5", "C6")  # the claims with profiles: [cpu-full]
    assert [(s.name, s.seeds) for s in claims if not s.name.startswith(overnight)] == [
        (s.name, s.seeds) for s in plan("cpu", runs_dir=tmp_path / "runs")]
    c5 = [s for s in steps if s.name.startswith("C5")]
    assert {s.experiment for s in c5} == {"word_problem/cpu"} and len(c5) == 4  # 2 PEs x 2 depths
    assert any("model.n_layers=4" in s.overrides for s in c5)
    two_layers = {s.seeds for s in c5 if "model.n_layers=2" in s.overrides}
    assert two_layers == {tuple(range(28))}  # C5's seeds 0-7 and C5c's fresh 8-27, one step per arm
    c6 = [s for s in steps if s.name.startswith("C6")]
    assert {s.experiment for s in c6} == {"parity/cpu"} and len(c6) == 14  # 7 arms, each with its control
    assert sum("task.scratchpad=interleaved" in s.overrides for s in c6) == 7
    by_name = {s.name: s for s in c6}  # C6fp: FoX, PaTH and TAPE at fresh seeds 2-9, no controls there
    assert by_name["C6+C6fp-fox"].seeds == by_name["C6+C6fp-path"].seeds == by_name["C6+C6fp-tape"].seeds == tuple(range(10))
    assert by_name["C6-fox-control-scratchpad=interleaved"].seeds == (0, 1)
    assert by_name["C6-tape-control-scratchpad=interleaved"].seeds == tuple(range(8))
    assert not any(s.name.startswith("C5") for s in plan("cpu", runs_dir=tmp_path / "runs"))  # overnight only
    tables = [s.name for s in steps if not s.match]
    assert tables == ["context_extension", "addition", "pretrain", "scrolls", "benchmark"]
    assert min(s.wave for s in steps if s.name in tables) > max(s.wave for s in claims)


def _expected_minutes(steps, at_once: int) -> float:
    """The claim runs' minutes when none has run: ``at_once`` side by side, an alone step's runs
    (context extension) one after another."""
    return (sum(len(s.seeds) * s.minutes for s in steps if not s.alone) / at_once
            + sum(len(s.seeds) * s.minutes for s in steps if s.alone))


def test_dry_run_estimates_the_claims_wall_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    reproduce.main(["--runs", str(runs), "--out", str(tmp_path / "results"), "--jobs", "2", "--dry-run"],
                   runner=lambda launch: 1 / 0)
    steps = plan("cpu", runs_dir=runs)
    expected = _expected_minutes(steps, at_once=2)
    assert all(s.minutes > 0 for s in steps) and any(s.alone for s in steps)
    assert f"about {expected:.0f} min with --jobs 2" in capsys.readouterr().out


def test_claims_can_be_chosen_and_an_unknown_id_is_refused(tmp_path: Path) -> None:
    steps = plan("cpu", runs_dir=tmp_path / "runs", only=("C3",))
    assert steps and {s.experiment for s in steps} == {"flipflop/cpu"}
    # a profile with table steps (cpu-full: pretrain, addition, benchmark, ...) runs only the claim
    everything = plan("cpu-full", runs_dir=tmp_path / "runs")
    only_c6 = plan("cpu-full", runs_dir=tmp_path / "runs", only=("C6",))
    assert len(everything) > len(only_c6) and all(s.match for s in only_c6)  # no table step
    assert {s.experiment for s in only_c6} == {"parity/cpu"}
    with pytest.raises(SystemExit, match="--claims C9: unknown"):
        reproduce.main(["--claims", "C9", "--dry-run", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path)])


def test_steps_can_be_chosen_and_an_unknown_name_is_refused(tmp_path: Path) -> None:
    launched: list[list[str]] = []

    def runner(launch: reproduce.Launch) -> int:
        launched.append(list(launch.argv))
        return 0

    reproduce.main(["--claims", "C3", "--steps", "C3-fire", "C3-alibi", "--runs", str(tmp_path / "runs"),
                    "--out", str(tmp_path / "results"), "--jobs", "2", "--no-report"], runner=runner)
    pes = sorted(a for argv in launched for a in argv if a.startswith("pe="))
    assert pes == ["pe=alibi", "pe=alibi", "pe=fire", "pe=fire"]  # two seeds each, nothing else
    with pytest.raises(SystemExit, match=r"--steps C3-nothing: no such step in this plan; its steps: .*C3-fire"):
        reproduce.main(["--claims", "C3", "--steps", "C3-nothing", "--dry-run", "--runs", str(tmp_path / "runs"),
                        "--out", str(tmp_path)])


def test_records_are_written_as_runs_finish_and_count_as_finished(tmp_path: Path) -> None:
    """Issue 22: each finished run leaves a record under <out>/records/ when its command returns;
    a later reproduction with an empty runs/ (a fresh clone) skips what the records hold."""
    runs, out = tmp_path / "runs", tmp_path / "results"
    records = out / "records"
    steps = plan("tables", runs_dir=runs, scrolls_data=None)
    seen: list[int] = []

    def count_records() -> int:
        """Finished records under records/, while another job may be renaming its record's
        temporary (hidden) folder into place: os.walk skips what vanishes, where rglob raised."""
        count = 0
        for _, folders, files in os.walk(records):
            folders[:] = [f for f in folders if not f.startswith(".")]
            count += "metrics.json" in files
        return count

    class Counting(FakeRunner):
        def __call__(self, launch: Launch) -> int:
            seen.append(count_records())
            return super().__call__(launch)

    runner = Counting(runs, out, fail=("fire",))
    execute(steps, runs, runner, log=lambda _: None, jobs=2, records_dir=records)
    finished = [r for r in find_runs(runs) if r.finished]
    assert len(find_runs(records)) == len(finished) >= 4 + 6  # addition, pretrain (fire failed), ...
    assert runner.calls[-1].startswith("python -m pipelines.benchmark")
    assert seen[-1] == len(finished)  # every record was there before the benchmark started
    shutil.rmtree(runs)
    again = FakeRunner(runs, out)
    execute(steps, runs, again, log=lambda _: None, jobs=2, records_dir=records)
    assert [c for c in again.calls if "pipelines.train" in c] == [  # only the runs that failed
        "python -m pipelines.train experiment=addition/cpu pe=fire seed=0",
        "python -m pipelines.train experiment=pretrain/cpu pe=fire seed=0"]


def test_gpu_profile_runs_only_the_gpu_claims_and_their_presets_compose(tmp_path: Path) -> None:
    from conftest import compose_config

    steps = plan("gpu", runs_dir=tmp_path / "runs")
    assert {s.experiment for s in steps} == {"addition_c1/gpu", "flipflop/gpu"}
    assert {s.name: s.seeds for s in steps}["C3g-tape"] == tuple(range(10))
    assert not any(s.experiment.endswith("/gpu") for s in plan("cpu", runs_dir=tmp_path / "runs"))
    c1 = compose_config("config", ["experiment=addition_c1/gpu", "pe=tape", "model.abacus=true"])
    assert (c1.model.n_layers, c1.model.d_model, c1.task.max_digits, c1.task.eval_max_digits) == (8, 512, 10, 20)
    assert c1.trainer.precision == "bf16-mixed" and c1.scale == "gpu"
    ff = compose_config("config", ["experiment=flipflop/gpu", "pe=rope"])
    assert (ff.task.seq_len, ff.task.eval_sequences, ff.experiment_name) == (512, 10000, "flipflop/gpu")


def test_keep_earlier_never_renames_onto_a_kept_file(tmp_path: Path) -> None:
    from pipelines.result_files import keep_earlier

    pair = [tmp_path / "efficiency.json", tmp_path / "efficiency.md"]
    for n in range(3):  # three results within one second
        for p in pair:
            p.write_text(f"{p.suffix} {n}")
            os.utime(p, (1_700_000_000, 1_700_000_000))
        keep_earlier(pair)
    kept = sorted(p.read_text() for p in tmp_path.iterdir())
    assert kept == [".json 0", ".json 1", ".json 2", ".md 0", ".md 1", ".md 2"]


def interrupted(runs: Path, experiment: str, pe: str, seed: int, name: str) -> Path:
    """An unfinished run that saved checkpoints/last.ckpt before it was stopped."""
    run = finish(runs, experiment, pe, seed, name, done=False)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    return run


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_interrupted_run_is_resumed_not_restarted(tmp_path: Path, jobs: int) -> None:
    """A rerun started an interrupted run again from step 0 (nothing passed ckpt_path), so a GPU
    window's cut-off run never accumulated."""
    runs = tmp_path / "runs"
    stopped = interrupted(runs, "addition/cpu", "tape", 0, "20261122-205210-0835a8-4")
    interrupted(runs, "addition/cpu", "fire", 0, "20261122-205210-0835a8-5")  # still training elsewhere:
    (runs / "addition/cpu/fire/0/20261122-205210-0835a8-5/run.lock").write_text(f"{os.getppid()} {os.uname().nodename}")
    finish(runs, "addition/cpu", "nope", 0, "20261122-205210-0835a8-6", done=False)  # no checkpoint: afresh
    steps = [step(plan("tables", runs_dir=runs, scrolls_data=None), "addition")]
    runner = FakeRunner(runs, tmp_path / "results")
    execute(steps, runs, runner, log=lambda _: None, jobs=jobs)
    resumed = [c for c in runner.calls if "ckpt_path=" in c]
    assert resumed == [f"python -m pipelines.train experiment=addition/cpu pe=tape seed=0 ckpt_path={stopped}"]
    started = " ".join(c for c in runner.calls if "ckpt_path=" not in c)
    assert "tape" not in started and all(pe in started for pe in ("rope", "randpe", "nope", "fire"))


def test_runs_finished_before_an_interruption_get_their_records(tmp_path: Path) -> None:
    """A Ctrl-C after a multirun's runs finished left them without records, and a rerun, having
    nothing to run, never wrote them."""
    runs, records = tmp_path / "runs", tmp_path / "results" / "records"
    steps = [step(plan("tables", runs_dir=runs, scrolls_data=None), "addition")]

    class Interrupted(FakeRunner):
        def __call__(self, launch: Launch) -> int:
            super().__call__(launch)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(steps, runs, Interrupted(runs, tmp_path / "results"), log=lambda _: None, records_dir=records)
    assert len(find_runs(records)) == len(find_runs(runs)) == 5
    shutil.rmtree(records)  # as after a crash before this fix: the runs are there, their records not
    execute(steps, runs, FakeRunner(runs, tmp_path / "results"), log=lambda _: None, records_dir=records)
    assert len(find_runs(records)) == 5


def test_out_and_runs_must_be_folders_apart(tmp_path: Path) -> None:
    """--out inside --runs nested the records one level deeper each launch; an --out that is a
    file crashed after runs had started."""
    (tmp_path / "results.txt").write_text("")
    for args, message in ((["--out", str(tmp_path / "results.txt")], "--out .* is a file"),
                          (["--runs", str(tmp_path / "results.txt")], "--runs .* is a file"),
                          (["--runs", str(tmp_path / "r"), "--out", str(tmp_path / "r" / "report")], "inside --runs")):
        with pytest.raises(SystemExit, match=message):
            reproduce.main(["--profile", "tables", "--no-report", *args], runner=lambda launch: 1 / 0)
    assert not (tmp_path / "r").exists()


def test_duplicate_seeds_count_once_and_the_estimate_runs_no_more_at_once_than_cores(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    reproduce.main(["--profile", "tables", "--steps", "addition", "--seeds", "1", "1", "--dry-run",
                    "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")], runner=lambda launch: 1 / 0)
    printed = capsys.readouterr().out
    assert "| addition | 0 | 0 | 5 |" in printed  # seed 1 once
    assert "wall time" not in printed and "the dry run took" in printed  # nothing ran: no wall times
    reproduce.main(["--profile", "cpu-full", "--jobs", "8", "--dry-run", "--runs", str(tmp_path / "runs"),
                    "--out", str(tmp_path / "out")], runner=lambda launch: 1 / 0)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("estimate:"))
    steps = plan("cpu-full", runs_dir=tmp_path / "runs")
    expected = _expected_minutes(steps, at_once=2)  # 2 cores: 2 at once, not 8
    assert f"about {expected:.0f} min with --jobs 8 (2 at once here)" in line and "benchmark" in line


def test_pretraining_runs_kept_only_as_records_are_run_again_for_scrolls(tmp_path: Path) -> None:
    """In a clone with committed records, pretraining counted as finished, so every SCROLLS run
    failed: it fine-tunes a pretraining run's checkpoint, which a record does not hold."""
    runs, records, data = tmp_path / "runs", tmp_path / "results" / "records", tmp_path / "scrolls"
    pes = step(plan("tables", runs_dir=runs, scrolls_data=None), "pretrain").pes
    for seed in (0,):
        for pe in pes:
            run = finish(tmp_path / "elsewhere", "pretrain/cpu", pe, seed, "20261122-205210-0835a8-0")
            shutil.copytree(run, records / run.relative_to(tmp_path / "elsewhere"),
                            ignore=shutil.ignore_patterns("checkpoints"))
    assert not step(plan("tables", runs_dir=runs, scrolls_data=None), "pretrain").feeds  # no SCROLLS data here
    assert pending(step(plan("tables", runs_dir=runs, scrolls_data=None), "pretrain"), find_runs(records)) == []
    for split in ("train", "validation"):
        (data / "qasper").mkdir(parents=True, exist_ok=True)
        (data / "qasper" / f"{split}.jsonl").write_text("{}\n")
    steps = [s for s in plan("tables", runs_dir=runs, scrolls_data=data) if s.name in ("pretrain", "scrolls")]
    assert step(steps, "pretrain").feeds
    runner = FakeRunner(runs, tmp_path / "results")
    execute(steps, runs, runner, log=lambda _: None, jobs=2, records_dir=records)
    assert len([c for c in runner.calls if "experiment=pretrain/cpu" in c]) == len(pes)


@pytest.mark.parametrize(("value", "text"), [(None, "null"), (True, "true"), ([1, "a"], "[1,a]"), (4, "4")])
def test_an_arm_value_reaches_hydra_as_hydra_reads_it(value: object, text: str) -> None:
    """An arm pinning an option to null must launch with `null`: Hydra reads `None` as a string."""
    assert _override(value) == text
