"""notebooks/results.ipynb draws from the committed results/ CSVs: its helpers give numbers,
and executed as `make notebook` runs it, every section draws a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "results.ipynb"
RESULTS = ROOT / "results"


def setup_cell(monkeypatch: pytest.MonkeyPatch, results: Path) -> dict[str, Any]:
    """Run the notebook's first code cell (imports and helpers) on ``results``; its namespace."""
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.setenv("TAPE_RESULTS", str(results))
    cell = next(c for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code")
    namespace: dict[str, Any] = {}
    exec(compile(cell.source, f"{NOTEBOOK.name}[setup]", "exec"), namespace)
    return namespace


def test_pretraining_frame_holds_the_committed_perplexities(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = setup_cell(monkeypatch, RESULTS)
    table = pd.read_csv(RESULTS / "tables" / "pretrain_cpu.csv")
    frame = nb["pretrain_frame"](nb["load"]("pretrain_cpu"))
    assert list(frame.index) == list(table["PE"])  # every PE of the CSV; was an all-NaN frame
    first = next(c for c in table.columns if c.startswith("ppl") and not c.endswith((" std", " n")))
    assert frame[first].tolist() == pytest.approx(table[first].tolist())
    assert not frame.isna().any().any()


def test_pretraining_frame_drops_pes_without_a_number(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "pretrain_cpu.csv").write_text(
        "PE,seeds,ppl @ 64 tokens (1x),ppl @ 64 tokens (1x) std,ppl @ 128 tokens (2x)\n"
        "RoPE,1,90.5,,91.5\nTAPE,0,not run: no finished run,,not run: no finished run\n")
    nb = setup_cell(monkeypatch, tmp_path)
    frame = nb["pretrain_frame"](nb["load"]("pretrain_cpu"))
    assert list(frame.index) == ["RoPE"] and list(frame.columns) == ["ppl @ 64 tokens (1x)", "ppl @ 128 tokens (2x)"]
    assert frame.loc["RoPE"].tolist() == [90.5, 91.5]


@pytest.mark.slow  # starts a Jupyter kernel (~10 s)
def test_notebook_draws_every_section_from_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("TAPE_RESULTS", str(RESULTS))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    pretrain = next(c for c in code if "pretrain_frame(table)" in c.source)
    assert any("image/png" in o.get("data", {}) for o in pretrain.outputs)  # the plot was drawn
    text = "".join(str(o.get("text", "")) for o in pretrain.outputs)
    assert "no finished run" not in text
    for marker in ('load("claims_all")', 'load(f"flipflop_{scale}")'):  # issue 23: Claims and flip-flop
        cell = next(c for c in code if marker in c.source)
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), marker


def test_make_notebook_runs_the_notebook_with_the_venvs_jupyter() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\nnotebook:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/jupyter execute notebooks/results.ipynb" in target
    assert "TAPE_RESULTS=$(abspath $(or $(RESULTS),results))" in target  # any rendered folder
    assert "make notebook" in (ROOT / "README.md").read_text()


def test_the_notebook_tells_up_to_twenty_arms_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its flip-flop and pretraining plots drew 12-13 arms in matplotlib's 10 default colours."""
    import matplotlib.pyplot as plt

    with plt.rc_context():
        nb = setup_cell(monkeypatch, RESULTS)
        colours = nb["plt"].rcParams["axes.prop_cycle"].by_key()["color"]
        assert len(set(colours)) == 20 and callable(nb["draw_grid"])  # the report's heatmap, red training box
