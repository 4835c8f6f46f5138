"""A new task is ``pipelines/tasks/<x>.py`` plus ``conf/task/<x>.yaml`` and an experiment preset:
added to a copy of the project with no other file changed, it is a known task, trains from the
command line, writes its metrics and names its W&B table."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from project_copy import REPO, copy_project, run_python

TOY_TASK = textwrap.dedent('''
    """Toy: repeat a random string (the second half copies the first), for the extension test."""

    from __future__ import annotations

    import csv
    from pathlib import Path
    from typing import Any, Iterator

    import lightning as L
    import torch
    from omegaconf import DictConfig
    from torch.utils.data import DataLoader, IterableDataset

    from pipelines.errors import PipelineConfigError
    from pipelines.tasks import register
    from pipelines.tasks.base import Task, WandbTable

    VOCAB = 8


    def copy_batch(seed: int, index: int, n: int, half: int) -> dict[str, torch.Tensor]:
        """n strings of 2 * half tokens; only the copied half is scored."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        x = torch.randint(0, VOCAB, (n, half), generator=g)  # (n, half)
        ids = torch.cat([x, x], dim=1)  # (n, 2 * half)
        labels = ids.clone()
        labels[:, :half] = -100
        return {"input_ids": ids, "labels": labels}


    class CopyStream(IterableDataset):
        def __init__(self, seed: int, n: int, half: int) -> None:
            self.seed, self.n, self.half = seed, n, half

        def __iter__(self) -> Iterator[dict[str, Any]]:
            index = 0
            while True:
                yield {**copy_batch(self.seed, index, self.n, self.half), "batch_index": index}
                index += 1


    class CopyData(L.LightningDataModule):
        vocab_size = VOCAB

        def __init__(self, seed: int, batch_size: int, half: int) -> None:
            super().__init__()
            self.seed, self.batch_size, self.half = seed, batch_size, half

        def train_dataloader(self) -> DataLoader:
            return DataLoader(CopyStream(self.seed, self.batch_size, self.half), batch_size=None)

        def val_dataloader(self) -> DataLoader:
            b = copy_batch(self.seed, -1, self.batch_size, self.half)
            rows = [{"input_ids": i, "labels": y} for i, y in zip(b["input_ids"], b["labels"])]
            return DataLoader(rows, batch_size=self.batch_size)


    @register("toy_copy")
    class ToyCopy(Task):
        wandb_tables = {"toy_copy.csv": WandbTable("eval/toy_copy")}

        def validate(self, cfg: DictConfig) -> None:
            if int(cfg.task.seq_len) != 2 * int(cfg.task.half):
                raise PipelineConfigError(f"task.seq_len={cfg.task.seq_len} must be 2 * task.half")

        def datamodule(self, cfg: DictConfig) -> CopyData:
            return CopyData(int(cfg.seed), int(cfg.task.batch_size), int(cfg.task.half))

        def evaluate(self, model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, float]:
            half = int(task_cfg.half)
            b = copy_batch(1, 0, 16, half)
            with torch.no_grad():
                logits = model(b["input_ids"].to(next(model.parameters()).device)).logits  # (B, N, V)
            guess = logits[:, half - 1:-1].argmax(-1).cpu()  # (B, half): position t predicts t+1
            accuracy = 100.0 * float((guess == b["input_ids"][:, half:]).float().mean())
            with open(Path(out_dir) / "toy_copy.csv", "x", newline="") as f:
                csv.writer(f).writerows([["half", "accuracy"], [half, accuracy]])
            return {"copy_accuracy": accuracy}
''')
TOY_TASK_CONF = "name: toy_copy\nvocab_size: 8\nhalf: 4\nseq_len: 8\nbatch_size: 8\n"
TOY_SMOKE = textwrap.dedent("""\
    # @package _global_
    defaults:
      - override /task: toy_copy
      - override /model: tiny
      - override /trainer: cpu

    experiment_name: toy_copy/smoke
    scale: smoke

    trainer:
      max_steps: 4
      val_check_interval: 2
      log_every_n_steps: 1

    optim:
      warmup_steps: 1
""")
ADDED = ("pipelines/tasks/toy_copy.py", "conf/task/toy_copy.yaml", "conf/experiment/toy_copy/smoke.yaml")


@pytest.fixture(scope="module")
def project_with_toy(tmp_path_factory) -> Path:
    """A copy of the project with the toy task's three files added and nothing else changed."""
    return copy_project(tmp_path_factory.mktemp("project"),
                        dict(zip(ADDED, (TOY_TASK, TOY_TASK_CONF, TOY_SMOKE))))


def test_only_the_toy_files_differ_from_the_project(project_with_toy: Path) -> None:
    for folder in ("tape", "conf", "pipelines"):
        copied = {p.relative_to(project_with_toy) for p in (project_with_toy / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts}
        ours = {p.relative_to(REPO) for p in (REPO / folder).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
        assert copied - ours == {Path(a) for a in ADDED if a.startswith(folder)}
        assert all((project_with_toy / p).read_bytes() == (REPO / p).read_bytes() for p in ours)


def test_a_new_task_is_known_and_names_its_wandb_table(project_with_toy: Path) -> None:
    proc = run_python(project_with_toy, "-c", "from pipelines import tasks; "
                      "print('toy_copy' in tasks.names(), tasks.wandb_tables()['toy_copy.csv'].key)")
    assert proc.stdout.split() == ["True", "eval/toy_copy"], proc.stderr[-3000:]


@pytest.mark.slow
def test_a_new_task_trains_from_the_command_line(project_with_toy: Path, tmp_path: Path) -> None:
    train = run_python(project_with_toy, "-m", "pipelines.train", "experiment=toy_copy/smoke", "pe=rope",
                       "logger=none", f"paths.runs_dir={tmp_path}/runs")
    assert train.returncode == 0, train.stderr[-3000:]
    (metrics_path,) = (tmp_path / "runs").rglob("metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["task"] == "toy_copy" and metrics["steps"] == 4
    assert 0.0 <= metrics["copy_accuracy"] <= 100.0
    assert (metrics_path.parent / "toy_copy.csv").is_file()
    bad = run_python(project_with_toy, "-m", "pipelines.train", "experiment=toy_copy/smoke", "task.half=3",
                     "logger=none", f"paths.runs_dir={tmp_path}/bad")
    assert bad.returncode != 0 and "task.seq_len=8 must be 2 * task.half" in bad.stderr + bad.stdout
