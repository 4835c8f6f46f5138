"""Evaluate a finished (or killed) run: ``python -m pipelines.evaluate run_dir=runs/...``.

Without ``task=`` it re-runs the run's own evaluation from a checkpoint (``ckpt=last``, ``best``
or a path), optionally with other evaluation settings (``task.examples_per_cell=100``). With
``task=passkey`` or ``task=perplexity`` it runs that evaluation on the run's model instead, its
null settings taken from the run (tokenizer, held-out text, context). ``run_dir`` may be a
pretraining / addition / SCROLLS run, a context-extension run (``stage=tape`` picks the model)
or any Hugging Face model directory (a Llama, a TAPE Llama). See pipelines/run_source.py.

Results go to a new directory <run_dir>/eval/<time>-<id>/ (config.yaml, command.txt,
metrics.json, the task's artifacts, the loggers' files); the run's own files are never touched.
The metrics are printed and logged to the run's loggers (CSV, W&B offline as the run had them;
``logger=csv`` etc. to choose). The model runs on the GPU when there is one (``device=auto``).
"""

from __future__ import annotations

import copy
import re
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from pipelines.entry import run_entry, task_wrapper
from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import CONF_DIR, instantiate_group
from pipelines.models import check_position_range
from pipelines.precision import device_default, eval_autocast, evaluation_precision, known_precision
from pipelines.result_files import write_json_once
from pipelines.run_dirs import claim_run_dir
from pipelines.run_source import RunSource, open_run
from pipelines import tasks, wandb_log

# The keys of conf/evaluate.yaml's own ``task:`` block: changes to the run's own task settings.
RERUN_KEYS = ("eval_max_digits", "examples_per_cell", "eval_seed", "eval_batch_size")


def resolve_device(device: str) -> str:
    """``auto``: cuda when a GPU is visible, else cpu; ``cuda`` without a GPU is an error."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise PipelineConfigError(f"device={device}: choose auto, cpu, cuda or cuda:<index>")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PipelineConfigError(f"device={device} but no GPU is visible; pass device=auto or device=cpu")
    return device


def run_dir_problem(argv: list[str]) -> str | None:
    """One clear line when ``run_dir=`` is missing or names no directory (checked before Hydra,
    which would print a long traceback and create <run_dir>/eval/... on the way)."""
    values = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+") == "run_dir" and "=" in a]
    if not values:
        return ("pipelines.evaluate needs run_dir=<the directory pipelines.train printed as "
                "'run dir: ...', or a Hugging Face model directory>, e.g. "
                "python -m pipelines.evaluate run_dir=runs/addition/cpu/tape/0/<time>-<id>")
    for value in values[-1].split(","):
        path = Path(value)
        if not ((path / "config.yaml").is_file() or (path / "config.json").is_file()):
            return (f"run_dir={value}: no run there (neither config.yaml nor config.json); pass the "
                    "directory that pipelines.train printed as 'run dir: ...'")
    return None


def task_config(cfg: DictConfig, source: RunSource, out_dir: Path) -> DictConfig:
    """The evaluation's task settings: the run's own task with changes, or the chosen task=."""
    chosen = OmegaConf.to_container(cfg.task, resolve=True)
    if chosen.get("name") is None:  # no task=: the run's own evaluation again
        return own_task_config(chosen, source)
    task_cfg = OmegaConf.create({k: v for k, v in chosen.items()
                                 if not (k in RERUN_KEYS and v is None)})
    tasks.get(task_cfg.name).adopt(task_cfg, source, out_dir)  # refused by a task that cannot
    return task_cfg


def own_task_config(chosen: dict[str, Any], source: RunSource) -> DictConfig:
    """The run's own task settings with the values ``chosen`` sets (None: the run's)."""
    if source.run_cfg is None or source.ckpt is None:
        raise PipelineConfigError(
            f"run_dir={source.run_dir} is a Hugging Face model; choose its evaluation with "
            "task=passkey, task=perplexity or task=multiple_choice"
        )
    changes = {k: v for k, v in chosen.items() if v is not None}
    check_rerun_changes(source.run_cfg, changes)
    return OmegaConf.merge(source.run_cfg.task, changes)


def check_rerun_changes(run_cfg: DictConfig, changes: dict[str, Any]) -> None:
    """Changes to a run's own evaluation name settings its task has (``+task.x=`` and keys of
    another task were merged in and ignored); the task's ``check`` judges their values."""
    own = run_cfg.task
    if unknown := sorted(set(changes) - set(own)):
        raise PipelineConfigError(
            f"{', '.join(f'task.{k}' for k in unknown)}: the run's task ({own.name}) has no such "
            f"setting; its settings are {', '.join(sorted(own))}")


def logger_group(cfg: DictConfig, source: RunSource, out_dir: Path) -> DictConfig:
    """The chosen ``logger=`` group, else the run's own loggers, resolved to write under
    ``out_dir`` (never into the run's files); a CSV logger when neither exists."""
    group = cfg.get("logger")
    if group is None and source.run_cfg is not None and "logger" in source.run_cfg:
        group = source.run_cfg.logger
    if group is None:
        group = OmegaConf.load(CONF_DIR / "logger" / "csv.yaml")
    # The logger configs name the run (${experiment_name}, ${pe.name}, ${seed}, ...): resolve
    # them against the evaluated run's labels, which the evaluation's own config lacks.
    run = source.run_cfg
    label = (lambda key, default: OmegaConf.select(run, key, default=default)) if run is not None \
        else (lambda key, default: default)
    root = OmegaConf.create({
        "experiment_name": label("experiment_name", "evaluate"), "seed": label("seed", 0),
        "scale": label("scale", "custom"), "pe": {"name": label("pe.name", "model")},
        "task": {"name": str(cfg.task.get("name") or label("task.name", "evaluate"))},
        "paths": {"output_dir": str(out_dir)},
        "logger": OmegaConf.to_container(group, resolve=False) or {},
    })
    group = copy.deepcopy(OmegaConf.to_container(root.logger, resolve=True))
    for node in group.values():
        if node and "save_dir" in node:
            node["save_dir"] = str(out_dir)
        if node and "job_type" in node:
            node["job_type"] = "eval"
    return OmegaConf.create(group)


def make_loggers(group: DictConfig) -> list[Any]:
    """``logger_group``'s loggers, instantiated."""
    loggers = instantiate_group(group)
    wandb_log.drop_wandb_anonymous(loggers)
    return loggers


def print_metrics(metrics: dict[str, Any]) -> None:
    """The numbers, one per line, on stdout."""
    width = max(len(k) for k in metrics)
    lines = [f"  {k:<{width}}  {v:.6g}" if isinstance(v, float) else f"  {k:<{width}}  {v}"
             for k, v in metrics.items()]
    print("metrics:\n" + "\n".join(lines), flush=True)


def run_precision(asked: str, run_cfg: DictConfig | None, device_type: str) -> str:
    """The precision to evaluate at: what was asked, or for ``auto`` the precision the run
    evaluated itself at (``evaluation_precision``: a re-evaluation reproduces its metrics.json),
    and for a bare model directory bf16 autocast on a GPU, fp32 on a CPU."""
    if asked != "auto":
        return asked
    if run_cfg is not None and run_cfg.get("trainer") is not None:
        return evaluation_precision(run_cfg)
    return device_default(device_type)


def check_settings(cfg: DictConfig) -> None:
    """The checks of evaluate() that write nothing and load no weights: the run exists, and a
    rerun of its own evaluation changes settings its task has, to values the task accepts (a
    chosen task= is checked by its job, which may first write held-out text). A sweep runs
    them on every job before the first one evaluates."""
    if (problem := run_dir_problem([f"run_dir={cfg.run_dir}"])) is not None:
        raise PipelineConfigError(problem)
    if str(cfg.precision) != "auto":
        known_precision(str(cfg.precision), "precision", "auto, 32, bf16-mixed or 16-mixed")
    source = open_run(Path(cfg.run_dir), str(cfg.ckpt), cfg.get("stage"))
    wandb_log.check_wandb(OmegaConf.create({"logger": logger_group(cfg, source, Path("."))}))
    if cfg.task.get("name") is not None:
        return
    task_cfg = own_task_config(OmegaConf.to_container(cfg.task, resolve=True), source)
    tasks.get(task_cfg.name).check(task_cfg)


@task_wrapper
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Load the run's model, run the evaluation, write and log the metrics; return them."""
    t0 = time.perf_counter()
    if (problem := run_dir_problem([f"run_dir={cfg.run_dir}"])) is not None:
        raise PipelineConfigError(problem)
    device = resolve_device(str(cfg.device))
    source = open_run(Path(cfg.run_dir), str(cfg.ckpt), cfg.get("stage"))
    out_dir = Path(cfg.paths.output_dir)
    group = logger_group(cfg, source, out_dir)
    # wandb missing, or wandb_online without a login: said now, not after the evaluation ran
    wandb_log.check_wandb(OmegaConf.create({"logger": group}))
    out_dir.mkdir(parents=True, exist_ok=True)
    task_cfg = task_config(cfg, source, out_dir)
    task = tasks.get(task_cfg.name)
    task.check(task_cfg)  # e.g. passkey: every prompt length fits, with the run's tokenizer
    mc = source.model_config()
    if mc is not None and (need := task.positions_needed(task_cfg)) is not None:
        check_position_range(mc, *need)  # e.g. RandPE asked beyond its trained range
    if mc is not None:
        task.check_model(mc, task_cfg)  # e.g. addition's grid beyond the Abacus table
    precision = run_precision(str(cfg.precision), source.run_cfg, torch.device(device).type)
    autocast = eval_autocast(torch.device(device).type, precision)  # a bad precision fails here
    model, facts = source.load_model(device, str(cfg.dtype))  # a broken checkpoint fails here
    claim_run_dir(out_dir, OmegaConf.create({"run_dir": str(source.run_dir), "stage": source.stage,
                                             "checkpoint": str(source.ckpt), "device": device,
                                             "task": task_cfg}), "pipelines.evaluate")
    labels = source.labels()
    title = f"{labels.get('pe', 'model')} seed {labels.get('seed', '-')}" + (
        f" ({source.ckpt.name})" if source.ckpt else "")
    metrics: dict[str, Any] = {"task": task_cfg.name, **labels, **facts, "device": device,
                               "precision": precision}
    with autocast:
        metrics.update(task.evaluate(model, task_cfg, out_dir, title))
    metrics["wall_time_s"] = time.perf_counter() - t0
    write_json_once(out_dir / "metrics.json", metrics)
    loggers, step = make_loggers(group), int(facts.get("steps", 0))
    evaluated = OmegaConf.create({"task": task_cfg, "evaluated": {**labels, "run_dir": str(source.run_dir),
                                  "stage": source.stage, "checkpoint": str(source.ckpt), "device": device,
                                  "precision": precision, "dtype": str(cfg.dtype)}})
    wandb_log.log_config(loggers, evaluated)  # what was evaluated, and how
    wandb_log.log_results(loggers, out_dir, evaluated, step)  # the task's tables and figures
    for lg in loggers:
        lg.log_metrics({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, float)}, step=step)
        lg.finalize("success")
    print_metrics(metrics)
    return metrics


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    return evaluate(cfg).get("mean_accuracy")


if __name__ == "__main__":
    if message := run_dir_problem(sys.argv[1:]):
        sys.exit(message)
    run_entry(main, sys.argv[1:], config_name="evaluate", check_job=check_settings)
