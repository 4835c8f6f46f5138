"""Re-evaluate a finished (or killed) run: ``python -m pipelines.evaluate run_dir=runs/...``.

Loads the run's config.yaml and a checkpoint (``ckpt=last``, ``best`` or a path), optionally
changes evaluation settings (``task.examples_per_cell=100``), and writes a new directory
<run_dir>/eval/<time>-<id>/ with config.yaml, command.txt, metrics.json and the task's
artifacts. The run's own files are never touched.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from pipelines.tasks import get_task
from pipelines.utils import (
    PipelineConfigError, claim_run_dir, task_wrapper, unknown_choice, write_json_once,
)
from tape.lightning import CausalLMModule


def find_checkpoint(run_dir: Path, which: str) -> Path:
    """``last`` / ``best`` (the best-*.ckpt ModelCheckpoint kept) / a path to a .ckpt file."""
    ckpt_dir = run_dir / "checkpoints"
    if which == "last":
        found = [ckpt_dir / "last.ckpt"]
    elif which == "best":
        found = sorted(ckpt_dir.glob("best-*.ckpt"))
    else:
        found = [Path(which)]
    found = [p for p in found if p.is_file()]
    if not found:
        raise PipelineConfigError(
            f"ckpt={which}: no such checkpoint in {ckpt_dir}; pass ckpt=last, ckpt=best or a "
            ".ckpt path (was the run trained with callbacks=default?)"
        )
    return found[-1]


@task_wrapper
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Rebuild the run's model from a checkpoint and run its task's evaluation again."""
    t0 = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise PipelineConfigError(
            f"run_dir={cfg.run_dir}: {run_dir / 'config.yaml'} not found; pass the directory "
            "that pipelines.train printed as 'run dir: ...'"
        )
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    changes = {k: v for k, v in OmegaConf.to_container(cfg.task).items() if v is not None}
    task_cfg = OmegaConf.merge(run_cfg.task, changes)
    task = get_task(task_cfg.name)
    ckpt = find_checkpoint(run_dir, str(cfg.ckpt))

    out_dir = Path(cfg.paths.output_dir)
    claim_run_dir(out_dir, OmegaConf.create({"run_dir": str(run_dir), "checkpoint": str(ckpt),
                                             "task": task_cfg}), "pipelines.evaluate")
    state = torch.load(ckpt, map_location=cfg.device, weights_only=False)
    module = CausalLMModule(**state["hyper_parameters"])
    module.load_state_dict(state["state_dict"])
    title = f"{run_cfg.pe.name} seed {run_cfg.seed} ({ckpt.name})"
    metrics: dict[str, Any] = {
        "task": task_cfg.name, "pe": run_cfg.pe.name, "scale": run_cfg.scale,
        "seed": run_cfg.seed, "experiment": run_cfg.experiment_name, "run_dir": str(run_dir),
        "checkpoint": str(ckpt), "steps": int(state["global_step"]),
    }
    metrics.update(task.evaluate(module.model, task_cfg, out_dir, title))
    metrics["wall_time_s"] = time.perf_counter() - t0
    write_json_once(out_dir / "metrics.json", metrics)
    return metrics


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    return evaluate(cfg).get("mean_accuracy")


if __name__ == "__main__":
    if message := unknown_choice(sys.argv[1:]):
        sys.exit(message)
    main()
