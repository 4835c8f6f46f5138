"""Carrying sections over: a render on a machine that lacks some experiments' runs keeps their
committed sections, tables, figures and runs.csv rows instead of refusing or writing "not run".
Every number is made up for the test and never leaves tmp_path."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from pipelines.report import main as report_main
from tape.report.document import Context
from tape.report.render import CARRIED_NOTE, EXPERIMENTS, WouldLoseResults, old_section, render
from test_report import ADD_CFG, addition_metrics, grid_csv, make_run

GRID = grid_csv({(1, 1): 10, (1, 2): 5, (2, 1): 0, (2, 2): 2})
PRETRAIN_CFG = {"task": {"name": "pretrain", "seq_len": 128}}


def pretrain_run(runs: Path, pe: str, seed: int, name: str, ppl: float) -> Path:
    return make_run(runs, "pretrain/cpu", pe, seed, name,
                    {"task": "pretrain", "ppl_1x": ppl, "ppl_2x": 2 * ppl, "wall_time_s": 60.0}, PRETRAIN_CFG)


def committed(root: Path) -> tuple[Path, Path]:
    """(runs, results): results/ rendered from addition and pretrain runs."""
    runs = root / "old-machine" / "runs"
    for seed, mean in ((0, 20.0), (1, 30.0)):
        make_run(runs, "addition/cpu", "rope", seed, f"20261122-20521{seed}-0835a8-{seed}",
                 addition_metrics(mean), ADD_CFG, {"grid.csv": GRID})
    make_run(runs, "addition/cpu", "tape", 0, "20261122-205220-0835a8-4", addition_metrics(41.0),
             ADD_CFG, {"grid.csv": GRID})
    pretrain_run(runs, "rope", 0, "20261122-220000-bbbbbb-0", 50.0)
    out = root / "results"
    render(runs, out)
    return runs, out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def section(readme: str, title: str) -> str:
    """The README text from ``## title`` up to the next ``## `` heading."""
    start = readme.index(f"## {title}\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:] if end < 0 else readme[start:end + 1]


def test_carry_over_keeps_a_section_whose_runs_are_elsewhere(tmp_path: Path) -> None:
    _, out = committed(tmp_path)
    before = snapshot(out)
    old_readme = (out / "README.md").read_text()
    old_rows = rows(out / "runs.csv")
    runs = tmp_path / "new-machine" / "runs"  # only pretraining was run here
    pretrain_run(runs, "rope", 0, "20261124-090000-dddddd-0", 60.0)
    pretrain_run(runs, "tape", 0, "20261124-090000-dddddd-1", 55.0)

    with pytest.raises(WouldLoseResults, match="addition/cpu rope"):
        render(runs, out, carry_over=False)
    assert snapshot(out) == before

    done = render(runs, out, carry_over=True)
    readme = (out / "README.md").read_text()
    note = CARRIED_NOTE.format(runs_dir=runs)
    carried = section(readme, "Addition (cpu)")
    assert carried.split("\n")[:3] == ["## Addition (cpu)", "", note]
    assert carried.replace(f"\n\n{note}", "", 1) == section(old_readme, "Addition (cpu)")
    assert section(readme, "Pretraining perplexity (cpu)") != section(old_readme, "Pretraining perplexity (cpu)")
    assert "55.00" in section(readme, "Pretraining perplexity (cpu)")
    assert "Carried over from the previous render (runs not on this machine): addition/cpu." in readme
    assert f"--out {out} --carry-over`" in readme
    # the carried section's files are left alone, and were not (re)written
    after = snapshot(out)
    kept = [name for name in before if name.startswith(("tables/addition_cpu", "figures/addition_cpu"))]
    assert "tables/addition_cpu.csv" in kept and "figures/addition_cpu_panel.png" in kept
    assert all(after[name] == before[name] for name in kept)
    assert not [p for p in done.files if p.name.startswith("addition_cpu")]
    assert after["tables/pretrain_cpu.csv"] != before["tables/pretrain_cpu.csv"]
    # runs.csv: the new runs, then the carried rows as they were
    new_rows = rows(out / "runs.csv")
    assert [r for r in new_rows if r["experiment"] == "addition/cpu"] == \
        [r for r in old_rows if r["experiment"] == "addition/cpu"]
    pretrain = [r for r in new_rows if r["experiment"] == "pretrain/cpu"]
    assert {r["run_dir"].split("/")[-1] for r in pretrain} == {"20261124-090000-dddddd-0", "20261124-090000-dddddd-1"}
    assert (out / "runs.csv").read_text().splitlines()[0] == (tmp_path / "results/runs.csv").read_text().splitlines()[0]

    # carrying again (now from a carried section) keeps one note and changes nothing
    text = (out / "README.md").read_text()
    assert report_main(["--runs", str(runs), "--out", str(out), "--carry-over"]) == 0
    again = (out / "README.md").read_text()
    assert section(again, "Addition (cpu)") == section(text, "Addition (cpu)")
    assert rows(out / "runs.csv") == new_rows


def test_an_experiment_whose_runs_here_would_drop_a_pe_is_carried_whole(tmp_path: Path) -> None:
    runs, out = committed(tmp_path)
    shutil.rmtree(runs / "addition/cpu/tape")  # addition has runs here, but not TAPE's any more
    before = snapshot(out)
    old_readme = (out / "README.md").read_text()
    with pytest.raises(WouldLoseResults, match="addition/cpu tape"):
        render(runs, out, carry_over=False)
    assert snapshot(out) == before
    render(runs, out, carry_over=True)
    readme = (out / "README.md").read_text()
    carried = section(readme, "Addition (cpu)")
    note = carried.split("\n")[2]
    assert note.startswith("*Carried over unchanged") and "drop the rows of tape" in note
    assert "the 2 finished run(s) of this experiment here" in note
    assert carried.replace(f"\n\n{note}", "", 1) == section(old_readme, "Addition (cpu)")
    assert "tape" in {r["pe"] for r in rows(out / "runs.csv") if r["experiment"] == "addition/cpu"}
    assert all(snapshot(out)[k] == v for k, v in before.items() if k.startswith("tables/addition_cpu"))


def test_no_carry_over_without_the_old_section(tmp_path: Path) -> None:
    runs, out = committed(tmp_path)
    shutil.rmtree(runs / "addition")
    readme = (out / "README.md").read_text()
    (out / "README.md").write_text(readme.replace("## Addition (cpu)", "## Something else"))
    with pytest.raises(WouldLoseResults, match="addition/cpu"):
        render(runs, out, carry_over=True)


def test_old_section_stops_at_the_next_heading_and_replaces_an_earlier_note() -> None:
    readme = "# R\n\n## A (cpu)\n\n### t\n\nx\n\n## B (cpu)\n\ny\n"
    assert old_section(readme, "A (cpu)", "*n*") == "## A (cpu)\n\n*n*\n\n### t\n\nx\n"
    assert old_section(readme, "B (cpu)", "*n*") == "## B (cpu)\n\n*n*\n\ny\n"
    assert old_section(readme, "C (cpu)", "*n*") is None
    carried = "## A (cpu)\n\n" + CARRIED_NOTE.format(runs_dir="old") + "\n\n### t\n"
    assert old_section(carried, "A (cpu)", "*n*") == "## A (cpu)\n\n*n*\n\n### t\n"


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_registered_titles_are_the_builders_titles(tmp_path: Path, scale: str) -> None:
    ctx = Context(runs=[], out_dir=tmp_path, stamp="rendered at test")
    for exp in EXPERIMENTS:
        assert exp.build(ctx, scale).title == exp.title.format(scale=scale), exp.prefix
    assert EXPERIMENTS[1].owns("scrolls/cpu/qasper", "cpu") and not EXPERIMENTS[0].owns("addition_c1/cpu", "cpu")


def claims_runs(runs: Path, with_c1: bool) -> None:
    """C1 (addition_c1/cpu) and C2 (pretrain/cpu) arms at 6 paired seeds."""
    from test_claims_report import TAPE_PE, c1_config, config

    for seed in range(6):
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            name = f"20261123-10000{seed}-eeeeee-{j}"
            make_run(runs, "pretrain/cpu", pe, seed, name, {"task": "pretrain", "ppl_1x": 90.0 + j * (1 + 0.05 * seed) + 0.1 * seed},
                     config("pretrain", cfg_pe))
            if with_c1:
                make_run(runs, "addition_c1/cpu", pe, seed, name,
                         {"task": "addition", "ood_accuracy": 5.0 + j * (2 + 0.1 * seed) + 0.1 * seed,
                          "in_distribution_accuracy": 100.0}, c1_config(cfg_pe, abacus=True), {"grid.csv": GRID})


def test_a_claim_without_records_is_carried_over_unchanged_and_idempotently(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import tape.report.claims as claims_mod

    old, new = tmp_path / "old" / "runs", tmp_path / "new" / "runs"
    claims_runs(old, with_c1=True)
    claims_runs(new, with_c1=False)  # the records here hold C2's runs only
    out = tmp_path / "results"
    render(old, out)
    c1_before = claims_mod.claim_rows(claims_mod.previous_rows(out, "claims_all"), "C1")
    with pytest.raises(WouldLoseResults, match="addition_c1/cpu"):
        render(new, out)
    render(new, out, carry_over=True)
    every = claims_mod.previous_rows(out, "claims_all")
    c1 = claims_mod.claim_rows(every, "C1")
    assert [r["effect Δ [95 % CI]"] for r in c1] == [r["effect Δ [95 % CI]"] for r in c1_before]
    assert c1[0]["verdict"] == claims_mod.CARRIED + c1_before[0]["verdict"]
    headline = claims_mod.claim_rows(claims_mod.previous_rows(out, "claims"), "C1")[0]
    assert headline["answer at this scale"].startswith(claims_mod.CARRIED)
    never_run = claims_mod.claim_rows(claims_mod.previous_rows(out, "claims"), "C5")[0]
    assert never_run["answer at this scale"].startswith("not run yet")  # no numbers: nothing to carry
    assert any(r["experiment"] == "addition_c1/cpu" for r in csv.DictReader(open(out / "runs.csv")))
    assert (out / "figures" / "claim_c1.png").is_file() and "figures/claim_c1.png" in (out / "claims_detail.md").read_text()
    first = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    render(new, out, carry_over=True)  # again: the same bytes, no second "carried over"
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == first
    # a claim redefined since the previous render (another title) is never carried
    cfg = claims_mod.load_claims()
    renamed = [c if c.id != "C1" else dataclasses.replace(c, title="Another claim") for c in cfg.claims]
    monkeypatch.setattr(claims_mod, "load_claims", lambda *a, **k: dataclasses.replace(cfg, claims=tuple(renamed)))
    render(new, out, carry_over=True)
    c1 = claims_mod.claim_rows(claims_mod.previous_rows(out, "claims_all"), "C1")
    assert c1[0]["claim"] == "C1: Another claim" and c1[0]["effect Δ [95 % CI]"] == "not run"


def test_carry_over_with_nothing_to_carry_renders_the_same_bytes(tmp_path: Path) -> None:
    """pipelines.reproduce (carry_over=True) wrote " --carry-over" into the README's command even
    when it carried nothing, so it and make report rendered different bytes from the same records."""
    runs, out = committed(tmp_path)
    before = snapshot(out)
    render(runs, out, carry_over=True)
    assert snapshot(out) == before
