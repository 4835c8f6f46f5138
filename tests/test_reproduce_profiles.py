"""conf/reproduce/<profile>.yaml values of the wrong kind, and --claims a profile does not run, are
refused before anything runs, with the file, the key and what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import plan as plan_module
from pipelines import reproduce
from pipelines.plan import PLAN_DIR, load_profile, plan, profiles

TABLE_STEP = "steps:\n  addition:\n    experiment: addition/{scale}\n"


@pytest.fixture
def plan_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/reproduce, to add scratch profiles to."""
    folder = tmp_path / "reproduce"
    folder.mkdir()
    for path in PLAN_DIR.glob("*.yaml"):
        (folder / path.name).write_text(path.read_text())
    monkeypatch.setattr(plan_module, "PLAN_DIR", folder)
    return folder


def scratch(plan_dir: Path, text: str, name: str = "zz-scratch") -> str:
    """Write conf/reproduce/<name>.yaml (in the copy) and return the profile's name."""
    (plan_dir / f"{name}.yaml").write_text(f"description: a scratch profile\n{text}")
    return name


@pytest.mark.parametrize("text, message", [
    (TABLE_STEP + "    encodings: rope\n",
     r"zz-scratch.yaml: steps.addition.encodings must be a list, not 'rope': write encodings: \[rope\]"),
    (TABLE_STEP + "    encodings: [rope, 3]\n", r"zz-scratch.yaml: steps.addition.encodings must be a list of "),
    (TABLE_STEP + "    overrides: trainer.max_steps=2\n",
     r"zz-scratch.yaml: steps.addition.overrides must be a list, not 'trainer.max_steps=2': "
     r"write overrides: \[trainer.max_steps=2\]"),
    ("claims: {profiles: gpu}\n",
     r"zz-scratch.yaml: claims.profiles must be a list, not 'gpu': write profiles: \[gpu\]"),
])
def test_a_list_given_as_a_string_is_refused(plan_dir: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_profile(scratch(plan_dir, text))


@pytest.mark.parametrize("text, key", [
    (TABLE_STEP + "    single: 'no'\n", "steps.addition.single"),
    (TABLE_STEP + "    alone: 'no'\n", "steps.addition.alone"),
    ("print_only: 'no'\n" + TABLE_STEP, "print_only"),
    ("claims: {profiles: [gpu], unlisted: 'no'}\n", "claims.unlisted"),
    (TABLE_STEP + "    single: 1\n", "steps.addition.single"),
])
def test_a_switch_must_be_true_or_false(plan_dir: Path, text: str, key: str) -> None:
    with pytest.raises(ValueError, match=rf"zz-scratch.yaml: {key}: .* must be true or false"):
        load_profile(scratch(plan_dir, text))


def test_unquoted_yes_and_no_are_switches(plan_dir: Path) -> None:
    prof = load_profile(scratch(plan_dir, "print_only: no\n" + TABLE_STEP + "    single: yes\n"))
    assert prof.print_only is False and plan(prof.name, runs_dir=plan_dir)[0].single is True


@pytest.mark.parametrize("runs, message", [
    ("{flipflop/gpu: ten}", r"zz-scratch.yaml: minutes.runs.flipflop/gpu: 'ten' is not a number of minutes"),
    ("{flipflop/gpu: -1}", r"zz-scratch.yaml: minutes.runs.flipflop/gpu: -1 is not a number of minutes"),
    ("[flipflop/gpu]", r"zz-scratch.yaml: minutes.runs must be a mapping"),
])
def test_minutes_must_be_numbers(plan_dir: Path, runs: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_profile(scratch(plan_dir, f"claims: {{profiles: [gpu]}}\nminutes:\n  runs: {runs}\n"))
    with pytest.raises(ValueError, match=message.replace("minutes.runs", "minutes.alone")):
        load_profile(scratch(plan_dir, f"claims: {{profiles: [gpu]}}\nminutes:\n  alone: {runs}\n"))


def test_minutes_of_the_profile_it_extends_name_that_file(plan_dir: Path) -> None:
    scratch(plan_dir, "claims: {profiles: [gpu]}\nminutes: {runs: {flipflop/gpu: ten}}\n", "zz-base")
    with pytest.raises(ValueError, match=r"zz-base.yaml: minutes.runs.flipflop/gpu: 'ten'"):
        load_profile(scratch(plan_dir, "extends: zz-base\n"))


def test_extends_names_the_key_and_the_file(plan_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"zz-scratch.yaml: extends: profile 'tabels': there is no "
                                         r".*tabels.yaml; the profiles are cpu, cpu-full, gpu, paper, tables"):
        load_profile(scratch(plan_dir, "extends: tabels\n"))


def test_a_bad_profile_stops_reproduce_before_anything_runs(plan_dir: Path, tmp_path: Path) -> None:
    launched: list[reproduce.Launch] = []
    name = scratch(plan_dir, TABLE_STEP + "    encodings: rope\n")
    with pytest.raises(SystemExit, match=r"^pipelines.reproduce: .*zz-scratch.yaml: steps.addition.encodings"):
        reproduce.main(["--profile", name, "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")],
                       runner=launched.append)
    assert not launched and not (tmp_path / "out").exists()


def test_claims_a_profile_does_not_run_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--claims C1 C3: not run by profile gpu \(its claims: C1g, C3g\)"):
        plan("gpu", runs_dir=tmp_path, only=("C1", "C3"))
    with pytest.raises(ValueError, match=r"^--claims C1: not run by profile gpu"):
        plan("gpu", runs_dir=tmp_path, only=("C1", "C1g"))
    with pytest.raises(ValueError, match=r"^--claims C1: not run by profile tables \(it runs no claim\)"):
        plan("tables", runs_dir=tmp_path, only=("C1",))
    with pytest.raises(SystemExit, match=r"--claims C1 C3: not run by profile gpu"):
        reproduce.main(["--profile", "gpu", "--claims", "C1", "C3", "--runs", str(tmp_path / "runs"),
                        "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # nothing rendered
    assert {s.experiment for s in plan("gpu", runs_dir=tmp_path, only=("C3g",))} == {"flipflop/gpu"}


def test_claims_of_a_then_profile_count(plan_dir: Path, tmp_path: Path) -> None:
    name = scratch(plan_dir, TABLE_STEP + "then: gpu\n")
    steps = plan(name, runs_dir=tmp_path, only=("C1g",))
    assert steps and {s.experiment for s in steps} == {"addition_c1/gpu"}
    with pytest.raises(ValueError, match=rf"--claims C1: not run by profile {name} \(its claims: C1g, C3g\)"):
        plan(name, runs_dir=tmp_path, only=("C1",))


@pytest.mark.parametrize("name", profiles())
def test_every_profile_loads_and_plans(name: str, tmp_path: Path) -> None:
    prof = load_profile(name)
    assert plan(name, runs_dir=tmp_path, scrolls_data=None) or prof.print_only


def test_a_profile_whose_claim_tags_match_no_claim_is_refused(plan_dir: Path) -> None:
    """claims: {profiles: [gpus]} (a typo of gpu) gave an empty plan without a word."""
    (plan_dir / "zz-typo.yaml").write_text("description: a typo\nclaims:\n  profiles: [gpus]\n")
    with pytest.raises(ValueError, match=r"profile zz-typo runs no claim: its claims.profiles \['gpus'\].*cpu-full, gpu"):
        plan("zz-typo")
