"""Shared fixtures for the pipeline tests: the real Hydra configs, composed and then shrunk
(lightning-hydra-template style), with every output under pytest's tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
SMOKE = ["experiment=addition/smoke", "logger=none"]


def compose_config(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose conf/<config_name>.yaml exactly as the command line would (with the hydra node,
    so ${hydra:...} interpolations resolve), then drop the hydra node as Hydra does for a job."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never reach the network: W&B offline, Hugging Face offline."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    """make_cfg(*overrides, name="run") -> the train config for the smoke preset, with runs under
    tmp_path/runs and this run's directory at runs/<experiment>/<pe>/<seed>/<name>."""

    def make(*overrides: str, name: str = "run", runs_dir: Path | None = None) -> DictConfig:
        cfg = compose_config("config", [*SMOKE, *overrides])
        runs = Path(runs_dir or tmp_path / "runs")
        with open_dict(cfg):
            cfg.paths.root_dir = str(tmp_path)
            cfg.paths.runs_dir = str(runs)
            cfg.paths.output_dir = str(
                runs / cfg.experiment_name / cfg.pe.name / str(cfg.seed) / name
            )
            cfg.callbacks.rich_progress_bar = None  # keep pytest's output readable
            cfg.trainer.enable_progress_bar = False
            cfg.trainer.enable_model_summary = False
        return cfg

    yield make
    GlobalHydra.instance().clear()
