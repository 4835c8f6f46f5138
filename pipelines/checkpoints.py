"""Reading a Lightning checkpoint, or failing with one message that names the config key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.errors import PipelineConfigError


def load_checkpoint(path: Path, key: str = "ckpt_path") -> dict[str, Any]:
    """A Lightning checkpoint (memory-mapped, on the CPU); a file that is not one fails with one
    message naming ``key``."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # noqa: BLE001 - any failure to read means "not a checkpoint"
        raise PipelineConfigError(  # torch's own error: HYDRA_FULL_ERROR=1
            f"{key}={path} is not a readable Lightning checkpoint (damaged, truncated or not "
            f"written by torch.save; {type(err).__name__}); pass another checkpoint or run "
            f"directory, or drop {key} to start afresh"
        ) from err
    if not isinstance(state, dict) or not {"state_dict", "global_step"} <= set(state):
        raise PipelineConfigError(
            f"{key}={path} is not a Lightning checkpoint (no state_dict / global_step); pass a "
            "checkpoints/*.ckpt file written by pipelines.train"
        )
    return state


def read_checkpoint_step(path: Path, key: str = "ckpt_path") -> int:
    """The global step of a Lightning checkpoint; fails naming ``key`` when the file is not one
    (truncated, corrupt, or some other file), instead of torch's unpickling advice."""
    return int(load_checkpoint(path, key)["global_step"])
