"""Config values checked in the task before any directory is claimed: trainer, optimizer, devices."""

from __future__ import annotations

import typing

from omegaconf import DictConfig, OmegaConf

from pipelines.errors import PipelineConfigError
from pipelines.precision import evaluation_precision, training_precision
from tape.optional import missing
from tape.typecheck import type_problems


def require_int(cfg: DictConfig, *keys: str, prefix: str = "") -> None:
    """Each dotted key holds an integer (``seed=abc`` is named here, not by a traceback);
    ``prefix`` names where ``cfg`` sits in the run's config (``task.`` for a task block)."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PipelineConfigError(f"{prefix}{key}={value!r} must be an integer")


def require_bool(cfg: DictConfig, *keys: str, prefix: str = "") -> None:
    """Each dotted key holds true or false (``no`` or ``0`` would read as a setting), as
    ``require_int``."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, bool):
            raise PipelineConfigError(f"{prefix}{key}={value!r} must be true or false")


def require_packages(setting: str, *modules: str) -> None:
    """The optional packages ``setting`` (e.g. ``task=scrolls``) imports are installed, or one
    error before any directory, naming each with its install line (tape.optional)."""
    problems = [why for why in map(missing, modules) if why]
    if problems:
        raise PipelineConfigError(f"{setting} reads with {', '.join(modules)}: {'; '.join(problems)}")


def is_number(value: object) -> bool:
    """An int or a float, not a bool (YAML's true is an int to Python)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def require_multipliers(task: DictConfig, key: str, example: str) -> list[int]:
    """``task.<key>``, a non-empty list of integers >= 1 (``[1,abc]`` is named, not a traceback)."""
    value = task.get(key)
    items = list(value) if OmegaConf.is_list(value) else None
    if not items or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in items):
        shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        raise PipelineConfigError(f"task.{key}={shown!r} must be a non-empty list of integers >= 1 "
                                  f"(length multiples of task.seq_len), e.g. task.{key}={example}")
    return items


def check_optim(cfg: DictConfig) -> None:
    """optim.* values AdamW or the schedule would refuse, named before any directory exists."""
    if cfg.get("optim") is None:
        return
    from tape.schedule import optim_problems

    values = OmegaConf.to_container(cfg.optim, resolve=True)
    known = typing.get_type_hints(optim_problems)
    problems = type_problems(optim_problems, {k: v for k, v in values.items() if k in known})
    if problems:  # optim.lr=abc failed in a comparison, named as a misspelt key
        raise PipelineConfigError("; ".join(f"optim.{p}" for p in problems))
    try:
        problems = optim_problems(**values)
    except TypeError as err:  # a missing or misspelt key
        raise PipelineConfigError(f"optim: {err}") from None
    if problems:
        raise PipelineConfigError("; ".join(f"optim.{p}" for p in problems))


def check_compile(cfg: DictConfig, runs_itself: bool = False) -> None:
    """``compile`` is a bool, and true only where it has an effect that has been checked."""
    value = cfg.get("compile", False)
    if not isinstance(value, bool):
        raise PipelineConfigError(f"compile={value!r} must be true or false")
    if not value:
        return
    if runs_itself:
        raise PipelineConfigError(
            "compile=true applies to the decoder trained by pipelines.train; this task runs its own "
            "fits (Hugging Face Llama) and does not compile: drop compile=true")
    strategy = OmegaConf.select(cfg, "trainer.strategy._target_", default=None)
    if strategy is not None and strategy.endswith("FSDPStrategy"):
        raise PipelineConfigError(
            "compile=true has not been verified with trainer=fsdp; use trainer=gpu or trainer=ddp, "
            "or drop compile=true")


def check_trainer(cfg: DictConfig) -> None:
    """The last step must be validated (so last.ckpt and metrics hold the final model), and
    checkpoints must fall on optimizer steps (so a resumed run replays exactly); optimizer values
    and the training step's memory are checked here too."""
    check_optim(cfg)
    check_compile(cfg)
    training_precision(cfg)
    if cfg.get("evaluate", True):
        evaluation_precision(cfg)
    require_int(cfg, "seed", "trainer.max_steps", "trainer.val_check_interval",
                "trainer.accumulate_grad_batches")
    if not 0 <= int(cfg.seed) < 2**32:
        raise PipelineConfigError(f"seed={cfg.seed} must be in [0, 2**32) (NumPy's seed range); pick a "
                                  "non-negative seed")
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


def check_accelerator(trainer: DictConfig) -> None:
    """``trainer.accelerator`` / ``trainer.devices`` name hardware this machine has."""
    import torch

    acc, devices = str(trainer.get("accelerator", "cpu")), trainer.get("devices", 1)
    if acc in ("gpu", "cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise PipelineConfigError(
                f"trainer.accelerator={acc} but this machine has no usable CUDA GPU "
                "(torch.cuda.is_available() is False); use trainer=cpu, or run where there is a GPU"
            )
        wanted = list(devices) if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices) else []
        if any(int(i) >= n for i in wanted) or (isinstance(devices, int) and devices > n):
            raise PipelineConfigError(
                f"trainer.devices={devices}: this machine has {n} GPU(s) (indices 0..{n - 1}); "
                "pick with trainer.devices=[i] or CUDA_VISIBLE_DEVICES"
            )
    elif (str(OmegaConf.select(trainer, "strategy._target_", default="")).endswith("FSDPStrategy")
          and not (acc == "auto" and torch.cuda.is_available())):
        raise PipelineConfigError(
            f"trainer=fsdp shards over GPUs only (Lightning refuses trainer.accelerator={acc}); on a "
            "CPU use trainer=ddp trainer.accelerator=cpu trainer.devices=2 (gloo), or run on GPUs"
        )
    elif acc == "mps" and not (torch.backends.mps.is_available()):
        raise PipelineConfigError("trainer.accelerator=mps but MPS is not available; use trainer=cpu")
