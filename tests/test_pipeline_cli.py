"""The entry points as a user runs them (subprocesses): multirun, DDP on CPU, concurrent runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

QUIET = ["logger=csv", "callbacks.rich_progress_bar=null", "+trainer.enable_progress_bar=false",
         "+trainer.enable_model_summary=false"]


def run(args: list[str], root: Path) -> subprocess.CompletedProcess:
    """Run the entry point as a user would, from ``root`` (outputs go to root/runs)."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "pipelines.train", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


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
    cmd = [sys.executable, "-m", "pipelines.train", *args]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
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
    assert len([p for p in (out / "runs" / "flipflop" / "smoke").glob("*/*/*") if p.is_dir()]) == 4
