"""The entry points as a user runs them (subprocesses): multirun, DDP on CPU, concurrent runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from warm_python import run_module

QUIET = ["logger=csv", "callbacks.rich_progress_bar=null", "+trainer.enable_progress_bar=false",
         "+trainer.enable_model_summary=false"]


def run(args: list[str], root: Path) -> subprocess.CompletedProcess:
    """Run the entry point as a user would, from ``root`` (outputs go to root/runs)."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return run_module("pipelines.train", args, root, env)


def runs_of(root: Path, pe: str = "rope") -> list[Path]:
    return sorted(p for p in (root / "runs/addition/smoke" / pe / "0").iterdir())


@pytest.mark.slow
def test_multirun_gives_each_job_its_own_dir_and_survives_a_failed_job(tmp_path: Path) -> None:
    # Four jobs with the same experiment, PE and seed, started in the same process and second;
    # two resume a checkpoint that is not there (found only when the job starts: the sweep's
    # settings pass its checks) and must not stop the others.
    # `-m` after an override: Hydra's parser took the overrides after it as unknown arguments
    out = run(["experiment=addition/smoke", "task.seq_len=16,20", "-m", "ckpt_path=null,gone.ckpt", *QUIET],
              tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode != 0 and both.count("ckpt_path=gone.ckpt: gone.ckpt does not exist") == 2, both
    assert "Traceback" not in both
    dirs = runs_of(tmp_path)  # the failed jobs failed their checks and left no directory
    assert len(dirs) == 2 and len({d.name for d in dirs}) == 2
    assert [d.name.rsplit("-", 1)[1] for d in dirs] == ["0", "2"]  # job numbers
    done = [json.loads((d / "metrics.json").read_text()) for d in dirs if (d / "metrics.json").exists()]
    assert len(done) == 2 and all(m["steps"] == 6 for m in done)
    assert "(failed)" in out.stdout and out.stdout.count("run dir: ") == 4
    summary = out.stdout[out.stdout.index("==== multirun: 2 of 4 jobs finished"):]
    assert summary.count(" ok ") == 2 and summary.count("FAILED") == 2 and "mean_accuracy" in summary
    assert len(list((tmp_path / "runs/multirun").glob("*/multirun.yaml"))) == 1
    commands = sorted((d / "command.txt").read_text().splitlines()[0] for d in dirs
                      if (d / "command.txt").exists())
    assert commands[0].startswith("python -m pipelines.train ") and "-m" not in commands[0].split()[3:]
    assert "task.seq_len=16" in commands[0] and "task.seq_len=20" in commands[1]


def test_a_sweep_with_an_impossible_value_starts_no_job(tmp_path: Path) -> None:
    """Its settings are checked for every job first: nothing trains, nothing is written under runs/."""
    out = run(["-m", "experiment=addition/smoke", "task.seq_len=16,12", *QUIET], tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "1 of the sweep's 2 jobs would fail their checks, so none was started" in out.stderr
    assert "task.seq_len=12: task.max_digits=3 needs 13-token training examples" in out.stderr
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path: Path) -> None:
    out = run(["experiment=addition/smoke", "trainer=ddp", "trainer.accelerator=cpu",
               "trainer.devices=2", *QUIET], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = runs_of(tmp_path)  # the second process wrote into rank 0's directory only
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 6 and 0 <= metrics["mean_accuracy"] <= 100
    assert (run_dir / "train_ddp_process_1.log").exists()  # rank 1 really ran, here
    assert out.stdout.count("run dir: ") == 1


@pytest.mark.slow
def test_runs_started_together_get_different_dirs(tmp_path: Path) -> None:
    args = ["experiment=addition/smoke", "trainer.max_steps=3", "trainer.val_check_interval=3",
            "evaluate=false", *QUIET]
    env = {**os.environ, "WANDB_MODE": "offline"}
    with ThreadPoolExecutor(2) as pool:  # two processes at once, each forked warm
        done = list(pool.map(lambda _: run_module("pipelines.train", args, tmp_path, env), range(2)))
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    dirs = runs_of(tmp_path)
    assert len(dirs) == 2 and all((d / "metrics.json").is_file() for d in dirs)


def test_progress_lines_when_output_goes_to_a_file(caplog, monkeypatch) -> None:
    """Issue 23: with output redirected, a 20-minute run printed nothing until the end."""
    import logging
    from types import SimpleNamespace

    import torch

    from pipelines.callbacks import ProgressLog

    now = [0.0]
    cb = ProgressLog(interval_s=60, clock=lambda: now[0], force=True)
    trainer = SimpleNamespace(global_step=0, max_steps=1000, is_global_zero=True,
                              callback_metrics={"train/loss": torch.tensor(2.5), "train/tokens_per_s": torch.tensor(900.0)})
    with caplog.at_level(logging.INFO, logger="pipelines.train"):
        for step in range(1, 301):
            now[0], trainer.global_step = step * 0.5, step  # 2 steps a second
            cb.on_train_batch_end(trainer, None, None, None, step)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) == 2  # at 60 s and 120 s of the 150 s
    assert lines[0] == "step 121/1000  loss 2.5000  tokens/s 900  left 00:07:19"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert not ProgressLog().active  # a terminal has the progress bar
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert ProgressLog().active


def test_the_demo_trains_both_encodings_and_writes_its_report(tmp_path: Path) -> None:
    """make demo's smoke equivalent: the same code on flipflop/smoke at two seeds."""
    from pipelines import demo

    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--experiment", "flipflop/smoke", "--seeds", "0", "1"]) == 0
    text = (out / "report" / "README.md").read_text()
    assert "figures/claim_demo.png" in text and (out / "report" / "figures" / "claim_demo.png").is_file()
    assert "Paired over 2 seeds" in text and "described" in text  # a demo never gets a verdict
    assert "6 steps" in text and "300 steps" not in text  # flipflop/smoke's trainer.max_steps
    assert len([p for p in (out / "runs" / "flipflop" / "smoke").glob("*/*/*") if p.is_dir()]) == 4


def fake_demo_training(calls: list[list[str]], ood: float):
    """A stand-in for ``pipelines.demo.train``: writes what a multirun of flipflop/smoke leaves
    (config.yaml, metrics.json; read error ``ood + seed``) under a new sweep id per call."""
    def train(experiment: str, seeds, runs_dir: Path, extra=()) -> int:
        calls.append(list(extra))
        sweep = f"20261129-1200{len(calls):02d}-abc{len(calls):03d}"
        for job, (pe, seed) in enumerate((pe, s) for pe in ("rope", "tape") for s in seeds):
            run = runs_dir / experiment / pe / str(seed) / f"{sweep}-{job}"
            run.mkdir(parents=True)
            run.joinpath("config.yaml").write_text(
                "task: {name: flipflop, seq_len: 16}\nmodel: {n_layers: 2, d_model: 32}\n"
                "trainer: {max_steps: 6}\noptim: {lr: %s}\n" % (extra[0].split("=")[1] if extra else "0.001"))
            metrics = {"experiment": experiment, "pe": pe, "seed": seed, "task": "flipflop", "scale": "smoke",
                       "read_error_ood": ood + seed, "read_error_1x": 0.0, "steps": 6,
                       **{f"read_error_{m}x": ood + seed for m in (2, 3, 4)}}
            run.joinpath("metrics.json").write_text(json.dumps(metrics))
            run.joinpath("command.txt").write_text("python -m pipelines.train\n")
        return 0
    return train


def test_a_second_demo_into_the_same_out_keeps_the_first_report_and_reads_only_its_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two demos into one --out (the second at another learning rate): the first report stays
    as it was; the second, beside it, averages and tabulates only the second call's runs."""
    from pipelines import demo

    out, calls = tmp_path / "demo", []
    argv = ["--out", str(out), "--experiment", "flipflop/smoke", "--seeds", "0", "1"]
    monkeypatch.setattr(demo, "train", fake_demo_training(calls, ood=10.0))
    assert demo.main(argv) == 0
    first = (out / "report" / "README.md").read_bytes()
    monkeypatch.setattr(demo, "train", fake_demo_training(calls, ood=40.0))
    assert demo.main([*argv, "--", "optim.lr=0.05"]) == 0 and calls == [[], ["optim.lr=0.05"]]

    assert (out / "report" / "README.md").read_bytes() == first  # kept (the old demo overwrote it)
    [second] = [p for p in out.glob("report-*")]
    assert second.name == "report-20261129-120002-abc002"  # the second call's sweep id
    text = (second / "README.md").read_text()
    assert (second / "figures" / "claim_demo.png").is_file()
    rows = [line for line in text.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert rows == ["| 0 | 40.00 | 40.00 | +0.00 |", "| 1 | 41.00 | 41.00 | +0.00 |"]  # one run a seed
    assert "Paired over 2 seeds" in text and "10.00" not in text and "4 runs" in text
    assert "6 steps" in text and "300 steps" not in text
    assert "| 0 | 10.00 |" in first.decode()


@pytest.mark.parametrize("experiment, extra, says", [
    ("addition/smoke", [], "trains task 'addition'"),
    ("nope/x", [], "no such experiment"),
    ("flipflop/smoke", ["task=addition"], "task is the demo's own setting; use --experiment"),
    ("flipflop/smoke", ["seed=3"], "use --seeds"),
])
def test_the_demo_refuses_what_it_cannot_report_before_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        experiment: str, extra: list[str], says: str) -> None:
    """addition/smoke used to train, then fail on a KeyError: 'read_error_ood' traceback."""
    from pipelines import demo

    calls: list[list[str]] = []
    monkeypatch.setattr(demo, "train", fake_demo_training(calls, ood=10.0))
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--experiment", experiment, "--seeds", "0", "--", *extra]) == 2
    err = capsys.readouterr().err
    assert calls == [] and not out.exists()  # nothing trained, nothing written
    assert says in err and err.startswith("pipelines.demo: ")
    if not extra:  # a preset it cannot report: the message lists those it can
        assert "flipflop/demo" in err and "flipflop/smoke" in err


REPO = Path(__file__).resolve().parents[1]


def make(target: str, cwd: Path, *variables: str, path: str = "") -> subprocess.CompletedProcess:
    """``make -f <repo>/Makefile <target> <variables>`` run from ``cwd``; ``path`` goes first on PATH."""
    env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}" if path else os.environ["PATH"]}
    env.pop("OUT", None)
    return subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"), target, *variables],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_make_bench_writes_where_out_says(tmp_path: Path) -> None:
    assert "output_dir=" not in make("bench", tmp_path, "-n").stdout  # the default: runs/benchmark/<scale>
    out = make("bench", tmp_path, "-n", "OUT=bench")
    assert f"-m pipelines.benchmark output_dir={tmp_path / 'bench'}" in out.stdout, out.stdout + out.stderr


def test_make_notebook_never_overwrites_an_earlier_notebook(tmp_path: Path) -> None:
    """A stand-in jupyter (BIN=) and a clock stopped at one second: the second `make notebook`
    would write the same name, and is refused; OUT= moves the copy, the default stays runs/notebook/."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").write_text("#!/bin/sh\necho 20990101-000000\n")
    (bin_dir / "jupyter").write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in --output=*) o="${a#--output=}";; '
                                     'esac; done\necho "executed on $TAPE_RESULTS" >> "$o.ipynb"\n')
    for tool in ("date", "jupyter"):
        (bin_dir / tool).chmod(0o755)
    args = (f"BIN={bin_dir}", f"RESULTS={tmp_path / 'rendered'}")
    first = make("notebook", tmp_path, *args, "OUT=nb", path=str(bin_dir))
    copy = tmp_path / "nb" / "results-20990101-000000.ipynb"
    assert first.returncode == 0 and copy.read_text() == f"executed on {tmp_path / 'rendered'}\n", first.stderr
    again = make("notebook", tmp_path, *args, "OUT=nb", path=str(bin_dir))
    assert again.returncode != 0 and f"{copy} exists" in again.stderr and "OUT=" in again.stderr
    assert copy.read_text() == f"executed on {tmp_path / 'rendered'}\n"  # executed once, kept
    assert make("notebook", tmp_path, *args, path=str(bin_dir)).returncode == 0
    assert (tmp_path / "runs" / "notebook" / "results-20990101-000000.ipynb").is_file()
