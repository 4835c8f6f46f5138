"""The memory floor of a training step: it grows as it should, and every preset fits its device."""

from __future__ import annotations

import pytest

from conftest import CONF_DIR, compose_config
from pipelines import tasks
from pipelines.errors import PipelineConfigError
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
    cfg = compose_config("config", [f"experiment={preset}", "pe=alibi"])
    tasks.prepare_from_conf(cfg)
    step = training_step(cfg)
    if step is None:
        pytest.skip(f"{preset} has no single training length")
    limit = 78 if preset.endswith("/paper") else 8
    assert step_floor_bytes(step) < limit * GIB, (preset, step)


@pytest.mark.parametrize("preset", ["parity/cpu", "counting/cpu", "word_problem/cpu", "addition/cpu"])
def test_a_step_that_cannot_fit_is_refused_for_tasks_that_derive_their_length(preset: str) -> None:
    """The check ran before task.prepare filled task.seq_len, so parity, counting and the word
    problem passed any batch size (the floor was None)."""
    from pipelines.train import check_settings

    with pytest.raises(PipelineConfigError, match="needs at least .* GiB"):
        check_settings(compose_config("config", [f"experiment={preset}", "pe=alibi", "task.batch_size=100000000"]))


def test_gradient_checkpointing_keeps_a_blocks_input_per_layer() -> None:
    """The floor counted four tensors a layer with checkpointing on, above the measured step (a
    24-layer model: 384 MiB floor against 239 MiB measured), so configs that fit were refused."""
    ckpt = BASE._replace(checkpointing=True)
    tokens_bytes = BASE.batch * BASE.seq_len * BASE.d_model * 2
    assert step_floor_bytes(BASE) - step_floor_bytes(ckpt) == (4 * BASE.n_layers - (BASE.n_layers + 4)) * tokens_bytes


def test_ddp_on_auto_is_held_to_the_gpu_and_cpu_ddp_to_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer=ddp (accelerator auto, which Lightning runs on CUDA) was compared with host RAM;
    two CPU processes were checked as one."""
    import torch

    from pipelines import fits

    gpu = type("Props", (), {"total_memory": 80 * GIB, "name": "Fake GPU"})()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: gpu)
    assert fits.device_bytes("auto") == (80 * GIB, "Fake GPU has 80 GiB", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ram = fits.device_bytes("cpu")[0]
    preset = training_step(compose_config("config", ["experiment=addition/cpu", "pe=alibi"]))
    batch = int(0.6 * ram / step_floor_bytes(preset) * preset.batch)  # one process fits in RAM, two do not
    fits.check_fits(compose_config("config", ["experiment=addition/cpu", "pe=alibi", f"task.batch_size={batch}"]))
    with pytest.raises(PipelineConfigError, match="in each of 2 processes"):
        fits.check_fits(compose_config("config", ["experiment=addition/cpu", "pe=alibi", f"task.batch_size={batch}",
                                                  "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]))
