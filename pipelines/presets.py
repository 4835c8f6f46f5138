"""What a preset runs as is: ``conf/`` composed for ``experiment=<exp> pe=<pe>`` with no other
override, as a flat setting (tape.report.settings), so a paper-style table prefers the runs of
the preset itself over claim arms that changed it (a compute-matched step count, an ablation
switch). Handed to the report by its entry points (``render(..., preset=preset_setting)``)."""

from __future__ import annotations

import functools
from typing import Any

from pipelines.hydra_conf import CONF_DIR
from tape.report.settings import setting_values


@functools.cache
def preset_setting(experiment: str, pe: str) -> dict[str, Any] | None:
    """The flat setting of ``experiment=<experiment> pe=<pe>`` as conf/ has it now; None when
    conf/ has no such preset (an experiment renamed on the command line).
    Values that still hold an interpolation are left out (the run's resolved value is compared)."""
    if not (CONF_DIR / "experiment" / f"{experiment}.yaml").is_file():
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"experiment={experiment}", f"pe={pe}"])
        config = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001 - a preset that no longer composes: no preference
        return None
    finally:
        GlobalHydra.instance().clear()
    return {k: v for k, v in setting_values(config).items() if not (isinstance(v, str) and "${" in v)}

