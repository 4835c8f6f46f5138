"""What a run shows in W&B beyond Lightning's metric history: the full resolved config, each
task's tidy results as ``wandb.Table``s and its figures, and one W&B run across resumes.

Everything here reads what the tasks already wrote into the run directory (each task names its
tidy result files in ``wandb_tables``: grid.csv, perplexity.csv, passkey.csv, ...; and the figures
heatmap.png, passkey.png), so any entry point that writes those files (train, evaluate, context
extension) can call ``log_results``.
W&B stays offline unless ``logger=wandb_online``; wandb itself is imported only when a W&B
logger exists.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import instantiate_group
from pipelines.result_files import Row, read_csv_rows  # noqa: F401 - tests read result files with it
from tape.optional import missing

# W&B writes one folder per process: wandb/offline-run-<date>_<time>-<id> (run-... online)
RUN_FOLDER = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-(?P<id>[a-z0-9]+)")
FIGURES = {"heatmap.png": "eval/heatmap", "passkey.png": "eval/passkey_plot"}  # run-dir figures


def wandb_loggers(loggers: Sequence[Any]) -> list[Any]:
    from lightning.pytorch.loggers import WandbLogger

    return [lg for lg in loggers if isinstance(lg, WandbLogger)]


# ---------------------------------------------------------------------------- one run across resumes
def run_id(run_dir: Path) -> str | None:
    """The W&B run id that ``run_dir`` logged to (its newest wandb/*run-<time>-<id> folder)."""
    folders = [p.name for p in (run_dir / "wandb").glob("*run-*") if RUN_FOLDER.fullmatch(p.name)]
    if not folders:
        return None
    return RUN_FOLDER.fullmatch(max(folders, key=lambda n: n.removeprefix("offline-")))["id"]


def resumed_run_id(ckpt: Path | None) -> str | None:
    """The W&B id of the run that wrote ``ckpt`` (<run>/checkpoints/x.ckpt), if it logged to W&B."""
    if ckpt is None:
        return None
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run_id(run_dir)


def has_wandb_login() -> bool:
    """An API key W&B would use: WANDB_API_KEY, or `wandb login`'s entry in ~/.netrc."""
    import netrc

    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_wandb(cfg: DictConfig) -> None:
    """A W&B logger without the wandb package, or logger=wandb_online without a login: one
    message naming the fix, before any directory (W&B itself would fail after the run directory
    exists, with two tracebacks)."""
    wandb_cfg = (cfg.get("logger") or {}).get("wandb")
    why = None if wandb_cfg is None else missing("wandb")
    if why is not None:
        raise PipelineConfigError(f"this logger writes to W&B, but {why}; or run with logger=csv or logger=none")
    if wandb_cfg is None or wandb_cfg.get("offline", True):
        return
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun") or has_wandb_login():
        return
    raise PipelineConfigError(
        "logger=wandb_online needs a W&B login and network: run `wandb login` (or set "
        "WANDB_API_KEY), or log offline with logger=wandb (the default) and upload later with "
        "make wandb-sync"
    )


def drop_wandb_anonymous(loggers: list[Any]) -> None:
    """Lightning's WandbLogger always passes ``anonymous=None`` to wandb.init, which makes W&B
    warn that the setting has no effect; leave the argument out instead."""
    for lg in loggers:
        init = getattr(lg, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)


def open_loggers(cfg: DictConfig, ckpt: Path | None = None) -> list[Any]:
    """The ``logger`` group, instantiated. A resumed run (``ckpt``) continues the W&B run of the
    run it resumes (same id, ``resume="allow"``); the W&B run gets the full resolved config."""
    group = cfg.get("logger")
    resume = resumed_run_id(ckpt)
    if group and group.get("wandb") and resume:
        values = OmegaConf.to_container(group, resolve=True)  # a copy: cfg stays as saved
        values["wandb"].update(id=resume, resume="allow")
        group = OmegaConf.create(values)
    loggers = instantiate_group(group)
    drop_wandb_anonymous(loggers)  # before the first wandb.init, which log_config triggers
    log_config(loggers, cfg)
    return loggers


def close_loggers(failed: bool = False) -> None:
    """Finish an open W&B run so the next job of a sweep starts clean (no-op without W&B)."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1 if failed else 0)


def log_config(loggers: Sequence[Any], cfg: DictConfig) -> None:
    """The whole resolved config into each W&B run's config (not only the module's hparams).
    Lightning later adds the module's hyperparameters; its ``model`` (the ModelConfig built from
    the model and pe groups) then replaces the ``model`` group."""
    values = OmegaConf.to_container(cfg, resolve=True)
    for lg in wandb_loggers(loggers):
        lg.log_hyperparams(values)  # rank zero only; config.update(allow_val_change=True)


# ---------------------------------------------------------------------------- results
def result_tables(run_dir: Path, cfg: DictConfig) -> dict[str, list[Row]]:
    """{W&B key: rows} for every tidy result file the task wrote into ``run_dir``."""
    from pipelines import tasks

    out = {}
    for name, table in tasks.wandb_tables().items():
        if (run_dir / name).is_file():
            out[table.key] = table.prepare(table.read(run_dir / name), cfg)
    return out


def log_results(loggers: Sequence[Any], run_dir: Path, cfg: DictConfig, step: int | None = None) -> None:
    """Each task result file in ``run_dir`` as a ``wandb.Table`` and each figure as an image."""
    runs = wandb_loggers(loggers)
    if not runs:
        return
    import wandb

    data: dict[str, Any] = {}
    for key, rows in result_tables(run_dir, cfg).items():
        columns = list(dict.fromkeys(k for r in rows for k in r))
        data[key] = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
    for name, key in FIGURES.items():
        if (run_dir / name).is_file():
            data[key] = wandb.Image(str(run_dir / name))
    if step is not None:
        data["trainer/global_step"] = step
    for lg in runs:
        lg.experiment.log(data)
