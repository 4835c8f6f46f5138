"""The report renderer on fake run directories laid out exactly as the pipelines write them.

The fake runs test the renderer, not results: every number below is made up for the test and
never leaves tmp_path.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.report import main as report_main
from tape.metrics.arithmetic import Cell
from tape.report import scrolls as scrolls_report
from tape.report.heatmap import plot_panel, pool_seeds
from tape.report.provenance import provenance_line
from tape.report.render import WouldLoseResults, render, scales_to_render
from tape.report.runs import find_runs, latest_finished
from tape.report.stats import Missing, Summary, summarize
from tape.report.tables import Table, to_csv, to_latex, to_markdown
from warm_python import run_module

UNFINISHED = "unfinished: 1 run(s) without metrics.json"


def make_run(runs: Path, experiment: str, pe: str, seed: int, name: str, metrics: dict | None,
             config: dict | None = None, files: dict[str, str] | None = None) -> Path:
    """A run directory as pipelines.train leaves it."""
    run = runs / experiment / pe / str(seed) / name
    run.mkdir(parents=True)
    (run / "command.txt").write_text(
        f"python -m pipelines.train experiment={experiment} pe={pe} seed={seed}\n"
        f"# launched as: /venv/bin/python -m pipelines.train -m experiment={experiment}\n"
        f"# cwd: /work\n# commit: 0123456789abcdef0123\n# time: Sun Nov 22 20:52:10 2026\n"
        f"# machine: 2 CPU cores, Test CPU, Linux x86_64\n")
    (run / "config.yaml").write_text(yaml.safe_dump(config or {}))
    for fname, text in (files or {}).items():
        (run / fname).write_text(text)
    if metrics is not None:
        base = {"pe": pe, "seed": seed, "experiment": experiment, "scale": experiment.split("/")[-1]}
        (run / "metrics.json").write_text(json.dumps({**base, **metrics}))
    return run


def grid_csv(accuracy_by_cell: dict[tuple[int, int], int], n: int = 10) -> str:
    rows = ["len_a,len_b,n,correct"] + [f"{a},{b},{n},{k}" for (a, b), k in accuracy_by_cell.items()]
    return "\n".join(rows) + "\n"


ADD_CFG = {"task": {"name": "addition", "max_digits": 1, "eval_max_digits": 2},
           "trainer": {"max_steps": 100}}


def addition_metrics(mean: float) -> dict[str, Any]:
    return {"task": "addition", "mean_accuracy": mean, "in_distribution_accuracy": 90.0,
            "ood_accuracy": mean - 5, "train_time_s": 12.0, "wall_time_s": 20.0}


def build_runs(root: Path) -> Path:
    runs = root / "runs"
    grid = grid_csv({(1, 1): 10, (1, 2): 5, (2, 1): 0, (2, 2): 2})
    make_run(runs, "addition/cpu", "rope", 0, "20261122-205210-0835a8-0", addition_metrics(20.0),
             ADD_CFG, {"grid.csv": grid})
    make_run(runs, "addition/cpu", "rope", 1, "20261122-205210-0835a8-1", addition_metrics(30.0),
             ADD_CFG, {"grid.csv": grid})
    # an older finished run of rope seed 0: superseded by the newer one above
    make_run(runs, "addition/cpu", "rope", 0, "20261121-100000-aaaaaa-0", addition_metrics(99.0),
             ADD_CFG, {"grid.csv": grid})
    make_run(runs, "addition/cpu", "tape", 0, "20261122-205210-0835a8-4", addition_metrics(41.0),
             ADD_CFG, {"grid.csv": grid})
    make_run(runs, "addition/cpu", "tape", 1, "20261122-215210-0835a8-4", None, ADD_CFG)
    # FIRE: only an unfinished run, which even left a grid behind; it must never show a number
    make_run(runs, "addition/cpu", "fire", 0, "20261122-205210-0835a8-3", None, ADD_CFG,
             {"grid.csv": grid})
    make_run(runs, "pretrain/cpu", "rope", 0, "20261122-220000-bbbbbb-0",
             {"task": "pretrain", "ppl_1x": 50.0, "ppl_2x": 80.0, "ppl_4x": 200.0, "wall_time_s": 60.0},
             {"task": {"name": "pretrain", "seq_len": 128}})
    # SCROLLS as conf/experiment/scrolls/cpu.yaml names it: experiment scrolls/cpu/<dataset>
    make_run(runs, "scrolls/cpu/qasper", "tape", 0, "20261122-230000-cccccc",
             {"task": "scrolls", "scrolls_task": "qasper", "scale": "cpu", "f1": 12.5,
              "scrolls_score": 12.5}, {"task": {"name": "scrolls", "dataset": "qasper"}, "scale": "cpu"})
    make_run(runs, "scrolls/cpu/quality", "tape", 0, "20261122-231000-cccccc", None,
             {"task": {"name": "scrolls", "dataset": "quality"}, "scale": "cpu"})
    ppl = ("method,corpus,length,perplexity,nll,windows,scored_tokens\n"
           "base,books,256,40.0,3.7,2,510\ntape,books,256,30.0,3.4,2,510\n"
           "lora,books,256,35.0,3.5,2,510\n")
    key = ("method,target_tokens,n_garbage,mean_tokens,trials,accuracy\n"
           "base,256,10,240.0,20,1.0\ntape,256,10,240.0,20,0.9\nlora,256,10,240.0,20,0.4\n")
    make_run(runs, "context_extension/cpu", "llama", 0, "20261122-210224-f2760f",
             {"task": "context_extension", "context": 128, "target_context": 256,
              "base_retrieves": True, "ppl_books_256_tape": 30.0, "wall_time_s": 100.0},
             {"task": {"name": "context_extension"}},
             {"perplexity.csv": ppl, "passkey.csv": key})
    # W&B files that must never be read
    wandb = runs / "addition/cpu/rope/0/20261122-205210-0835a8-0/wandb"
    wandb.mkdir()
    (wandb / "wandb-summary.json").write_text(json.dumps({"mean_accuracy": 77.7}))
    return runs


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("report")
    runs = build_runs(root)
    out = root / "results"
    out.mkdir()
    (out / "efficiency.md").write_text("# Efficiency\n\nGenerated by `python -m pipelines.benchmark` x.\n")
    (out / "efficiency.json").write_text(json.dumps({"command": "python -m pipelines.benchmark"}))
    render(runs, out)
    return runs, out


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    first = next(iter(rows[0]))
    return {row[first]: row for row in rows}


# ------------------------------------------------------------------------------ runs
def test_find_runs_reads_layout_and_skips_wandb_models_multirun(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    (runs / "multirun/20261122-205210-0835a8").mkdir(parents=True)
    (runs / "context_extension/models/base-123").mkdir(parents=True)
    found = find_runs(runs)
    assert len(found) == 10
    fires = find_runs(runs, under="addition/cpu/fire/0")  # one folder's (SCROLLS' pretrained_run=last)
    assert fires and [str(r.path) for r in fires] == [str(r.path) for r in found if (r.experiment, r.pe, r.seed)
                                                       == ("addition/cpu", "fire", 0)]
    assert find_runs(runs, under="addition/cpu/fire/0")[0].experiment == "addition/cpu"
    assert find_runs(runs, under="nowhere/cpu") == []
    by_name = {r.name: r for r in found}
    fire = by_name["20261122-205210-0835a8-3"]
    assert (fire.experiment, fire.pe, fire.seed, fire.finished) == ("addition/cpu", "fire", 0, False)
    assert fire.scale == "cpu" and fire.task == "addition"  # from the path and config.yaml
    assert fire.commit == "0123456789abcdef0123"
    assert fire.command == "python -m pipelines.train experiment=addition/cpu pe=fire seed=0"
    quality = by_name["20261122-231000-cccccc"]  # unfinished: scale from config.yaml, not the path
    assert (quality.experiment, quality.scale, quality.task) == ("scrolls/cpu/quality", "cpu", "scrolls")
    newest = latest_finished(found)
    assert newest[("addition/cpu", "rope", 0)].name == "20261122-205210-0835a8-0"


def test_eval_metrics_fill_gaps_but_never_override_the_run(tmp_path: Path) -> None:
    run = make_run(tmp_path, "addition/cpu", "rope", 0, "20261122-205210-0835a8-0",
                   {"task": "addition", "train_time_s": 5.0, "mean_accuracy": 10.0})
    ev = run / "eval" / "20261123-000000-dddddd"
    ev.mkdir(parents=True)
    (ev / "metrics.json").write_text(json.dumps({"mean_accuracy": 99.0, "ood_accuracy": 7.0}))
    (found,) = find_runs(tmp_path)
    assert found.metrics["mean_accuracy"] == 10.0
    assert found.metrics["ood_accuracy"] == 7.0
    assert found.metric_sources["ood_accuracy"] == "eval/20261123-000000-dddddd"


# ------------------------------------------------------------------------------ numbers
def test_summarize_mean_and_sample_std() -> None:
    s = summarize([20.0, 30.0])
    assert isinstance(s, Summary) and s.n == 2
    assert s.mean == pytest.approx(25.0) and s.std == pytest.approx(math.sqrt(50.0))
    one = summarize([41.0])
    assert isinstance(one, Summary) and one.std is None and one.format() == "41.00"
    assert isinstance(summarize([]), Missing) and isinstance(summarize([float("nan")]), Missing)
    assert summarize([float("nan")]).format() == "no finite value (1 non-finite)"
    kept = summarize([20.0, float("nan"), 30.0, float("inf")])  # the seeds column counts 4 runs
    assert (kept.n, kept.nonfinite, kept.mean) == (2, 2, 25.0)
    assert kept.format() == "25.00 ± 7.07 (n = 2; 2 non-finite left out)"


def test_addition_mean_std_over_seeds_newest_run_per_seed(rendered: tuple[Path, Path]) -> None:
    _, out = rendered
    rows = read_csv(out / "tables/addition_cpu.csv")
    mean_col = next(c for c in rows["RoPE"] if c.endswith("mean accuracy (%)"))
    assert float(rows["RoPE"][mean_col]) == pytest.approx(25.0)  # seeds 0 and 1; the old 99 is superseded
    assert float(rows["RoPE"][f"{mean_col} std"]) == pytest.approx(math.sqrt(50.0))
    assert rows["RoPE"][f"{mean_col} n"] == "2" and rows["RoPE"]["seeds"] == "2"
    assert float(rows["TAPE"][mean_col]) == pytest.approx(41.0)  # the unfinished seed 1 adds nothing
    assert rows["TAPE"]["seeds"] == "1" and rows["TAPE"][f"{mean_col} std"] == ""
    md = (out / "README.md").read_text()
    assert "| RoPE | 25.00 ± 7.07 | 2 |" in md
    assert "77.7" not in md  # the W&B summary is never read


def test_unfinished_and_missing_rows_never_show_numbers(rendered: tuple[Path, Path]) -> None:
    _, out = rendered
    rows = read_csv(out / "tables/addition_cpu.csv")
    ours = [c for c in rows["FIRE"] if "paper" not in c and c not in ("PE", "seeds")]
    assert {rows["FIRE"][c] for c in ours if not c.endswith((" std", " n"))} == {UNFINISHED}
    assert {rows["NoPE"][c] for c in ours if not c.endswith((" std", " n"))} == {"not run"}
    assert not (out / "figures/addition_cpu_fire.png").exists()  # its grid.csv is not a result
    assert (out / "figures/addition_cpu_rope.png").is_file()
    assert (out / "figures/addition_cpu_panel.png").is_file()
    pre = read_csv(out / "tables/pretrain_cpu.csv")
    assert float(pre["RoPE"]["ppl @ 512 tokens (4x)"]) == 200.0
    assert pre["TAPE"]["ppl @ 128 tokens (1x)"] == "not run"


def test_scrolls_table1_not_run_cells_and_labelled_paper_rows(rendered: tuple[Path, Path]) -> None:
    _, out = rendered
    rows = read_csv(out / "tables/scrolls_cpu.csv")
    assert float(rows["TAPE (ours)"]["QAS F1"]) == 12.5
    assert rows["TAPE (ours)"]["QuAL EM"] == UNFINISHED
    for col in ("CNLI EM", "NQA F1", "QMS Rgm", "SumS Rgm", "GovR Rgm"):
        assert rows["TAPE (ours)"][col] == "not run: data unavailable"
    assert {v for c, v in rows["RoPE (ours)"].items()
            if c not in ("PE", "seeds") and not c.endswith((" std", " n"))} == {"not run: data unavailable"}
    assert float(rows["TAPE (paper)"]["QuAL EM"]) == 11.60  # tape-spec E.2, in a row labelled paper
    assert float(rows["RoPE (paper)"]["GovR Rgm"]) == 9.71
    assert "NoPE" not in (out / "tables/scrolls_cpu.tex").read_text()  # no NoPE row, so no note on one


def test_a_nope_scrolls_run_brings_the_repo_history_row_and_its_note(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_run(runs, "scrolls/cpu/qasper", "nope", 0, "20261122-230000-dddddd",
             {"task": "scrolls", "scrolls_task": "qasper", "scale": "cpu", "f1": 3.0, "scrolls_score": 3.0},
             {"task": {"name": "scrolls", "dataset": "qasper"}, "scale": "cpu"})
    render(runs, tmp_path / "results")
    assert "NoPE (repo history)" in read_csv(tmp_path / "results/tables/scrolls_cpu.csv")
    assert "the NoPE row marked (repo history)" in (tmp_path / "results/tables/scrolls_cpu.tex").read_text()


@pytest.mark.parametrize("metrics, task, expected", [
    ({"scrolls_score": 3.0, "f1": 9.0}, "qasper", 3.0),
    ({"test_f1": 4.0}, "narrative_qa", 4.0),
    ({"em": 50.0}, "contract_nli", 50.0),
    ({"rouge/geometric_mean": 7.5, "rouge/rouge1": 20.0}, "gov_report", 7.5),
    ({"rouge_gm": 6.0}, "qmsum", 6.0),
    ({"f1": 9.0}, "quality", None),  # QuALITY is scored by exact match: f1 is not its score
])
def test_scrolls_score_keys(metrics: dict, task: str, expected: float | None) -> None:
    assert scrolls_report.score(metrics, task) == expected


def test_paper_columns_are_labelled(rendered: tuple[Path, Path]) -> None:
    _, out = rendered
    add = read_csv(out / "tables/addition_cpu.csv")
    paper_cols = [c for c in add["TAPE"] if c.startswith("paper")]
    assert len(paper_cols) == 2
    assert {float(add["TAPE"][c]) for c in paper_cols} == {41.42, 32.82}  # tape-spec E.1
    assert add["NoPE"][next(c for c in paper_cols if "Fig. 5" in c)] == "not reported"
    for name in ("paper_table2_perplexity", "paper_fig3_passkey"):
        header = (out / f"tables/{name}.csv").read_text().splitlines()[0].split(",")
        assert all(h.startswith("paper") for h in header[1:])
    md = (out / "README.md").read_text()
    assert md.count("**the paper's**") >= 2 and "not ours" in md


def test_context_extension_tables_and_figure(rendered: tuple[Path, Path]) -> None:
    _, out = rendered
    ppl = read_csv(out / "tables/context_extension_cpu_perplexity.csv")
    assert float(ppl["TAPE"]["books 256"]) == 30.0 and float(ppl["LoRA"]["books 256"]) == 35.0
    assert ppl["Theta Scaling"]["books 256"] == "not evaluated"
    key = read_csv(out / "tables/context_extension_cpu_passkey.csv")
    assert float(key["LoRA"]["<= 256 tokens (mean 240)"]) == pytest.approx(0.4)
    assert (out / "figures/passkey_cpu.png").is_file()


def test_latex_csv_markdown_and_provenance(rendered: tuple[Path, Path]) -> None:
    _, out = rendered
    tex = (out / "tables/addition_cpu.tex").read_text()
    assert r"\begin{tabular}" in tex and r"RoPE & 25.00 $\pm$ 7.07 & 2 &" in tex and r"(\%)" in tex
    assert r"TAPE & 41.00 & 1 &" in tex  # a single seed: its value, no ±
    md = (out / "README.md").read_text()
    assert "Provenance: 3 run(s) at commit(s) 0123456789ab; " in md  # addition: rope 0, 1 and tape 0
    assert "commands, times and machines: [runs.csv](runs.csv)" in md  # one line; details in runs.csv
    assert "ran on:" not in md.split("## Addition")[1].split("## ")[0]
    assert "rendered by" in md
    assert "[efficiency.md](efficiency.md)" in md
    inventory = list(csv.DictReader(open(out / "runs.csv")))
    assert len(inventory) == 10
    assert {(r["commit"], r["machine"]) for r in inventory} == {
        ("0123456789abcdef0123", "2 CPU cores, Test CPU, Linux x86_64")}
    statuses = {(r["pe"], r["seed"], r["run_dir"].endswith("aaaaaa-0")): r["used"] for r in inventory
                if r["experiment"] == "addition/cpu"}
    assert statuses[("rope", "0", True)].startswith("no: superseded")


def test_provenance_keeps_dirty_marks_and_names_unrecorded_machines(tmp_path: Path) -> None:
    old = make_run(tmp_path, "addition/cpu", "rope", 0, "20261101-000000-aaaaaa-0", addition_metrics(1.0))
    (old / "command.txt").write_text("python -m pipelines.train pe=rope\n# commit: None\n")  # an old run
    new = make_run(tmp_path, "addition/cpu", "tape", 0, "20261122-000000-bbbbbb-0", addition_metrics(1.0))
    text = (new / "command.txt").read_text().replace("0123456789abcdef0123", "fedcba9876543210ffff+dirty")
    (new / "command.txt").write_text(text)
    line = provenance_line(find_runs(tmp_path), "STAMP")
    assert line.startswith("2 run(s) at commit(s) fedcba987654+dirty, unknown;")
    assert "ran on: 2 CPU cores, Test CPU, Linux x86_64 | machine not recorded;" in line
    assert line.endswith("; STAMP")


def test_table_renderers_escape_and_expand() -> None:
    t = Table("t", "a & b_c", ["PE", "x"], [["RoPE", Summary(1.0, 0.5, 2)], ["TAPE", Missing("a|b")]])
    assert "| TAPE | a\\|b |" in to_markdown(t) and "| RoPE | 1.00 ± 0.50 |" in to_markdown(t)
    assert r"\caption{a \& b\_c}" in to_latex(t)
    lines = to_csv(t).splitlines()
    assert lines[0] == "PE,x,x std,x n" and lines[1] == "RoPE,1.0,0.5,2" and lines[2] == "TAPE,a|b,,"
    with pytest.raises(ValueError, match="cells"):
        Table("bad", "bad", ["a", "b"], [["only one"]])


# ------------------------------------------------------------------------------ re-rendering
def test_rerender_keeps_everything_and_adds_new_runs(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    out = tmp_path / "results"
    out.mkdir()
    (out / "efficiency.md").write_text("# kept\n")
    first = render(runs, out)
    snapshot = {p: p.read_bytes() for p in (out / "tables").glob("*.csv")}
    second = render(runs, out)
    assert sorted(map(str, first.files)) == sorted(map(str, second.files))
    assert all(p.read_bytes() == data for p, data in snapshot.items())
    assert (out / "efficiency.md").read_text() == "# kept\n"
    make_run(runs, "addition/cpu", "nope", 0, "20261123-010000-eeeeee-2", addition_metrics(11.0),
             ADD_CFG, {"grid.csv": grid_csv({(1, 1): 1, (1, 2): 1, (2, 1): 1, (2, 2): 1})})
    render(runs, out)
    rows = read_csv(out / "tables/addition_cpu.csv")
    mean_col = next(c for c in rows["RoPE"] if c.endswith("mean accuracy (%)"))
    assert float(rows["NoPE"][mean_col]) == 11.0 and float(rows["RoPE"][mean_col]) == 25.0
    assert all(p.exists() for p in first.files)


def test_scales_default_to_cpu_and_found_ones_but_not_smoke() -> None:
    assert scales_to_render(["smoke", "paper", "cpu"], None) == ["cpu", "paper"]
    assert scales_to_render(["smoke"], ["smoke"]) == ["smoke"]
    assert scales_to_render(["smoke", "demo"], None) == ["demo"]
    assert scales_to_render(["smoke"], None) == ["smoke"]  # only test runs: those
    assert scales_to_render([], None) == ["cpu"]  # nothing: cpu, whose missing runs are named
    assert scales_to_render(["paper"], None, rendered=["cpu", "cpu"]) == ["cpu", "paper"]  # results/ keeps cpu
    assert scales_to_render(["smoke"], None, rendered=["smoke"]) == ["smoke"]


# ------------------------------------------------------------------------------ W&B
def test_render_never_reads_wandb(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    seen: list[str] = []
    active = [True]

    def hook(event: str, args: tuple) -> None:
        if not active[0]:
            return
        if event == "open" and isinstance(args[0], (str, Path)):
            seen.append(str(args[0]))
        elif event in ("os.listdir", "os.scandir") and args and isinstance(args[0], (str, Path)):
            seen.append(str(args[0]))
        elif event == "import" and args and str(args[0]).split(".")[0] == "wandb":
            seen.append(f"import {args[0]}")

    sys.addaudithook(hook)
    try:
        report_main(["--runs", str(runs), "--out", str(tmp_path / "results")])
    finally:
        active[0] = False
    assert any(p.endswith("metrics.json") for p in seen)  # the hook does see the reads
    assert not [p for p in seen if "wandb" in Path(p).parts or p.startswith("import wandb")]


# ------------------------------------------------------------------------------ figures
def test_pool_seeds_and_panel() -> None:
    a = [Cell(1, 1, 10, 10), Cell(1, 2, 10, 0)]
    b = [Cell(1, 1, 10, 0), Cell(1, 2, 10, 10)]
    pooled = pool_seeds([a, b])
    assert pooled == [Cell(1, 1, 20, 10), Cell(1, 2, 20, 10)]
    fig = plot_panel({"RoPE": a, "TAPE": b}, 1, "panel")
    images = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in images] == ["RoPE", "TAPE"]
    assert images[1].images[0].get_array()[0, 0] == 0.0


# ------------------------------------------------------------------------------ notebook
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "results.ipynb"


@pytest.mark.slow  # starts a Jupyter kernel (~10 s)
def test_results_notebook_executes_on_rendered_results(
        rendered: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    _, out = rendered
    monkeypatch.setenv("TAPE_RESULTS", str(out))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(out.parent)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3  # bars, heatmaps, passkey
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert str(out.resolve()) in text and "TAPE" in text


def test_context_extension_variants_are_left_out_of_the_paper_tables(tmp_path) -> None:
    from tape.report.runs import Run, latest_finished

    plain, variant = tmp_path / "a", tmp_path / "b"
    for path, rows in ((plain, 0), (variant, 4)):
        path.mkdir()
        (path / "config.yaml").write_text(f"extend:\n  passkey_rows: {rows}\n")
    a, b = (Run(p, "context_extension/cpu", "llama", 0, {}) for p in (plain, variant))
    assert not a.variant and b.variant
    assert not Run(tmp_path / "none", "context_extension/cpu", "llama", 0, {}).variant
    assert list(latest_finished([a, b]).values()) == [a]  # the newer variant is not "the" run


def test_context_extension_table_pools_the_presets_recipes_not_a_claims_larger_setting(tmp_path: Path) -> None:
    """Three seeds of a claim's setting (TAPE alone, its maps switched off) against two of the
    preset's five recipes: with the preset (conf/ composed; context extension names its own PE,
    llama) the table's row is the preset's runs, and the claim's runs are set apart."""
    from pipelines.presets import preset_setting

    runs = tmp_path / "runs"
    recipes = ["tape", "tape_mix", "lora", "longlora", "theta"]
    base = {"task": {"name": "context_extension"}, "pe": {"name": "llama"}}
    for seed in (0, 1):
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261207-0900{seed:02d}-aaaaaa",
                 {f"ppl_books_512_{m}": 60.0 for m in ("base", *recipes)},
                 {**base, "extend": {"recipes": recipes}, "eval": {"maps_off": []}})
    for seed in (21, 22, 23):
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261207-1000{seed:02d}-bbbbbb",
                 {f"ppl_books_512_{m}": 90.0 for m in ("base", "tape")},
                 {**base, "extend": {"recipes": ["tape"]}, "eval": {"maps_off": ["tape"]}})
    assert preset_setting("context_extension/cpu", "llama")["extend.recipes"] == recipes
    assert preset_setting("context_extension/cpu", "gpt") is None  # not the PE the experiment names
    render(runs, tmp_path / "out", ["cpu"], preset=preset_setting)
    rows = read_csv(tmp_path / "out/tables/context_extension_cpu_perplexity.csv")
    assert float(rows["LoRA"]["books 512"]) == float(rows["TAPE"]["books 512"]) == 60.0
    md = (tmp_path / "out/README.md").read_text()
    assert "2 seed(s) (0, 1)" in md and "(seeds 21, 22, 23)" in md


def test_commit_label_ignores_rendered_results_but_not_code(tmp_path: Path) -> None:
    import subprocess

    from tape.vcs import commit_label

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "README.md").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    assert re.fullmatch(r"[0-9a-f]{40}", commit_label(tmp_path))
    (tmp_path / "results" / "README.md").write_text("re-rendered\n")  # what the report does
    assert not commit_label(tmp_path).endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert commit_label(tmp_path).endswith("+dirty")


# ------------------------------------------------------------------------------ issue 14
REPO = Path(__file__).resolve().parents[1]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_make_report_without_records_refuses_and_changes_nothing(tmp_path: Path) -> None:
    """Issue 14.1: results/ whose records are missing (runs/ is gitignored; issue 22 commits the
    records) is never rendered over."""
    import os
    import shutil
    import subprocess

    recipe = re.search(r"^report:.*\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.M).group(1)
    assert recipe.startswith("$(BIN)/python -m pipelines.report")
    shutil.copytree(REPO / "results", tmp_path / "results")
    shutil.rmtree(tmp_path / "results" / "records", ignore_errors=True)
    before = _snapshot(tmp_path / "results")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = run_module("pipelines.report", [], tmp_path, env, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no finished run at scale cpu under {tmp_path / 'results' / 'records'}" in out.stderr
    assert "--render-empty" in out.stderr and "Traceback" not in out.stderr
    assert _snapshot(tmp_path / "results") == before
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results" / "records").exists()


def test_report_refuses_to_drop_a_committed_pe_but_renders_empty_when_asked(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    out = tmp_path / "results"
    render(runs, out)
    before = _snapshot(out)
    shutil_rm = __import__("shutil").rmtree
    shutil_rm(runs / "addition/cpu/tape")  # TAPE's committed number has no run behind it now
    with pytest.raises(WouldLoseResults, match="addition/cpu tape"):
        render(runs, out)
    assert _snapshot(out) == before
    assert report_main(["--runs", str(runs), "--out", str(out)]) == 1
    assert report_main(["--runs", str(runs), "--out", str(out), "--render-empty"]) == 0
    assert "TAPE" in read_csv(out / "tables/addition_cpu.csv")


SMOKE_CFG = {"task": {"name": "addition", "max_digits": 2, "eval_max_digits": 4},
             "trainer": {"max_steps": 6, "val_check_interval": 3}, "pe": {"name": "tape"},
             "paths": {"output_dir": "x"}, "logger": {"wandb": {"name": "tape-seed0"}}}


def _smoke_run(runs: Path, seed: int, mean: float, name: str, **trainer: int) -> Path:
    config = json.loads(json.dumps(SMOKE_CFG))
    config["seed"] = seed
    config["paths"]["output_dir"] = f"/somewhere/{name}"  # paths never split a row
    config["logger"]["wandb"]["name"] = f"tape-seed{seed}"
    config["trainer"].update(trainer)
    metrics = {**addition_metrics(mean), "train_time_s": 600.0 if trainer else 1.0}
    return make_run(runs, "addition/smoke", "tape", seed, name, metrics, config)


def test_runs_that_differ_in_more_than_the_seed_are_never_pooled(tmp_path: Path) -> None:
    """Issue 14.2: TAPE smoke seeds 0 and 1 at 6 steps plus seed 5 at trainer.max_steps=600."""
    runs = tmp_path / "runs"
    _smoke_run(runs, 0, 10.0, "20261123-100000-aaaaaa")
    _smoke_run(runs, 1, 20.0, "20261123-100100-aaaaaa")
    _smoke_run(runs, 5, 90.0, "20261123-110000-bbbbbb", max_steps=600)
    out = tmp_path / "results"
    render(runs, out, ["smoke"])
    rows = read_csv(out / "tables/addition_smoke.csv")
    mean_col = next(c for c in rows["TAPE"] if c.endswith("mean accuracy (%)"))
    assert rows["TAPE"]["seeds"] == "2" and float(rows["TAPE"][mean_col]) == 15.0
    apart = rows["TAPE [trainer.max_steps=600]"]
    assert apart["seeds"] == "1" and float(apart[mean_col]) == 90.0
    md = (out / "README.md").read_text()
    assert "6 training steps" in md and "never pooled as seeds" in md
    assert "| TAPE | 15.00 ± 7.07 | 2 |" in md  # two seeds pooled, never "3 seeds"
    used = {r["seed"]: r["used"] for r in csv.DictReader(open(out / "runs.csv"))}
    assert used == {"0": "yes", "1": "yes", "5": "apart: trainer.max_steps=600"}


def test_a_table_row_is_the_presets_own_setting_not_a_claim_arm_of_as_many_seeds(tmp_path: Path) -> None:
    """Two settings with two seeds each, the newer one a claim arm at 600 steps: without a
    preset the newest wins the tie; with the preset (6 steps) its own runs are the row."""
    runs = tmp_path / "runs"
    _smoke_run(runs, 0, 10.0, "20261123-100000-aaaaaa")
    _smoke_run(runs, 1, 20.0, "20261123-100100-aaaaaa")
    _smoke_run(runs, 0, 80.0, "20261123-110000-bbbbbb", max_steps=600)
    _smoke_run(runs, 1, 90.0, "20261123-110100-bbbbbb", max_steps=600)
    presets = []

    def preset(experiment: str, pe: str) -> dict:
        presets.append((experiment, pe))
        return {"trainer.max_steps": 6, "task.max_digits": 2}

    def tape_row(out: Path, **kwargs) -> float:
        render(runs, out, ["smoke"], **kwargs)
        row = read_csv(out / "tables/addition_smoke.csv")["TAPE"]
        return float(next(v for c, v in row.items() if c.endswith("mean accuracy (%)")))

    assert tape_row(tmp_path / "newest") == 85.0
    assert tape_row(tmp_path / "preset", preset=preset) == 15.0
    assert ("addition/smoke", "tape") in presets
    # runs.csv says what the table did (it marked the preset's own runs "apart"), and the wall
    # time of the runs used counts every run the report shows, pooled or apart
    used = {(r["seed"], r["run_dir"][-6:]): r["used"] for r in csv.DictReader(open(tmp_path / "preset/runs.csv"))}
    assert used[("0", "aaaaaa")] == used[("1", "aaaaaa")] == "yes"
    assert used[("0", "bbbbbb")].startswith("apart: trainer.max_steps=600")
    walls = [float(json.loads(p.read_text())["wall_time_s"]) for p in runs.rglob("metrics.json")]
    summary = read_csv(tmp_path / "preset/tables/runs_summary.csv")["addition/smoke"]
    assert float(summary["wall time of the runs used (min)"]) == round(sum(walls) / 60, 1)


def test_the_preset_setting_is_conf_composed_without_overrides() -> None:
    from pipelines.presets import preset_setting

    pretrain = preset_setting("pretrain/cpu", "tape")
    assert pretrain["trainer.max_steps"] == 500 and pretrain["pe.tape_attn_update"] is True
    assert "seed" not in pretrain and not any(k.startswith("paths.") for k in pretrain)
    assert preset_setting("addition_c1_pilot/cpu", "rope") is None  # renamed on the command line


def test_rows_of_different_pes_with_different_settings_are_flagged(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _smoke_run(runs, 0, 10.0, "20261123-100000-aaaaaa")
    other = json.loads(json.dumps(SMOKE_CFG))
    other["pe"] = {"name": "rope"}
    other["trainer"]["max_steps"] = 12
    make_run(runs, "addition/smoke", "rope", 0, "20261123-100000-cccccc", addition_metrics(5.0), other)
    render(runs, tmp_path / "results", ["smoke"])
    md = (tmp_path / "results/README.md").read_text()
    assert "Not like for like" in md and "rope: trainer.max_steps=12; tape: trainer.max_steps=6" in md


def test_an_option_that_makes_another_method_gets_its_own_named_row(tmp_path: Path) -> None:
    """FoX runs with pe.fox_gate=cable are CABLE: their own row under that name, even where they
    outnumber the FoX runs (the main row of a PE is its most-seeded setting)."""
    runs = tmp_path / "runs"
    for seed, gate, mean, name in [(0, "cable", 30.0, "20261123-100000-aaaaaa"),
                                   (1, "cable", 50.0, "20261123-100100-aaaaaa"),
                                   (0, "fox", 10.0, "20261123-100200-aaaaaa")]:
        config = json.loads(json.dumps(SMOKE_CFG))
        config["pe"] = {"name": "fox", "fox_gate": gate}
        make_run(runs, "addition/smoke", "fox", seed, name, addition_metrics(mean), config)
    render(runs, tmp_path / "results", ["smoke"])
    rows = read_csv(tmp_path / "results/tables/addition_smoke.csv")
    mean_col = next(c for c in rows["FoX"] if c.endswith("mean accuracy (%)"))
    assert rows["FoX"]["seeds"] == "1" and float(rows["FoX"][mean_col]) == 10.0
    assert rows["CABLE"]["seeds"] == "2" and float(rows["CABLE"][mean_col]) == 40.0


def test_settings_differ_only_in_shared_keys_outside_the_ignored_ones() -> None:
    from tape.report.settings import NOT_SETTINGS, differences, same_setting

    base = {"seed": 0, "trainer": {"max_steps": 6, "enable_progress_bar": True},
            "paths": {"output_dir": "a"}, "optim": {"lr": 1e-3}}
    same = {**base, "seed": 3, "paths": {"output_dir": "b"},
            "trainer": {"max_steps": 6, "enable_progress_bar": False}}
    assert same_setting(base, same) and "seed" in NOT_SETTINGS and "paths" in NOT_SETTINGS
    changed = {**base, "optim": {"lr": 3e-3}}
    assert not same_setting(changed, base)
    assert differences(changed, base) == {"optim.lr": 3e-3}
    newer = {**base, "trainer": {**base["trainer"], "num_nodes": 1}}  # an option added later
    assert same_setting(newer, base)
    elsewhere = {**base, "data": {"data_dir": "/work/ce/data", "source": "books"}}  # another checkout
    assert same_setting(elsewhere, {**base, "data": {"data_dir": "/work/runner2/data", "source": "books"}})


def test_grouping_flattens_each_runs_config_once(tmp_path: Path, monkeypatch) -> None:
    """Grouping compared every run with every setting's newest run, flattening both configs
    each time (3,463 flattenings for the 537 committed records); each run's setting is now
    flattened once, and runs of one setting still pool while the others are set apart."""
    from tape.report import settings
    from tape.report.groups import group_by
    from tape.report.runs import Run

    calls = []
    real = settings.flatten
    monkeypatch.setattr(settings, "flatten", lambda config, prefix="": calls.append(prefix) or real(config, prefix))
    runs = [Run(tmp_path / f"20261123-1000{i:02d}-aaaaaa", "addition/smoke", "rope", i % 4, {"x": 1.0},
                _config={"seed": i % 4, "optim": {"lr": 1e-3 * (1 + i // 4)}}) for i in range(12)]
    groups = group_by(runs, lambda r: r.pe)
    assert len(groups) == 3 and all(len(g.finished) == 4 for g in groups.values())
    assert sum(1 for g in groups.values() if g.differs) == 2
    assert calls.count("") == len(runs)  # top-level flattenings: one per run


def test_provenance_range_is_in_time_order(tmp_path: Path) -> None:
    """Issue 14.10: ctime strings sort wrongly as text ("Mon Nov 23" < "Sun Nov 22")."""
    for name, when in (("20261122-235746-aaaaaa", "Sun Nov 22 23:57:46 2026"),
                       ("20261123-002405-bbbbbb", "Mon Nov 23 00:24:05 2026")):
        run = make_run(tmp_path, "addition/cpu", "rope", int(name[-1] == "b"), name, addition_metrics(1.0))
        text = (run / "command.txt").read_text().replace("Sun Nov 22 20:52:10 2026", when)
        (run / "command.txt").write_text(text)
    line = provenance_line(find_runs(tmp_path), "STAMP")
    assert "launched Sun Nov 22 23:57:46 2026 .. Mon Nov 23 00:24:05 2026" in line


def test_directories_no_run_claimed_are_not_runs(tmp_path: Path) -> None:
    """Issue 14.5: a try that failed its checks leaves no run the report counts."""
    (tmp_path / "addition/cpu/rope/0/20261123-100000-aaaaaa/.hydra").mkdir(parents=True)
    make_run(tmp_path, "addition/cpu", "rope", 1, "20261123-100000-bbbbbb", None)
    assert [r.seed for r in find_runs(tmp_path)] == [1]


def test_a_seed_whose_base_misses_its_own_passkeys_is_left_out_of_the_passkey_table(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    key = ("method,target_tokens,n_garbage,mean_tokens,trials,accuracy\n"
           "base,256,10,240.0,20,{b}\ntape,256,10,240.0,20,{t}\n")
    ppl = "method,corpus,length,perplexity,nll,windows,scored_tokens\nbase,books,256,{p},3.7,2,510\n"
    for seed, (base, tape, p, ok) in enumerate(((1.0, 0.8, 40.0, True), (0.6, 0.1, 50.0, False))):
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261122-21022{seed}-f2760f",
                 {"task": "context_extension", "context": 128, "target_context": 256,
                  "base_retrieves": ok, "base_passkey_at_context": base, "wall_time_s": 100.0},
                 {"task": {"name": "context_extension"}},
                 {"perplexity.csv": ppl.format(p=p), "passkey.csv": key.format(b=base, t=tape)})
    out = tmp_path / "results"
    render(runs, out)
    text = (out / "README.md").read_text()
    assert "Seed 1 is invalid for passkey retrieval" in text and "retrieves 60% of passkeys" in text
    with open(out / "tables" / "context_extension_cpu_passkey.csv", newline="") as f:
        passkey = {r["method"]: r for r in csv.DictReader(f)}
    tape = next(r for m, r in passkey.items() if m.startswith("TAPE"))
    assert tape["<= 256 tokens (mean 240)"] == "0.8" and tape["<= 256 tokens (mean 240) n"] == "1"
    with open(out / "tables" / "context_extension_cpu_perplexity.csv", newline="") as f:
        base = next(r for r in csv.DictReader(f) if r["method"].startswith("base"))
    assert base["books 256"] == "45.0" and base["books 256 n"] == "2"  # perplexity keeps both seeds


def test_rendering_only_smoke_runs_names_the_scale_to_render(tmp_path: Path, capsys) -> None:
    """Into a render of cpu runs (results/) the cpu scale stays (refused, with the hint); into a
    new folder, the documented `make report RUNS=runs OUT=runs/report` renders the scales found
    (it was refused until REPORT_ARGS named them), again and again; runs dir with no runs (a
    typo) is refused, not rendered empty."""
    runs = tmp_path / "runs"
    make_run(runs, "addition/smoke", "tape", 0, "20261123-100000-aaaaaa-0",
             {"task": "addition", "mean_accuracy": 50.0}, {"task": {"name": "addition"}})
    rendered = tmp_path / "results"
    rendered.mkdir()
    (rendered / "runs.csv").write_text("experiment,task,scale,pe,seed,status,used\n"
                                       "addition/cpu,addition,cpu,rope,0,finished,yes\n")
    assert report_main(["--runs", str(runs), "--out", str(rendered)]) == 1
    err = capsys.readouterr().err
    assert "no finished run at scale cpu" in err
    assert (f'its finished runs are at scale smoke: render only those into another folder, make report '
            f'RUNS={runs} OUT=runs/report REPORT_ARGS="--scale smoke"') in err
    for _ in range(2):  # the second render reads the first one's runs.csv
        assert report_main(["--runs", str(runs), "--out", str(tmp_path / "report")]) == 0
        assert "Scales rendered: smoke." in (tmp_path / "report" / "README.md").read_text()
    assert report_main(["--runs", str(runs), "--out", str(tmp_path / "again"), "--scale", "smoke"]) == 0
    assert f"python -m pipelines.report --runs {runs} --out {tmp_path / 'again'} --scale smoke`" in (
        tmp_path / "again" / "README.md").read_text()
    assert report_main(["--runs", str(tmp_path / "typo"), "--out", str(tmp_path / "empty")]) == 1
    assert "no finished run at scale cpu" in capsys.readouterr().err and not (tmp_path / "empty").exists()


def test_a_render_that_would_drop_a_scale_or_some_seeds_is_refused(tmp_path: Path) -> None:
    """Following the hint above into results/ (OUT left at its default) dropped every cpu section;
    a subset of the seeds redid every statistic from fewer pairs. Both are refused; a rerun of a
    committed seed (same command) replaces it, as test_render_carry shows."""
    full = tmp_path / "records"
    for seed in (0, 1):
        make_run(full, "pretrain/cpu", "rope", seed, f"20261123-10000{seed}-aaaaaa-{seed}",
                 {"task": "pretrain", "ppl_1x": 50.0 + seed}, {"task": {"name": "pretrain", "seq_len": 128}})
    out = tmp_path / "results"
    render(full, out)
    before = _snapshot(out)
    smoke = tmp_path / "smoke"
    make_run(smoke, "addition/smoke", "tape", 0, "20261123-110000-bbbbbb-0",
             {"task": "addition", "mean_accuracy": 50.0}, {"task": {"name": "addition"}})
    with pytest.raises(WouldLoseResults, match="pretrain/cpu rope"):
        render(smoke, out, ["smoke"])
    subset = tmp_path / "subset"
    shutil.copytree(full / "pretrain/cpu/rope/0", subset / "pretrain/cpu/rope/0")
    with pytest.raises(WouldLoseResults, match=r"1 run\(s\) whose numbers .* \(pretrain/cpu rope seed 1\)"):
        render(subset, out, carry_over=True)
    assert _snapshot(out) == before


def test_an_out_that_is_a_file_is_refused_naming_the_option(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("kept")
    assert report_main(["--runs", str(tmp_path), "--out", str(afile)]) == 1  # was FileExistsError
    assert f"--out {afile} is a file" in capsys.readouterr().err and afile.read_text() == "kept"
