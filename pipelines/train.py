"""Train (then evaluate) one run: ``python -m pipelines.train experiment=addition/cpu pe=tape``.

Sweeps use Hydra's multirun: ``python -m pipelines.train -m experiment=addition/cpu
pe=rope,randpe,nope,fire,tape seed=0,1,2``. Each run writes runs/<experiment>/<pe>/<seed>/
<time>-<id>/ with config.yaml, command.txt, metrics.json, grid.csv, heatmap.png, checkpoints/.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from pipelines import wandb_log
from pipelines.config_checks import check_accelerator, check_compile, check_trainer
from pipelines.fits import check_fits
from pipelines.entry import run_entry, task_wrapper
from pipelines.hydra_conf import instantiate_group
from pipelines.logs import job_log_name, quiet_known_noise, start_log_file
from pipelines.models import module_hparams
from pipelines.precision import eval_autocast, evaluation_precision
from pipelines.preflight import check_run_dir_new
from pipelines.result_files import write_json_once
from pipelines.resume import resolve_ckpt_path
from pipelines.run_dirs import claim_run_dir, is_rank_zero
from pipelines import tasks

if TYPE_CHECKING:  # torch and Lightning are imported after the config checks (a typo reports fast)
    import lightning as L
    from lightning.pytorch.callbacks import Callback

    from tape.lightning import CausalLMModule

log = logging.getLogger("pipelines.train")


def build_module(cfg: DictConfig) -> CausalLMModule:
    from tape.lightning import CausalLMModule
    from tape.model.pairing import pair_initial_weights

    module = CausalLMModule(**module_hparams(cfg), compile_model=bool(cfg.get("compile", False)))
    if cfg.get("paired_init", False):  # same seed -> same shared initial weights for every PE
        pair_initial_weights(module.model, int(cfg.seed))
    return module


def check_settings(cfg: DictConfig) -> tasks.Task:
    """The checks of train() that need no run directory, checkpoint or data; a sweep runs them
    on every job before the first one trains. Completes ``cfg`` in place (task.prepare) and
    returns the run's task."""
    task = tasks.get(cfg.task.name)
    if task.runs_itself:  # context extension: its stages' settings, not the trainer's
        check_compile(cfg, runs_itself=True)
        task.validate(cfg)  # again in its run; here a sweep checks every job first
    else:
        check_trainer(cfg)
        task.prepare(cfg)  # e.g. fine-tuning adopts its pretrained run's model config
        check_fits(cfg)  # after prepare: it fills the lengths and vocabularies some tasks derive
        task.refuse_training()  # an evaluation task (passkey, perplexity) says how to run it
        task.validate(cfg)  # every config error surfaces here, before any training
    check_accelerator(cfg.trainer)
    return task


@task_wrapper
def train(cfg: DictConfig, extra_callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Check the config, train, evaluate on rank 0, write metrics.json; return the metrics.

    Every check that can fail (config values, the checkpoint to resume, the accelerator, the
    data) runs before the run directory is claimed, so a failed try leaves nothing behind."""
    t_start = time.perf_counter()
    run_dir = Path(cfg.paths.output_dir)
    if is_rank_zero():
        check_run_dir_new(run_dir)  # fails fast; the claim below is what makes it this run's
    wandb_log.check_wandb(cfg)
    task = check_settings(cfg)
    if task.runs_itself:  # a multi-stage task (context extension) runs its own fits
        quiet_known_noise()
        return task.run(cfg)
    ckpt = resolve_ckpt_path(cfg, run_dir)
    quiet_known_noise()
    import lightning as L
    import torch

    torch.set_float32_matmul_precision("high")  # TF32 matmuls on GPUs that have them
    from lightning.pytorch.callbacks import LearningRateMonitor

    from pipelines.run_history import RunHistory

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = task.datamodule(cfg)  # finds (or builds) the data: missing data fails here
    if is_rank_zero():
        claim_run_dir(run_dir, cfg, "pipelines.train")
    else:  # DDP's extra processes log beside rank 0's files
        start_log_file(run_dir / job_log_name())
    module = build_module(cfg)
    if ckpt is None:  # e.g. load pretrained weights
        task.initialize(module.model, cfg)
    loggers = wandb_log.open_loggers(cfg, ckpt)  # W&B: full config; a resume continues its run
    # time, validations and the config so far, carried by checkpoints into a resume
    history = RunHistory(OmegaConf.to_container(cfg, resolve=True))
    callbacks = instantiate_group(cfg.get("callbacks")) + [history, *extra_callbacks]
    if not loggers:  # LearningRateMonitor refuses to run without a logger
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, logger=loggers or False,
                                                 callbacks=callbacks)
    t_fit = time.perf_counter()
    with warnings.catch_warnings():  # a resumed run checkpoints into its own directory, by design
        warnings.filterwarnings("ignore", message="The dirpath has changed from")
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
        except SystemExit as exit_:  # Lightning's answer to Ctrl-C: shut down, then sys.exit(1)
            if not isinstance(exit_.__context__, KeyboardInterrupt):
                raise  # e.g. SIGTERM (a scheduler's preemption) ends as Lightning ends it
    train_time = time.perf_counter() - t_fit
    if trainer.interrupted:
        raise RuntimeError("training was interrupted; resume it with ckpt_path=last (from its last "
                           "validation)")
    model = _full_model(trainer, module, cfg, run_dir)  # collective under FSDP
    if not trainer.is_global_zero:
        return {}

    metrics: dict[str, Any] = {
        "task": cfg.task.name, "pe": cfg.pe.name, "scale": cfg.scale, "seed": cfg.seed,
        "experiment": cfg.experiment_name, "steps": trainer.global_step,
        "n_params": model.num_parameters(), "train_time_s": history.earlier_s + train_time,
        "resumed_from": str(ckpt) if ckpt else None,
    }
    metrics.update({k.replace("/", "_"): float(v) for k, v in trainer.callback_metrics.items()
                    if k.startswith("val/")})
    if cfg.evaluate:  # at eval_precision, else the precision it trained with
        model = model.to(trainer.strategy.root_device)
        with eval_autocast(trainer.strategy.root_device.type, evaluation_precision(cfg)):
            metrics.update(task.evaluate(model, cfg.task, run_dir, f"{cfg.pe.name} seed {cfg.seed}"))
    metrics["wall_time_s"] = time.perf_counter() - t_start
    wandb_log.log_results(trainer.loggers, run_dir, cfg, trainer.global_step)  # tables, figures
    for lg in trainer.loggers:
        lg.log_metrics({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, float)},
                       step=trainer.global_step)
        lg.finalize("success")
    write_json_once(run_dir / "metrics.json", metrics)
    return metrics


def _sharded(trainer: L.Trainer) -> bool:
    """Each process holds only shards of the weights (FSDP over several processes)."""
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(trainer.strategy, FSDPStrategy) and trainer.world_size > 1


def _full_model(trainer: L.Trainer, module: CausalLMModule, cfg: DictConfig, run_dir: Path) -> Any:
    """The trained DecoderLM with full weights on rank 0 (None elsewhere). Sharded, each process
    holds flat shards: they are gathered through a full checkpoint (evaluated a shard, it failed)."""
    from tape.lightning.distributed import trained_model

    sharded = _sharded(trainer)
    path = run_dir / "checkpoints" / "gathered.ckpt"
    model = trained_model(trainer, module, lambda: build_module(cfg).model, path, through_checkpoint=sharded)
    if sharded and trainer.is_global_zero:
        path.unlink()  # the weights of last.ckpt, gathered for evaluation only
    return model


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point; returns mean_accuracy for hyperparameter sweepers."""
    return train(cfg).get("mean_accuracy")


if __name__ == "__main__":
    run_entry(main, sys.argv[1:], check_job=check_settings)
