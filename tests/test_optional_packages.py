"""Optional packages (datasets, rouge-score): a machine without them (a GPU image, a partial
install) is told what to install, before a run claims its directory, not by a traceback."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pipelines.errors import PipelineConfigError
from tape import optional

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """``without("datasets")``: the package is not installed, as far as find_spec and import go."""
    real = importlib.util.find_spec

    def hide(*names: str) -> None:
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, **k: None if name.split(".")[0] in names else real(name, *a, **k))
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError
    return hide


def test_the_pins_are_the_requirements() -> None:
    pins = {line.split(";")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()}
    assert set(optional.PINS.values()) <= pins


def test_a_missing_package_is_named_with_its_install_line(without) -> None:
    assert (optional.missing("datasets") is None) == (importlib.util.find_spec("datasets") is not None)
    without("rouge_score")
    with pytest.raises(ModuleNotFoundError, match=r"SCROLLS' ROUGE needs .*pip install rouge-score==0\.1\.2"):
        optional.require("rouge_score.rouge_scorer", "SCROLLS' ROUGE")


def test_a_missing_stream_source_is_named_before_the_missing_package(without, tmp_path: Path) -> None:
    """open_text_stream imported datasets first: without it, a wrong task.text_source got a
    ModuleNotFoundError instead of what to do (the GPU image's stack, on this CPU)."""
    from tape.data.streaming import open_text_stream

    without("datasets")
    with pytest.raises(FileNotFoundError, match="task.text_source"):
        open_text_stream(str(tmp_path / "nowhere"))


@pytest.mark.parametrize(("setting", "package", "pin"), [
    ("task.dataset=gov_report", "rouge_score", "rouge-score==0.1.2"),
    ("task.dataset=qasper", "datasets", "datasets==5.2.0"),
])
def test_scrolls_without_its_packages_is_refused(make_cfg, without, setting, package, pin) -> None:
    """Checked in validate, which runs before a run claims its directory."""
    from pipelines.tasks.scrolls import validate

    without(package)
    with pytest.raises(PipelineConfigError, match=f"task=scrolls {setting} reads with .*pip install {pin}"):
        validate(make_cfg("experiment=scrolls/smoke", "pe=tape", setting))


@pytest.mark.datasets
def test_qa_scrolls_does_not_need_rouge(make_cfg, without) -> None:
    from pipelines.tasks.scrolls import validate

    without("rouge_score")
    validate(make_cfg("experiment=scrolls/smoke", "pe=tape", "task.dataset=qasper"))  # F1: no ROUGE


def test_streamed_pretraining_without_datasets_is_refused(make_cfg, without) -> None:
    from pipelines.tasks.pretrain import validate

    without("datasets")
    with pytest.raises(PipelineConfigError, match=r"task.corpus=stream reads with datasets: .*datasets==5\.2\.0"):
        validate(make_cfg("experiment=pretrain/smoke", "pe=rope", "task.corpus=stream"))
    validate(make_cfg("experiment=pretrain/smoke", "pe=rope"))  # the books corpus needs no datasets


def test_context_extension_from_the_hub_without_datasets_is_refused(without, tmp_path: Path) -> None:
    from conftest import compose_config
    from pipelines.tasks.context_extension.data import check_inputs

    (tmp_path / "config.json").write_text("{}")
    token_file = tmp_path / "t.bin"
    token_file.write_bytes(b"\0\0")
    cfg = compose_config("config", ["experiment=context_extension/smoke", "data.source=hub",
                                    f"model.pretrained_path={tmp_path}"])
    cfg.data.eval_files = {"t": str(token_file)}  # every other input there: only the package is missing
    without("datasets")
    with pytest.raises(PipelineConfigError, match="data.source=hub reads with datasets"):
        check_inputs(cfg)
