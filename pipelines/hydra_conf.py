"""Where conf/ lives, the resolvers its YAML uses (${run_id:}, ${cwd:}), instantiating its groups."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

# One id per process: with the second-resolution time it names the run directory. Two runs
# started in the same second get different ids; jobs of one multirun add their job number.
RUN_ID = secrets.token_hex(3)
if not OmegaConf.has_resolver("run_id"):
    OmegaConf.register_new_resolver("run_id", lambda: RUN_ID)
# The launch directory. Not ${hydra:runtime.cwd}: the multirun sweep dir is resolved before
# Hydra's runtime config exists.
if not OmegaConf.has_resolver("cwd"):
    OmegaConf.register_new_resolver("cwd", os.getcwd)

# An absolute path (conf/hydra/evaluate.yaml's multirun job dirs).
if not OmegaConf.has_resolver("abspath"):
    OmegaConf.register_new_resolver("abspath", lambda path: os.path.abspath(str(path)))

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"


def compose_or_none(config_name: str, overrides: Sequence[str], hydra: bool = False) -> DictConfig | None:
    """conf/<config_name> composed with ``overrides`` as ``@hydra.main(version_base="1.3")``
    would, by Hydra's config loader without Hydra's global state (so a running job can call it);
    the hydra node kept when ``hydra``; None when it does not compose (Hydra says why itself
    when the command runs)."""
    from hydra import version
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.utils import setup_globals
    from hydra.types import RunMode

    if not OmegaConf.has_resolver("now"):
        setup_globals()  # ${now:}, ${hydra:}: what Hydra registers when it starts
    base = version.VersionBase.instance()
    saved = base.getbase()
    version.setbase("1.3")
    try:
        loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
        cfg = loader.load_configuration(config_name=config_name, overrides=list(overrides), run_mode=RunMode.RUN)
    except Exception:  # noqa: BLE001 - any composition failure: left to Hydra's own message
        return None
    finally:
        base.version_base = saved  # a job's own version base (or none) as it was
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a group like ``logger`` or ``callbacks`` (null entries skipped)."""
    from hydra.utils import instantiate  # here: `import pipelines` stays free of Hydra

    if not group:
        return []
    return [instantiate(node) for node in group.values() if node and "_target_" in node]
