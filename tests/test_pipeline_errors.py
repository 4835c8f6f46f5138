"""Bad input on the command line, as a user types it (issue 14): one message naming the key,
no traceback (HYDRA_FULL_ERROR=1 shows it), nothing written, and no Lightning/torch import
before the arguments are checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from warm_python import run_module

REPO = Path(__file__).resolve().parents[1]


def cli(args: list[str], root: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env = {**base, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **env}
    return run_module("pipelines.train", args, root, full_env)


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (root / "runs").glob("*/*/*/*/*") if p.is_dir()) if (root / "runs").exists() else []


def test_entry_module_imports_no_heavy_library() -> None:
    """A typo is reported before torch, Lightning or transformers load (seconds, not 15-24 s)."""
    code = ("import sys, pipelines.train, pipelines.entry, pipelines.preflight; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_optimiser_value_is_refused_before_torch_loads() -> None:
    """tape.schedule imported torch at import, so `optim.lr=-1` took 4 s to report, not 1.3."""
    code = """
import sys
from pipelines.config_checks import check_optim
from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import compose_or_none
cfg = compose_or_none("config", ["experiment=addition/smoke", "optim.lr=-1", "optim.schedule=cosnie"])
try:
    check_optim(cfg)
except PipelineConfigError as err:
    print(err)
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr
    message, loaded = out.stdout.strip().splitlines()
    assert "optim.lr=-1: must be > 0" in message and "optim.schedule=cosnie" in message
    assert loaded == "False"


def test_every_training_tasks_checks_run_before_lightning_loads() -> None:
    """Most tasks imported their Lightning data module at import, so a typo in a flipflop or
    counting run took 12 s to report (Lightning, torchmetrics and transformers loading) where
    addition took 4; context extension loaded its stages (Lightning) and tape.hf (transformers)
    before its checks."""
    code = """
import pathlib, sys
from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import compose_or_none
from pipelines.train import check_settings
for smoke in sorted(pathlib.Path("conf/experiment").glob("*/smoke.yaml")):
    experiment = f"{smoke.parent.name}/smoke"
    cfg = compose_or_none("config", [f"experiment={experiment}", "pe=tape", "logger=csv"])
    try:
        check_settings(cfg)
    except PipelineConfigError:  # scrolls refuses at prepare: no task.pretrained_run here
        pass
    print(experiment)
print(sorted(m for m in ("lightning", "transformers", "torchmetrics") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr
    *checked, loaded = out.stdout.split()
    assert "context_extension/smoke" in checked and len(checked) >= 11, out.stdout
    assert loaded == "[]", out.stdout


@pytest.mark.wandb
def test_a_config_error_prints_once_without_traceback_and_leaves_no_run(tmp_path: Path) -> None:
    out = cli(["experiment=addition/smoke", "task.max_digits=0"], tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1
    assert both.count("task.max_digits=0 must be >= 1") == 1, both
    assert "Traceback" not in both
    assert run_dirs(tmp_path) == []  # the failed try left nothing the report would count
    assert not (tmp_path / "runs").exists()  # not even the empty <experiment>/<pe>/<seed> folders
    full = cli(["experiment=addition/smoke", "task.max_digits=0"], tmp_path, HYDRA_FULL_ERROR="1")
    assert full.returncode == 1 and "Traceback" in full.stderr


def test_an_existing_run_dir_is_refused_before_hydra_writes_into_it(tmp_path: Path) -> None:
    run = tmp_path / "runs/addition/smoke/rope/0/20261123-100000-aaaaaa"
    (run / ".hydra").mkdir(parents=True)
    files = {run / "command.txt": "python -m pipelines.train\n", run / "train.log": "the old log\n",
             run / ".hydra/config.yaml": "seed: 0\n", run / ".hydra/hydra.yaml": "hydra: {}\n",
             run / ".hydra/overrides.yaml": "[]\n"}
    for path, text in files.items():
        path.write_text(text)
    out = cli(["experiment=addition/smoke", f"hydra.run.dir={run}"], tmp_path)
    assert out.returncode == 1
    assert f"hydra.run.dir={run} already belongs to another run" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert {p: p.read_text() for p in files} == files
    assert sorted(p.name for p in run.rglob("*")) == sorted(
        [".hydra", "command.txt", "train.log", "config.yaml", "hydra.yaml", "overrides.yaml"])


def test_an_unwritable_runs_dir_is_one_message_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    for argv in (["experiment=addition/smoke", f"paths.runs_dir={tmp_path / 'a_file/runs'}"],
                 ["-m", "experiment=addition/smoke", "pe=rope,tape", f"paths.runs_dir={tmp_path / 'a_file/runs'}"]):
        out = cli(argv, tmp_path)
        assert out.returncode == 1
        assert out.stderr.startswith("paths.runs_dir=") and len(out.stderr.splitlines()) == 1
        assert ": not a writable folder" in out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.wandb
@pytest.mark.slow
def test_resume_progress_counts_steps_not_epochs(tmp_path: Path) -> None:
    """The bar read "Epoch 0/-2" and, after a resume, "600/499"; nor any known noise."""
    quiet = ["experiment=addition/smoke", "logger=wandb", "trainer.max_steps=12", "trainer.val_check_interval=6"]
    first = cli(quiet, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    both = first.stdout + first.stderr
    assert "12/12" in both and "Epoch 0/-2" not in both
    for noise in ("litlogger", "anonymous setting", "LeafSpec", "Total FLOPs", "Seed set to"):
        assert noise not in both, noise
    assert both.count("GPU available") == 1  # Lightning's lines printed once, not twice
    assert "---- train done: experiment=addition/smoke pe=rope seed=0" in both


@pytest.mark.parametrize("override", ["seed=abc", "trainer.max_steps=abc", "task.max_digits=x"])
def test_a_value_of_the_wrong_type_is_named_not_a_traceback(override: str, tmp_path: Path) -> None:
    out = cli(["experiment=addition/smoke", "logger=csv", override], tmp_path)
    key, value = override.split("=")
    assert out.returncode == 1
    assert f"{key}='{value}' must be an integer" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("override, message", [
    ("pe.rope_theta=abc", "rope_theta='abc' (str) is not one of: float (pe='tape')"),
    ("pe.rope_theta=-5", "rope_theta=-5 must be > 0"),
    ("pe.rope_yarn_factor=2", "rope_yarn_factor=2 needs rope_yarn_original_length"),
])
def test_an_encoding_option_of_the_wrong_type_or_range_is_refused_before_any_folder(
        override: str, message: str, tmp_path: Path) -> None:
    out = cli(["experiment=addition/smoke", "pe=tape", "logger=csv", override], tmp_path)
    assert out.returncode == 1 and message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value,message", [
    ("optim.lr=-1", "optim.lr=-1: must be > 0"),
    ("optim.betas=[0.9,1.5]", "optim.betas=[0.9, 1.5]: two values in [0, 1)"),
    ("optim.schedule=cosnie", "optim.schedule=cosnie: choose one of"),
])
def test_optimiser_values_torch_would_reject_are_refused_before_any_folder(tmp_path: Path, value: str,
                                                                          message: str) -> None:
    out = cli(["experiment=addition/smoke", "logger=none", value], tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and message in both and "Traceback" not in both, both
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("typo,message", [
    ("trainer.max_step=10", "unknown key trainer.max_step; did you mean trainer.max_steps?"),
    ("sed=1", "unknown key sed; did you mean seed?"),
])
def test_a_typo_names_the_nearest_keys(tmp_path: Path, typo: str, message: str) -> None:
    out = cli(["experiment=addition/smoke", "logger=none", typo], tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and message in both and "Traceback" not in both, both
    assert "To append to your config use" not in both  # Hydra's hint points the wrong way for a typo
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,message", [
    (["task=pretrain"], "experiment=addition/smoke trains task addition, but task=pretrain asks for pretrain"),
    (["pe=rope", "pe=tape"], "pe is given 2 times (rope, tape); give it once"),
])
def test_contradictory_choices_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    out = cli(["experiment=addition/smoke", "logger=none", *args], tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and message in both and "Traceback" not in both, both
    assert not (tmp_path / "runs").exists()


def test_a_training_length_out_of_range_names_max_digits(tmp_path: Path) -> None:
    """Issue 23: task.max_digits=100000 was refused with a message blaming eval_max_digits."""
    out = cli(["experiment=addition/smoke", "logger=none", "task.max_digits=100000"], tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and "task.max_digits=100000 needs 300004-token training examples" in both, both
    assert "lower task.max_digits or set task.seq_len>=300004" in both
    out = cli(["experiment=addition/smoke", "logger=none", "task.max_digits=7", "task.seq_len=30"], tmp_path)
    assert "task.max_digits=7 is above task.eval_max_digits=6" in out.stdout + out.stderr


@pytest.mark.wandb
def test_wandb_online_without_a_login_is_refused_before_any_folder(tmp_path: Path) -> None:
    """Issue 23: 82 lines, two tracebacks and a failed run directory before."""
    home = tmp_path / "home"
    home.mkdir()  # no ~/.netrc: no `wandb login`
    env = {"HOME": str(home), "WANDB_API_KEY": "", "WANDB_MODE": ""}
    out = cli(["experiment=addition/smoke", "logger=wandb_online"], tmp_path, **env)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and "logger=wandb_online needs a W&B login" in both, both[-3000:]
    assert "wandb login" in both and "logger=wandb" in both and "Traceback" not in both
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("preset", ["flipflop/smoke", "pretrain/smoke"])
def test_a_training_length_no_memory_here_holds_is_refused(tmp_path: Path, preset: str) -> None:
    """Issue 23: task.seq_len=100000000 started training; it is refused with the floor it needs."""
    out = cli([f"experiment={preset}", "logger=none", "task.seq_len=100000000"], tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in both, both
    assert "task.seq_len=100000000 with task.batch_size=" in both and "lower task.seq_len" in both
    assert not (tmp_path / "runs").exists()



def test_a_wandb_logger_without_the_wandb_package_is_refused_before_any_folder(monkeypatch) -> None:
    """On a GPU node installed from the wheelhouse (wandb optional) the default logger claimed
    the run folder, then crashed in log_config with ModuleNotFoundError."""
    import importlib.util

    from conftest import compose_config
    from pipelines import wandb_log
    from pipelines.errors import PipelineConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(PipelineConfigError, match="wandb package is not installed.*logger=csv"):
        wandb_log.check_wandb(compose_config("config", ["logger=wandb"]))
    wandb_log.check_wandb(compose_config("config", ["logger=csv"]))  # no W&B: nothing to check
