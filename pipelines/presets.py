"""What a preset runs as is: ``conf/`` composed for ``experiment=<exp> pe=<pe>`` with no other
override, as a flat setting (tape.report.settings), so a paper-style table prefers the runs of
the preset itself over claim arms that changed it (a compute-matched step count, an ablation
switch). Handed to the report by its entry points (``render(..., preset=preset_setting)``)."""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import OmegaConf

from pipelines.hydra_conf import compose_or_none
from tape.report.settings import differences, setting_values


@functools.cache
def preset_setting(experiment: str, pe: str, overrides: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The flat setting of ``experiment=<experiment> pe=<pe>`` (and ``overrides``: a claim
    arm's) as conf/ has it now; None when it does not compose (an experiment renamed on the
    command line has no preset). Values that still hold an interpolation are left out (the
    run's resolved value is compared)."""
    cfg = compose_or_none("config", [f"experiment={experiment}", f"pe={pe}", *overrides])
    if cfg is None:
        return None
    config = OmegaConf.to_container(cfg, resolve=False)
    return {k: v for k, v in setting_values(config).items() if not (isinstance(v, str) and "${" in v)}


def is_preset_run(config: dict[str, Any], experiment: str, pe: str, overrides: tuple[str, ...] = ()) -> bool:
    """Whether a run's ``config`` has the setting ``experiment=<experiment> pe=<pe>`` and
    ``overrides`` compose to (keys only one of them has do not count); True where that does not
    compose (no preset to hold it to)."""
    setting = preset_setting(experiment, pe, overrides)
    return setting is None or not differences(config, setting)
