"""Where conf/ lives, the resolvers its YAML uses (${run_id:}, ${cwd:}), instantiating its groups."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

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


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a group like ``logger`` or ``callbacks`` (null entries skipped)."""
    from hydra.utils import instantiate  # here: `import pipelines` stays free of Hydra

    if not group:
        return []
    return [instantiate(node) for node in group.values() if node and "_target_" in node]
