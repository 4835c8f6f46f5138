"""Shared plumbing of the entry points: run directories, loggers, callbacks, checkpoints, errors.

Hydra and W&B are handled here and in the entry points only; ``tape/`` never imports them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from omegaconf import DictConfig, OmegaConf

from tape.bench.machine import commit_label, machine_summary
from tape.model import ConfigError, ModelConfig

log = logging.getLogger("pipelines")
F = TypeVar("F", bound=Callable[..., Any])

# One id per process: with the second-resolution time it names the run directory. Two runs
# started in the same second get different ids; jobs of one multirun add their job number.
RUN_ID = secrets.token_hex(3)
if not OmegaConf.has_resolver("run_id"):
    OmegaConf.register_new_resolver("run_id", lambda: RUN_ID)
# The launch directory. Not ${hydra:runtime.cwd}: the multirun sweep dir is resolved before
# Hydra's runtime config exists.
if not OmegaConf.has_resolver("cwd"):
    OmegaConf.register_new_resolver("cwd", os.getcwd)

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
RUN_CLAIM = "command.txt"  # created exclusively: the run directory belongs to this run only


class PipelineConfigError(ValueError):
    """A config value cannot work; the message names the key (as on the command line) and the fix."""


# ---------------------------------------------------------------------------- command line
def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """Every option of a config group, nested ones included (experiment: addition/cpu, ...)."""
    root = conf_dir / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def unknown_choice(argv: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """A message for the first ``group=option`` on the command line that names no config file,
    listing the group's options (Hydra does not list nested ones such as experiment=addition/*)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or "(" in value or not (conf_dir / key).is_dir() or key == "hydra":
            continue
        options = group_options(key, conf_dir)
        for choice in value.split(","):
            if choice not in options and choice != "null":
                return (f"{key}={choice}: no such {key} config; choose one of: "
                        + ", ".join(options))
    return None


# ---------------------------------------------------------------------------- processes
def is_rank_zero() -> bool:
    """True in the launching process; False in the extra processes DDP starts (they set RANK or
    LOCAL_RANK) and must not claim directories or write results."""
    return all(int(os.environ.get(k, 0)) == 0 for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def close_loggers(failed: bool = False) -> None:
    """Finish an open W&B run so the next job of a sweep starts clean (no-op without W&B)."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1 if failed else 0)


def task_wrapper(fn: F) -> F:
    """Run an entry task; whatever happens, close the loggers and print the run directory, so
    one failed sweep job leaves the others alone and its outputs are easy to find."""

    @functools.wraps(fn)
    def wrapped(cfg: DictConfig, *args: Any, **kwargs: Any) -> Any:
        failed = True
        try:
            out = fn(cfg, *args, **kwargs)
            failed = False
            return out
        except Exception:
            log.exception("%s failed", fn.__name__)
            raise
        finally:
            close_loggers(failed)
            if is_rank_zero():
                print(f"run dir: {cfg.paths.output_dir}" + (" (failed)" if failed else ""), flush=True)

    return wrapped  # type: ignore[return-value]


# ---------------------------------------------------------------------------- run directories
def job_command(entry: str) -> str:
    """The command that reruns exactly this job (for a multirun job: its own overrides only)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # composed without @hydra.main (tests, notebooks)
        overrides = sys.argv[1:]
    return shlex.join(["python", "-m", entry, *overrides])


def claim_run_dir(run_dir: Path, cfg: DictConfig, entry: str) -> None:
    """Make ``run_dir`` this run's own: create command.txt exclusively (fail if another run has
    it), then save the resolved config. Nothing that was there is ever overwritten."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(run_dir / RUN_CLAIM, "x") as f:
            f.write(job_command(entry) + "\n")
            f.write(f"# launched as: {shlex.join([sys.executable, *sys.argv])}\n")
            f.write(f"# cwd: {os.getcwd()}\n# commit: {commit_label(REPO_ROOT)}\n# time: {time.ctime()}\n")
            f.write(f"# machine: {machine_summary()}\n")
    except FileExistsError:
        raise PipelineConfigError(
            f"{run_dir} already belongs to another run ({RUN_CLAIM} exists); runs never share a "
            "directory. Leave hydra.run.dir at its default or point it at a new directory."
        ) from None
    with open(run_dir / "config.yaml", "x") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))


def write_json_once(path: Path, values: dict[str, Any]) -> None:
    """Write JSON to a new file; an existing file is an error, never overwritten."""
    with open(path, "x") as f:
        json.dump(values, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------- models
def model_config(cfg: DictConfig) -> ModelConfig:
    """ModelConfig from the ``model`` (sizes) and ``pe`` (encoding + options) groups. Problems
    are reported with the command-line keys (``model.d_model``, ``pe.randpe_max_position``)."""
    pe = OmegaConf.to_container(cfg.pe, resolve=True)
    name = pe.pop("name")
    model = OmegaConf.to_container(cfg.model, resolve=True)
    # A PE option left null defers to the same field set under model (an experiment preset can
    # set e.g. model.randpe_max_position for whichever PE is chosen).
    values = {**model, **{k: v for k, v in pe.items() if v is not None or k not in model}, "pe": name}
    try:
        return ModelConfig.from_dict(values)
    except ConfigError as err:
        keys = ", ".join(f"pe.{k}" for k in pe) or "none"
        raise PipelineConfigError(
            f"model=... / pe={cfg.pe.name} give an impossible model. Fields are set as "
            f"model.<field> (PE options as pe.<field>; this PE has: {keys}).\n{err}"
        ) from None


def check_position_range(mc: ModelConfig, eval_len: int, eval_key: str) -> None:
    """Fail when evaluation needs positions that an absolute-position PE never trained on."""
    if mc.pe == "randpe":
        limit = mc.randpe_max_position or 2 * mc.max_seq_len
        if eval_len > limit:
            raise PipelineConfigError(
                f"pe=randpe trains on positions in [0, {limit}) (pe.randpe_max_position, default "
                f"2 * model.max_seq_len) but evaluation ({eval_key}) needs {eval_len} positions; "
                f"set pe.randpe_max_position>={eval_len} or shorten the evaluation"
            )


def check_model_positions(model: Any, eval_len: int, eval_key: str) -> None:
    """:func:`check_position_range` for a built model: our DecoderLM carries its config
    (``model.cfg``); other models (Hugging Face) have no trained position range to check."""
    mc = getattr(model, "cfg", None)
    if isinstance(mc, ModelConfig):
        check_position_range(mc, eval_len, eval_key)


def evaluation_only(task: str) -> None:
    """What pipelines.train says to an evaluation task (passkey, perplexity)."""
    raise PipelineConfigError(
        f"task={task} is an evaluation task: train with another task, then run "
        f"python -m pipelines.evaluate run_dir=<run dir> task={task}"
    )


def check_trainer(cfg: DictConfig) -> None:
    """The last step must be validated (so last.ckpt and metrics hold the final model), and
    checkpoints must fall on optimizer steps (so a resumed run replays exactly)."""
    t = cfg.trainer
    steps, every, accum = int(t.max_steps), int(t.val_check_interval), int(t.accumulate_grad_batches)
    if steps < 1 or every < 1 or accum < 1:
        raise PipelineConfigError(
            "trainer.max_steps, trainer.val_check_interval and trainer.accumulate_grad_batches "
            f"must be >= 1 (got {steps}, {every}, {accum})"
        )
    if every % accum or (steps * accum) % every:
        raise PipelineConfigError(
            f"trainer.val_check_interval={every} (in batches) must be a multiple of "
            f"trainer.accumulate_grad_batches={accum} and divide trainer.max_steps * "
            f"accumulate_grad_batches={steps * accum}; change trainer.val_check_interval"
        )


# ---------------------------------------------------------------------------- instantiation
def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a group like ``logger`` or ``callbacks`` (null entries skipped)."""
    from hydra.utils import instantiate

    if not group:
        return []
    return [instantiate(node) for node in group.values() if node and "_target_" in node]


def resolve_ckpt_path(cfg: DictConfig, run_dir: Path) -> Path | None:
    """``ckpt_path``: null = fresh start; ``last`` = checkpoints/last.ckpt of the newest earlier
    run of this experiment, PE and seed; a run directory; or a .ckpt file."""
    value = cfg.get("ckpt_path")
    if value in (None, ""):
        return None
    if value == "last":
        pattern = f"{cfg.experiment_name}/{cfg.pe.name}/{cfg.seed}/*/checkpoints/last.ckpt"
        found = [p for p in Path(cfg.paths.runs_dir).glob(pattern)
                 if p.resolve().parents[1] != run_dir.resolve()]
        if not found:
            raise PipelineConfigError(
                f"ckpt_path=last: no {Path(cfg.paths.runs_dir) / pattern} to resume; train first "
                "or pass ckpt_path=<run dir or .ckpt file>"
            )
        return max(found, key=lambda p: p.stat().st_mtime)
    path = Path(value)
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise PipelineConfigError(
            f"ckpt_path={value}: {path} does not exist; pass last, a run directory or a .ckpt file"
        )
    return path
