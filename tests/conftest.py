"""Shared fixtures for the pipeline tests: the real Hydra configs, composed and then shrunk
(lightning-hydra-template style), with every output under pytest's tmp_path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
SMOKE = ["experiment=addition/smoke", "logger=none"]

# A property fails on a wrong answer, not on a busy core: no per-example wall-clock limit.
settings.register_profile("tape-repro", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tape-repro")


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


def absolute_pythonpath(value: str, base: Path) -> str:
    """``value`` (a PYTHONPATH) with each relative entry made absolute against ``base``."""
    return os.pathsep.join(str((base / p).resolve()) if p and not os.path.isabs(p) else p
                           for p in value.split(os.pathsep))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto``), each worker gets its share of the
    cores, and so do the processes its tests start (through OMP_NUM_THREADS), so that no thread
    pool oversubscribes the machine. Tests that start commands in another folder keep a relative
    PYTHONPATH (``PYTHONPATH=. pytest`` without ``make install``) pointing where it pointed."""
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = absolute_pythonpath(os.environ["PYTHONPATH"], Path.cwd())
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``-m cuda`` tests need a GPU, and tests marked with an optional package (``wandb``,
    ``datasets``, ``rouge_score``: tape.optional.PINS) need it: elsewhere they are skipped, with
    the reason in the summary."""
    import torch

    from tape.optional import PINS, missing

    skips = {name: pytest.mark.skip(reason=f"optional: {why}") for name in PINS if (why := missing(name))}
    if not torch.cuda.is_available():
        skips["cuda"] = pytest.mark.skip(reason="needs a CUDA GPU (none here); run them on one with make gpu-check")
    for item in items:
        for keyword, skip in skips.items():
            if keyword in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never reach the network: W&B offline, Hugging Face offline."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _fp32_matmuls_stay_exact() -> Iterator[None]:
    """pipelines.train turns on TF32 matmuls for its process; a test that trains in-process must
    not loosen the float32 tolerances of the tests after it in the same worker."""
    import torch

    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


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


# ---------------------------------------------------------------------------- text data
INVENTED_VOCAB = 300
_WORDS = "the king and queen of the land spake unto them saying come hither now thou art".split()


def invented_documents(prefix: str, n: int, words: int = 600) -> list:
    """Invented documents (seeded by prefix) standing in for the books corpus in tests."""
    import random

    from tape.data.corpus import Document

    rng = random.Random(prefix)
    return [Document(f"{prefix}/{i:03d}", " ".join(rng.choice(_WORDS) for _ in range(words)))
            for i in range(n)]


@pytest.fixture(scope="session")
def invented_text_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data_dir whose 'books' corpus (BPE of INVENTED_VOCAB tokens, 20 % held out) is built
    from invented documents exactly as prepare_text_data builds the real one."""
    from tape.data.text import prepare_text_data

    root = tmp_path_factory.mktemp("text_data")
    corpora = {"books": invented_documents("b", 40), "stdlib": invented_documents("s", 2)}
    prepare_text_data(root, vocab_size=INVENTED_VOCAB, heldout_percent=20, load=corpora.__getitem__)
    return root
