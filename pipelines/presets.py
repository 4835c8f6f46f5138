"""What a preset runs as is: ``conf/`` composed for ``experiment=<exp> pe=<pe>`` with no other
override, as a flat setting (tape.report.settings), so a paper-style table prefers the runs of
the preset itself over claim arms that changed it (a compute-matched step count, an ablation
switch). Handed to the report by its entry points (``render(..., preset=preset_setting)``)."""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from pipelines.hydra_conf import CONF_DIR
from tape.report.settings import differences, setting_values


def compose_apart(overrides: list[str]) -> DictConfig | None:
    """conf/config.yaml composed with ``overrides`` by Hydra's config loader without Hydra's
    global state, so a running job (SCROLLS choosing its pretraining run) can call it; None when
    it does not compose. The hydra node is dropped."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    try:
        loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
        cfg = loader.load_configuration(config_name="config", overrides=list(overrides), run_mode=RunMode.RUN)
    except Exception:  # noqa: BLE001 - any composition failure: not a preset
        return None
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@functools.cache
def preset_setting(experiment: str, pe: str, overrides: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The flat setting of ``experiment=<experiment> pe=<pe>`` (and ``overrides``: a claim
    arm's) as conf/ has it now; None when it does not compose (an experiment renamed on the
    command line has no preset). Values that still hold an interpolation are left out (the
    run's resolved value is compared)."""
    cfg = compose_apart([f"experiment={experiment}", f"pe={pe}", *overrides])
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
