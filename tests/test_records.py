"""Run records (tape/report/records.py): what a record keeps, that it is never overwritten, and
that results/ renders from records alone, the same bytes wherever the records are.

The runs are the report tests' fake run directories (made-up numbers that never leave tmp_path).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipelines.report import main as report_main
from tape.report.records import RecordConflict, export, export_all, finished_runs
from tape.report.render import render
from tape.report.runs import find_runs
from tests.test_report import ADD_CFG, addition_metrics, build_runs, grid_csv, make_run
from warm_python import run_module

REPO = Path(__file__).resolve().parents[1]


def test_a_record_keeps_what_the_report_reads_and_nothing_else(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    run_dir = runs / "addition/cpu/rope/0/20261122-205210-0835a8-0"  # has a wandb/ folder too
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"\0" * 4096)
    (run_dir / "csv").mkdir()
    (run_dir / "csv" / "metrics.csv").write_text("step,val/exact_match\n99,0.5\n")
    for name, ppl in (("20261123-000000-dddddd", 10.0), ("20261124-000000-eeeeee", 12.0)):
        ev = run_dir / "eval" / name
        ev.mkdir(parents=True, exist_ok=True)
        (ev / "metrics.json").write_text(f'{{"ppl_8x": {ppl}}}')
    run = next(r for r in find_runs(runs) if r.path == run_dir)
    dest, new = export(run, runs, tmp_path / "records")
    assert new and dest == tmp_path / "records/addition/cpu/rope/0/20261122-205210-0835a8-0"
    kept = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert kept == ["command.txt", "config.yaml", "csv/metrics.csv", "eval/20261124-000000-eeeeee/metrics.json",
                    "grid.csv", "metrics.json"]
    assert sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) < 4096
    again = next(r for r in find_runs(tmp_path / "records") if r.seed == 0 and r.pe == "rope")
    assert again.metrics == run.metrics and again.config() == run.config()
    assert again.metrics["ppl_8x"] == 12.0  # the newest evaluation fills what the run lacks
    assert (again.experiment, again.commit, again.machine) == (run.experiment, run.commit, run.machine)


def test_records_are_never_overwritten(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    records = tmp_path / "records"
    first = export_all(runs, records)
    assert len(first) == 7  # finished, not smoke: 4 addition, pretrain, qasper, context extension
    assert export_all(runs, records) == []  # identical records: nothing new, no error
    target = runs / "pretrain/cpu/rope/0/20261122-220000-bbbbbb-0/metrics.json"
    kept = (records / target.relative_to(runs)).read_text()
    target.write_text(target.read_text().replace("50.0", "51.0"))
    with pytest.raises(RecordConflict, match="never overwritten"):
        export_all(runs, records)
    assert (records / target.relative_to(runs)).read_text() == kept


def test_a_conflicting_record_stops_no_other_record(tmp_path: Path) -> None:
    """export_all raised at the first conflict, so every run after it was never recorded."""
    runs = build_runs(tmp_path)
    records = tmp_path / "records"
    first = next(r for r in find_runs(runs) if r.finished and r.experiment == "addition/cpu")
    export(first, runs, records)
    (records / first.path.relative_to(runs) / "metrics.json").write_text("{}")  # a record that differs
    with pytest.raises(RecordConflict, match=r"never overwritten.*\(the other 6 record\(s\) were written\)"):
        export_all(runs, records)
    assert len(find_runs(records)) == 1 + 6  # the conflicting record and every other run's


def test_a_record_keeps_every_csv_its_task_wrote_and_gains_one_it_lacked(tmp_path: Path) -> None:
    """A per-length CSV (parity.csv) is kept; a record written before it was kept gains it, and
    a file that differs is still refused."""
    runs = build_runs(tmp_path)
    run_dir = runs / "addition/cpu/rope/0/20261122-205210-0835a8-0"
    (run_dir / "parity.csv").write_text("scratchpad,bits,step_accuracy\nstandard,1,100.0\n")
    run = next(r for r in find_runs(runs) if r.path == run_dir)
    dest, new = export(run, runs, tmp_path / "records")
    assert new and (dest / "parity.csv").read_text() == (run_dir / "parity.csv").read_text()
    (dest / "parity.csv").unlink()  # a record from before the CSV was kept
    assert export(run, runs, tmp_path / "records") == (dest, True)
    assert (dest / "parity.csv").is_file() and not list(dest.glob(".*.tmp"))
    assert export(run, runs, tmp_path / "records") == (dest, False)
    (dest / "parity.csv").write_text("changed\n")
    with pytest.raises(RecordConflict, match="parity.csv"):
        export(run, runs, tmp_path / "records")
    assert (dest / "parity.csv").read_text() == "changed\n"


def test_unfinished_smoke_demo_and_custom_runs_get_no_record(tmp_path: Path) -> None:
    """make demo's runs (runs/demo/runs/...) are a first look, not results: a reproduction that
    finds them under runs/ leaves them out of results/records."""
    runs = tmp_path / "runs"
    make_run(runs, "addition/smoke", "rope", 0, "20261122-205210-0835a8-0", addition_metrics(5.0), ADD_CFG)
    make_run(runs, "custom", "rope", 0, "20261122-205210-0835a8-1", addition_metrics(5.0), ADD_CFG)
    make_run(runs / "demo" / "runs", "addition/demo", "rope", 0, "20261122-205210-0835a8-3", addition_metrics(5.0),
             ADD_CFG)
    make_run(runs, "addition/cpu", "rope", 0, "20261122-205210-0835a8-2", None, ADD_CFG)
    assert export_all(runs, tmp_path / "records") == []
    unfinished = next(r for r in find_runs(runs) if not r.finished)
    with pytest.raises(ValueError, match="unfinished"):
        export(unfinished, runs, tmp_path / "records")


def test_a_run_and_its_record_count_once(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    export_all(runs, tmp_path / "records")
    both = finished_runs(runs, tmp_path / "records")
    assert len(both) == len(find_runs(runs))


def _render_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and "records" not in p.relative_to(out).parts}


def test_a_render_from_records_is_the_same_bytes_wherever_they_are(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two copies of one records folder (two clones) render byte-identical results."""
    runs = build_runs(tmp_path)
    outs = []
    for where in ("clone_a", "clone_b"):
        out = tmp_path / where / "results"
        export_all(runs, out / "records")
        outs.append(out)
        monkeypatch.chdir(tmp_path / where)
        assert report_main([]) == 0  # --out results, --runs results/records
    a, b = (_render_files(o) for o in outs)
    assert a.keys() == b.keys() and "README.md" in a and any(k.endswith(".png") for k in a)
    differ = [k for k in a if a[k] != b[k]]
    assert differ == []
    readme = a["README.md"].decode()
    assert "rendered by committed code" in readme or "uncommitted changes (+dirty)" in readme
    assert "/runs/" not in a["runs.csv"].decode()  # rows point at the records, not at runs/


def test_add_records_exports_then_renders_from_the_records(tmp_path: Path) -> None:
    runs = build_runs(tmp_path)
    out = tmp_path / "results"
    assert report_main(["--runs", str(runs), "--out", str(out), "--add-records"]) == 0
    assert len(find_runs(out / "records")) == len(find_runs(runs)) - 3  # the 3 unfinished stay out
    shutil.rmtree(runs)  # the runs are gone (a fresh clone): the records still render
    before = _render_files(out)
    assert report_main(["--out", str(out)]) == 0
    after = _render_files(out)
    assert after == before


def test_dirty_runs_are_flagged_in_the_provenance(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = make_run(runs, "addition/cpu", "rope", 0, "20261122-205210-0835a8-0", addition_metrics(5.0),
                   ADD_CFG, {"grid.csv": grid_csv({(1, 1): 10})})
    text = (run / "command.txt").read_text().replace("0123456789abcdef0123", "0123456789abcdef0123+dirty")
    (run / "command.txt").write_text(text)
    render(runs, tmp_path / "out", allow_empty=True)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "1 of them made at a working tree with uncommitted changes (+dirty)" in readme


RENDERED_FROM_RECORDS = "python -m pipelines.report --runs results/records --out results"


def make_report_command() -> list[str]:
    """`make report` as the Makefile has it, with this interpreter and no RUNS / OUT."""
    import re

    recipe = re.search(r"^report:.*\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.M).group(1)
    recipe = re.sub(r"\$\(if \$\((?:RUNS|OUT)\),--\w+ \$\((?:RUNS|OUT)\)\)", "", recipe)
    recipe = recipe.replace("$(REPORT_ARGS)", "")
    assert recipe.startswith("$(BIN)/python -m pipelines.report")
    return [sys.executable, *recipe.split()[1:]]


@pytest.mark.slow
def test_a_fresh_clone_renders_results_byte_for_byte() -> None:
    """`make report` in a fresh clone gives back the committed results/, byte for byte, from
    the committed records alone."""
    readme = (REPO / "results" / "README.md").read_text()
    if RENDERED_FROM_RECORDS not in readme:
        pytest.skip("results/README.md was not rendered from results/records (issue 22: the "
                    "records of its runs are still being rerun)")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True)
        module, *args = make_report_command()[2:]  # after "python -m"
        done = run_module(module, args, clone)
        assert done.returncode == 0, done.stderr
        changed = subprocess.run(["git", "status", "--porcelain", "results"], cwd=clone,
                                 capture_output=True, text=True, check=True).stdout
        assert changed == "", f"a fresh clone renders results/ differently:\n{changed}"


@pytest.mark.parametrize("runs_arg", ["results", "results/records/flipflop"])
def test_add_records_refuses_runs_that_overlap_the_records(tmp_path: Path, runs_arg: str, capsys) -> None:
    """--runs results --add-records copied every record into results/records/records/ (each then
    'superseded' by its copy, every count doubled)."""
    runs = build_runs(tmp_path)
    out = tmp_path / "results"
    assert report_main(["--runs", str(runs), "--out", str(out), "--add-records"]) == 0
    (out / "records" / "flipflop").mkdir(exist_ok=True)
    before = sorted(p for p in (out / "records").rglob("*"))
    assert report_main(["--runs", str(tmp_path / runs_arg), "--out", str(out), "--add-records"]) == 1
    assert "overlap, so --add-records would copy records into themselves" in capsys.readouterr().err
    assert sorted(p for p in (out / "records").rglob("*")) == before


def test_committed_configs_read_the_same_with_libyaml_as_with_pyyaml() -> None:
    """Run.config parses with libyaml's loader (the report reads every record's config.yaml);
    it must give what PyYAML's own safe loader gives, on the records themselves."""
    import yaml

    records = REPO / "results" / "records"
    configs = sorted(p for p in records.rglob("config.yaml")  # a run's own, not its evaluations' copies
                     if "eval" not in p.relative_to(records).parts)[::7]
    if not configs:
        pytest.skip("no committed records")
    runs = {r.path: r for r in find_runs(REPO / "results" / "records")}
    for path in configs:
        assert runs[path.parent].config() == yaml.safe_load(path.read_text()), path


def test_flops_per_step_are_counted_once_per_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report counted a whole traced step for every run of a FLOPs figure (62 counts, about
    half of `make report`'s time), though seeds and arms share a few settings."""
    import tape.bench.flops as flops
    from tape.report import claim_figures

    calls: list[tuple[int, int]] = []
    real = flops.model_costs

    def counted(mc, batch, seq_len, **kw):
        calls.append((batch, seq_len))
        return real(mc, batch, seq_len, **kw)

    monkeypatch.setattr(flops, "model_costs", counted)
    claim_figures._flops_per_step.cache_clear()
    config = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "vocab_size": 64, "max_seq_len": 64},
              "pe": {"name": "tape"}, "task": {"batch_size": 2, "seq_len": 16}}
    runs_dir = tmp_path / "runs"
    for seed in range(3):
        make_run(runs_dir, "flipflop/cpu", "tape", seed, f"20261206-00000{seed}-abc", {}, config)
    longer = {**config, "task": {"batch_size": 2, "seq_len": 32}}
    make_run(runs_dir, "flipflop/cpu", "tape", 3, "20261206-000003-abc", {}, longer)
    counts = [claim_figures.train_flops_per_step(r) for r in sorted(find_runs(runs_dir), key=lambda r: r.seed)]
    assert calls == [(2, 16), (2, 32)]
    assert counts[0] == counts[1] == counts[2] > 0 and counts[3] > counts[0]
    claim_figures._flops_per_step.cache_clear()
