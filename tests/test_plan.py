"""The reproduction plan, conf/reproduce/<profile>.yaml: every profile loads, names experiments
that exist, and a mistyped key is refused with the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import plan as plan_module
from pipelines.plan import PLAN_DIR, load_profile, plan, profiles
from tape.report.claim_registry import load_claims
from tape.report.paper import ADDITION_PES, PRETRAIN_PES, SCROLLS_PES

CONF = Path(__file__).resolve().parents[1] / "conf"


def test_every_profile_loads() -> None:
    assert profiles() == ("cpu", "cpu-full", "gpu", "paper", "tables")
    for name in profiles():
        prof = load_profile(name)
        assert prof.description, f"{name}: no description (shown by --help)"
        assert prof.claims is not None or prof.steps or prof.then, f"{name}: runs nothing"


@pytest.mark.parametrize("name", ["cpu", "cpu-full", "gpu", "paper", "tables"])
def test_every_step_names_an_experiment_that_exists(name: str, tmp_path: Path) -> None:
    steps = plan(name, runs_dir=tmp_path / "runs", scrolls_data=None)
    assert steps
    for step in steps:
        if step.entry == "pipelines.benchmark":
            assert step.done_file is not None and not step.experiment
            continue
        assert (CONF / "experiment" / f"{step.experiment}.yaml").is_file(), f"{name}: {step.name}: {step.experiment}"


def test_every_claim_runs_in_some_profile() -> None:
    planned = {c.id for name in profiles() if (prof := load_profile(name)).claims is not None
               for c in load_claims().claims if prof.runs_claim(c)}
    assert planned == {c.id for c in load_claims().claims}


def test_the_tables_run_the_encodings_the_report_shows() -> None:
    steps = load_profile("tables").steps
    assert tuple(steps["addition"]["encodings"]) == ADDITION_PES
    assert tuple(steps["pretrain"]["encodings"]) == PRETRAIN_PES
    assert tuple(steps["scrolls"]["encodings"]) == SCROLLS_PES


def test_claim_minutes_come_from_the_profile(tmp_path: Path) -> None:
    cpu = load_profile("cpu")
    minutes = {**cpu.minutes, **cpu.alone}  # a run's minutes side by side, or by itself
    overnight = {"word_problem/cpu", "parity/cpu"}  # C5 and C6 run in cpu-full only
    steps = plan("cpu", runs_dir=tmp_path)
    assert {s.experiment: s.minutes for s in steps} == {e: m for e, m in minutes.items() if e not in overnight}
    assert {s.experiment for s in steps if s.alone} == set(cpu.alone) == {"context_extension/cpu"}
    assert {s.experiment: s.minutes for s in plan("cpu-full", runs_dir=tmp_path) if s.match} == minutes
    assert load_profile("gpu").minutes_note and not load_profile("cpu").minutes_note


@pytest.fixture
def plan_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/reproduce to break."""
    for path in PLAN_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(plan_module, "PLAN_DIR", tmp_path)
    return tmp_path


@pytest.mark.parametrize("edit, message", [
    (("tables", "  addition:\n", "  addition:\n    encoding: [rope]\n"),
     r"tables.yaml: unknown key steps.addition.'encoding': did you mean 'encodings'\? a step takes .*after"),
    (("cpu", "claims:\n", "claim:\n"), r"cpu.yaml: unknown key 'claim': did you mean 'claims'\?"),
    (("gpu", "  unlisted: false\n", "  unlisted: false\n  seeds: 3\n"),
     r"gpu.yaml: unknown key claims.'seeds': `claims` takes profiles, unlisted"),
    (("tables", "after: pretrain", "after: benchmark"),
     r"tables.yaml: steps.scrolls.after: 'benchmark' is not a step before it"),
    (("tables", "datasets: local", "datasets: some"), r"steps.scrolls.datasets: 'some'; write one of"),
    (("cpu-full", "then: tables", "then: table"),
     r"cpu-full.yaml: then: profile 'table': there is no .*table.yaml; the profiles are cpu, cpu-full"),
])
def test_a_bad_profile_names_the_key_and_the_fix(plan_dir: Path, edit: tuple[str, str, str], message: str) -> None:
    name, old, new = edit
    path = plan_dir / f"{name}.yaml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(ValueError, match=message):
        plan("cpu-full" if name == "cpu-full" else name)


def test_reproduce_says_what_is_wrong_with_a_profile(plan_dir: Path) -> None:
    from pipelines import reproduce

    (plan_dir / "cpu.yaml").write_text((plan_dir / "cpu.yaml").read_text().replace("minutes:", "minuets:"))
    message = r"pipelines.reproduce: .*cpu.yaml: unknown key 'minuets': did you mean 'minutes'"
    with pytest.raises(SystemExit, match=message):
        reproduce.main(["--profile", "cpu", "--dry-run"])


def test_recipes_of_one_run_are_one_plain_step(tmp_path: Path) -> None:
    """C7's arms are recipes of each context-extension run: one step runs each seed once,
    without pe= (the preset has no PE group), and counts the runs it finds."""
    from pipelines.reproduce import commands

    (step,) = [s for s in plan("cpu", runs_dir=tmp_path, only=["C7"])]
    assert step.name == "C7-recipes" and step.single and step.pes == ("llama",)
    assert step.seeds == tuple(range(1, 9)) and step.alone  # by itself under --jobs: 17 min, not 76
    assert step.minutes == load_profile("cpu").alone[step.experiment]
    assert commands(step)[0] == ["python", "-m", "pipelines.train", "experiment=context_extension/cpu", "seed=1"]


def test_a_claim_that_lists_recipes_runs_them_as_one_hydra_list(tmp_path: Path) -> None:
    """C7a's runs name their recipes (a list setting): the override is Hydra's list syntax, and
    the runs it makes are the ones the step counts (its match has the same list)."""
    from pipelines.reproduce import commands

    (step,) = [s for s in plan("cpu", runs_dir=tmp_path, only=["C7a", "C7as"])]
    assert step.name == "C7a+C7as-recipes" and step.seeds == tuple(range(15, 21))
    assert commands(step)[0][-1] == "extend.recipes=[tape,lora,embed_norm]"
    assert step.match["extend.recipes"] == ["tape", "lora", "embed_norm"]
