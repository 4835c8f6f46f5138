"""What the tests of the variable-length synthetic tasks (parity, MQAR) check alike: a config
prepared and validated, a bad setting refused in one line, a preset valid as written, and a
smoke run whose metrics.json a re-evaluation of the run repeats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from omegaconf import DictConfig, open_dict

from conftest import compose_config
from pipelines.errors import PipelineConfigError
from pipelines.evaluate import evaluate
from pipelines.fits import GIB, step_floor_bytes, training_step
from pipelines.tasks.base import Task
from pipelines.train import train


def checked(make_cfg: Callable[..., DictConfig], task: Task, experiment: str, *overrides: str) -> DictConfig:
    """The train config of ``experiment`` with ``overrides``, prepared and validated by ``task``."""
    cfg = make_cfg(f"experiment={experiment}", *overrides)
    task.prepare(cfg)
    task.validate(cfg)
    return cfg


def assert_refused_in_one_line(make_cfg: Callable[..., DictConfig], task: Task, experiment: str,
                               override: str, message: str) -> None:
    with pytest.raises(PipelineConfigError, match=message) as err:
        checked(make_cfg, task, experiment, *override.split())
    assert "\n" not in str(err.value)


def assert_preset_valid(task: Task, family: str, preset: str, *overrides: str) -> DictConfig:
    """The preset as written (sizes included) passes the task's checks, and its training step,
    sized once prepared, is under the 8 GiB tests/test_fits.py allows a non-paper preset."""
    cfg = compose_config("config", [f"experiment={family}/{preset}", *overrides])
    task.prepare(cfg)
    task.validate(cfg)
    step = training_step(cfg)
    assert step is not None and step_floor_bytes(step) < 8 * GIB, step
    assert cfg.experiment_name == f"{family}/{preset}" and cfg.scale == preset
    assert cfg.trainer.max_steps % cfg.trainer.val_check_interval == 0
    return cfg


def smoke_run(make_cfg: Callable[..., DictConfig], family: str, pe: str, *overrides: str) -> tuple[Path, dict[str, Any]]:
    """Train ``<family>/smoke`` through pipelines.train: (run dir, its metrics.json)."""
    cfg = make_cfg(f"experiment={family}/smoke", f"pe={pe}", *overrides)
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["task"] == cfg.task.name and saved["pe"] == pe and saved["steps"] == cfg.trainer.max_steps
    assert saved == json.loads(json.dumps(metrics))
    return run, saved


def assert_reevaluation_repeats(run: Path, saved: dict[str, Any], prefixes: tuple[str, ...]) -> None:
    """pipelines.evaluate on the finished run gives the metrics starting with ``prefixes`` again."""
    ecfg = compose_config("evaluate", [f"run_dir={run}"])
    with open_dict(ecfg):
        ecfg.paths.output_dir = str(run / "eval" / "again")
    again = evaluate(ecfg)
    assert {k: v for k, v in again.items() if k.startswith(prefixes)} == {
        k: v for k, v in saved.items() if k.startswith(prefixes)}
