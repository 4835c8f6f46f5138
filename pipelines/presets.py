"""What a preset runs as is: ``conf/`` composed for ``experiment=<exp> pe=<pe>`` with no other
override, as a flat setting (tape.report.settings), so a paper-style table prefers the runs of
the preset itself over claim arms that changed it (a compute-matched step count, an ablation
switch). Handed to the report by its entry points (``render(..., preset=preset_setting)``)."""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipelines.hydra_conf import compose_or_none
from tape.report.settings import differences, setting_values


@functools.cache
def preset_setting(experiment: str, pe: str, overrides: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The flat setting of ``experiment=<experiment> pe=<pe>`` (and ``overrides``: a claim
    arm's) as conf/ has it now, completed as training completes it (``task.prepare``: the
    vocabulary and length a task derives) and resolved where it resolves; None when it does not
    compose (an experiment renamed on the command line has no preset). An experiment that names
    its own PE (context extension's ``llama``, no conf/pe option) composes without ``pe=``. A
    value left interpolated (``${hydra:...}``, paths) is left out."""
    cfg = compose_or_none("config", [f"experiment={experiment}", f"pe={pe}", *overrides])
    if cfg is None:
        cfg = compose_or_none("config", [f"experiment={experiment}", *overrides])
        if cfg is None or OmegaConf.select(cfg, "pe.name") != pe:
            return None
    _prepare(cfg)
    flat = setting_values(OmegaConf.to_container(cfg, resolve=False))
    for key, value in list(flat.items()):
        if isinstance(value, str) and "${" in value:
            try:
                flat[key] = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
            except Exception:  # noqa: BLE001 - a resolver only a Hydra job has: not a setting
                del flat[key]
    return flat


def _prepare(cfg: DictConfig) -> None:
    """``task.prepare`` as pipelines.train runs it, where it needs nothing but the config; an
    unknown task or a value its checks refuse is compared as conf/ has it."""
    from pipelines import tasks
    from pipelines.errors import PipelineConfigError

    try:  # tasks.get imports only the task's module (names() would import every task's)
        tasks.prepare_from_conf(cfg)
    except PipelineConfigError:  # an unknown task, or a value its checks refuse: as conf/ has it
        pass


def is_preset_run(config: dict[str, Any], experiment: str, pe: str, overrides: tuple[str, ...] = ()) -> bool:
    """Whether a run's ``config`` has the setting ``experiment=<experiment> pe=<pe>`` and
    ``overrides`` compose to (keys only one of them has do not count); True where that does not
    compose (no preset to hold it to)."""
    setting = preset_setting(experiment, pe, overrides)
    return setting is None or not differences(config, setting)
