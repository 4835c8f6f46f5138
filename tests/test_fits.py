"""The memory floor of a training step: it grows as it should, and every preset fits its device."""

from __future__ import annotations

import pytest

from conftest import CONF_DIR, compose_config
from pipelines.fits import GIB, Step, step_floor_bytes, training_step

PRESETS = sorted(str(p.relative_to(CONF_DIR / "experiment").with_suffix(""))
                 for p in (CONF_DIR / "experiment").glob("*/*.yaml"))

BASE = Step(8, 1024, 768, 12, 12, 32000, bias_pe=False, half=True)


def test_the_floor_grows_with_length_batch_bias_and_precision() -> None:
    assert step_floor_bytes(BASE._replace(seq_len=2048)) > step_floor_bytes(BASE)
    assert step_floor_bytes(BASE._replace(batch=16)) == 2 * step_floor_bytes(BASE)
    assert step_floor_bytes(BASE._replace(bias_pe=True)) - step_floor_bytes(BASE) == 8 * 12 * 1024**2 * 4
    assert step_floor_bytes(BASE._replace(half=False)) == 2 * step_floor_bytes(BASE)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_is_under_its_devices_memory(preset: str) -> None:
    """Paper presets run on one 80 GB GPU, the others on a laptop: none may be refused there."""
    step = training_step(compose_config("config", [f"experiment={preset}", "pe=alibi"]))
    if step is None:
        pytest.skip(f"{preset} has no single training length")
    limit = 78 if preset.endswith("/paper") else 8
    assert step_floor_bytes(step) < limit * GIB, (preset, step)
