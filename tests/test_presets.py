"""pipelines/presets.py: a run made by a preset's own command counts as that preset's run, and a
run whose model was changed does not (reproduce skips, resumes and the report pools by it)."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import compose_config
from pipelines import tasks
from pipelines.presets import is_preset_run


def saved_config(*overrides: str) -> dict:
    """The config.yaml a run of ``overrides`` writes: completed by its task's prepare, resolved."""
    cfg = compose_config("config", list(overrides))
    assert tasks.prepare_from_conf(cfg)
    return yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))


@pytest.mark.parametrize("experiment", ["word_problem/cpu", "parity/cpu", "counting/cpu", "mqar/cpu",
                                        "selective_copy/cpu", "addition/cpu", "flipflop/cpu"])
def test_a_presets_own_run_is_its_run(experiment: str) -> None:
    """Tasks whose prepare fills task.vocab_size / task.seq_len (null in conf/) never matched, so
    reproduce retrained every C5 and C6 run though their records were committed."""
    assert is_preset_run(saved_config(f"experiment={experiment}", "pe=rope"), experiment, "rope")


@pytest.mark.parametrize("change", ["model.max_seq_len=1024", "model.vocab_size=512"])
def test_a_run_with_a_changed_model_is_not_the_presets(change: str) -> None:
    """Keys the preset interpolates (model.max_seq_len: ${task.seq_len}) were left out of the
    comparison, so a run with another model pooled into the preset's row."""
    assert not is_preset_run(saved_config("experiment=flipflop/cpu", "pe=cope", change), "flipflop/cpu", "cope")


def test_a_task_that_adopts_a_run_is_left_as_conf_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCROLLS' prepare reads task.pretrained_run; callers that have only conf/ (the preset
    comparison, the memory floors) each skipped it by name."""
    from pipelines.errors import PipelineConfigError
    from pipelines.tasks.scrolls import Scrolls

    cfg = compose_config("config", ["experiment=scrolls/cpu", "pe=rope"])
    before = OmegaConf.to_container(cfg)
    assert not tasks.prepare_from_conf(cfg)
    assert OmegaConf.to_container(cfg) == before
    monkeypatch.setattr(Scrolls, "prepare_reads_runs", False)
    with pytest.raises(PipelineConfigError):
        tasks.prepare_from_conf(cfg)
