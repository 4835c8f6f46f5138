"""Positive controls of a claim (conf/claims.yaml ``controls``, issue 25's C6): runs of the same
PE and seed under other settings that must succeed for the seed's pair to count. Every number is
made up for the test and never leaves tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.plan import claim_steps
from pipelines.reproduce import execute, pending
from tape.report.claim_registry import load_claims
from tape.report.claims import arm_table_rows, build, evaluate_claim
from tape.report.document import Context
from tape.report.runs import find_runs
from test_report import make_run

CLAIMS = {
    "alpha": 0.05,
    "metrics": {"exact_match_ood": {"label": "parity exact match beyond L (%)", "margin": 2.0, "better": "higher"}},
    "require": {"paired_init": True},
    "arms": {"tape": {"pe": "tape"}, "rope": {"pe": "rope"}},
    "claims": [{
        "id": "C6", "title": "Parity with a scratchpad", "paper": "made up for the test",
        "experiment": "parity/cpu", "metric": "exact_match_ood", "seeds": 8, "primary": ["tape", "rope"],
        "settings": {"task.scratchpad": "standard"},
        "controls": {"settings": [{"task.scratchpad": "interleaved"}, {"task.scratchpad": "mnemonics"}],
                     "valid": {"exact_match_id": 90.0}},
        "command": "python -m pipelines.train -m experiment=parity/cpu pe=tape,rope seed=0,1,2,3,4,5,6,7",
    }],
}


def write_claims(path: Path, edit=None) -> Path:  # noqa: ANN001
    raw = yaml.safe_load(yaml.safe_dump(CLAIMS))  # a deep copy
    if edit is not None:
        edit(raw["claims"][0])
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def parity_run(runs: Path, pe: str, seed: int, scratchpad: str, ood: float, in_dist: float = 100.0) -> None:
    j = ("standard", "interleaved", "mnemonics").index(scratchpad)
    make_run(runs, "parity/cpu", pe, seed, f"20261126-10000{seed}-{'aaaaaa' if pe == 'tape' else 'bbbbbb'}-{j}",
             {"task": "parity", "exact_match_ood": ood, "exact_match_id": in_dist},
             {"task": {"name": "parity", "scratchpad": scratchpad}, "pe": {"name": pe}, "paired_init": True,
              "trainer": {"max_steps": 1000}})


def build_runs(runs: Path, skip: set[tuple[str, int, str]] = frozenset(),
               fail: set[tuple[str, int, str]] = frozenset()) -> Path:
    """8 seeds of TAPE and RoPE with the standard scratchpad (TAPE 3 points better at every
    seed) and both controls of each, except the control runs in ``skip``; those in ``fail``
    reach only 50 % in distribution."""
    for seed in range(8):
        for pe, ood in (("tape", 40.0 + seed), ("rope", 37.0 + seed + 0.1 * (seed % 3))):
            parity_run(runs, pe, seed, "standard", ood)
            for scratchpad in ("interleaved", "mnemonics"):
                if (pe, seed, scratchpad) not in skip:  # a control's OOD number is never compared
                    parity_run(runs, pe, seed, scratchpad, 0.0, 50.0 if (pe, seed, scratchpad) in fail else 99.0)
    return runs


def rendered(tmp_path: Path, claims: Path, runs: Path) -> tuple[dict[str, str], list[str]]:
    """The claim's row of claims_all and the Claims table's notes."""
    section = build(Context(find_runs(runs), tmp_path / "results", "test"), load_claims(claims))
    every = dict(zip(section.tables[1].columns, section.tables[1].rows[0]))
    return every, section.tables[0].notes


def test_a_failed_control_drops_its_seeds_pair_and_names_it(tmp_path: Path) -> None:
    claims = write_claims(tmp_path / "claims.yaml")
    runs = build_runs(tmp_path / "runs", fail={("tape", 3, "interleaved"), ("rope", 3, "mnemonics")})
    cfg = load_claims(claims)
    result = evaluate_claim(cfg.claims[0], cfg, find_runs(runs))
    assert result.comparisons[0].seeds == (0, 1, 2, 4, 5, 6, 7)
    assert result.control_failed[("tape", "rope")] == {
        3: ["TAPE at task.scratchpad=interleaved", "RoPE at task.scratchpad=mnemonics"]}
    assert not result.control_missing[("tape", "rope")] and not result.invalid[("tape", "rope")]
    seeds = {row[1]: row[2] for row in arm_table_rows(result, cfg)}  # per arm: its own seeds only
    assert seeds == {"TAPE": "0, 1, 2, 4, 5, 6, 7 (left out: 3 a control failed)",
                     "RoPE": "0, 1, 2, 4, 5, 6, 7 (left out: 3 a control failed)"}
    every, notes = rendered(tmp_path, claims, runs)
    assert every["n paired seeds (planned)"] == "7 (planned 8)"
    assert every["verdict"].startswith("**better**")
    assert every["verdict"].endswith(
        "; 1 seed(s) left out, a positive control failed (exact_match_id < 90): "
        "3: TAPE at task.scratchpad=interleaved, RoPE at task.scratchpad=mnemonics")
    assert ("C6: positive controls (conf/claims.yaml `controls`): a seed's pair counts only when each arm's "
            "run of that seed also finished under `task.scratchpad=interleaved` and under "
            "`task.scratchpad=mnemonics` with exact_match_id >= 90") in " ".join(notes)
    # the control runs are evidence the verdict used: in the provenance, never in an arm's runs
    assert len(result.runs) == 8 * 2 * 3 and all(
        r.config()["task"]["scratchpad"] == "standard" for rs in result.arm_runs.values() for r in rs)


def test_a_missing_control_drops_its_seeds_pair_and_is_told_apart_from_a_failed_one(tmp_path: Path) -> None:
    claims = write_claims(tmp_path / "claims.yaml")
    runs = build_runs(tmp_path / "runs", skip={("rope", 5, "mnemonics"), ("tape", 2, "interleaved")},
                      fail={("tape", 2, "mnemonics"), ("rope", 6, "interleaved")})
    every, _ = rendered(tmp_path, claims, runs)
    assert every["n paired seeds (planned)"] == "5 (planned 8)"
    assert every["verdict"].startswith("no verdict, described (n = 5 < 6 paired seeds")
    # seed 2 lacks one control and failed another: told once, as failed (it cannot come back)
    assert ("; 2 seed(s) left out, a positive control failed (exact_match_id < 90): "
            "2: TAPE at task.scratchpad=mnemonics; 6: RoPE at task.scratchpad=interleaved; "
            "1 seed(s) left out, a positive control not run: 5: RoPE at task.scratchpad=mnemonics") in every["verdict"]


def test_a_described_arms_seeds_past_its_plan_count_only_with_their_controls(tmp_path: Path) -> None:
    """A described arm runs at 2 seeds with its controls; its runs at other seeds (made for
    another claim, without controls) are not told as lost, yet one with its controls is read."""
    def describe_nope(claim: dict) -> None:
        claim["describe"] = [["nope", "rope"]]

    raw = yaml.safe_load(write_claims(tmp_path / "claims.yaml", describe_nope).read_text())
    raw["arms"]["nope"] = {"pe": "nope"}
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(raw, sort_keys=False))
    runs = build_runs(tmp_path / "runs")
    for seed in range(8):  # NoPE's own runs at every seed, its controls at 0, 3 and (one of two) 1
        parity_run(runs, "nope", seed, "standard", 30.0 + seed)
        for scratchpad in ("interleaved", "mnemonics"):
            if seed in (0, 3) or (seed, scratchpad) == (1, "interleaved"):
                parity_run(runs, "nope", seed, scratchpad, 0.0, 99.0)
    cfg = load_claims(claims)
    result = evaluate_claim(cfg.claims[0], cfg, find_runs(runs))
    seeds = {row[1]: row[2] for row in arm_table_rows(result, cfg)}
    assert seeds["NoPE"] == "0, 3 (left out: 1 a control not run)"  # 1 is planned; 2, 4-7 are not
    assert result.comparisons[1].seeds == (0, 3)
    assert {r.seed for r in result.arm_runs["nope"]} == {0, 1, 3}


def test_an_invalid_seed_is_told_as_invalid_not_again_for_its_controls(tmp_path: Path) -> None:
    def valid(claim: dict) -> None:
        claim["valid"] = {"exact_match_id": 95.0}

    claims = write_claims(tmp_path / "claims.yaml", valid)
    runs = tmp_path / "runs"
    build_runs(runs, skip={("tape", 1, "mnemonics")}, fail={("rope", 4, "interleaved")})
    for path in runs.glob("parity/cpu/tape/1/*-0/metrics.json"):  # its own run did not learn
        path.write_text(path.read_text().replace('"exact_match_id": 100.0', '"exact_match_id": 60.0'))
    every, _ = rendered(tmp_path, claims, runs)
    assert every["n paired seeds (planned)"] == "6 (planned 8)"
    assert "1 seed(s) invalid, left out (1: exact_match_id < 95); 1 seed(s) left out, a positive control " \
           "failed (exact_match_id < 90): 4: RoPE at task.scratchpad=interleaved" in every["verdict"]
    assert "not run" not in every["verdict"]


def test_no_valid_pair_when_every_seed_lacks_its_controls(tmp_path: Path) -> None:
    claims = write_claims(tmp_path / "claims.yaml")
    runs = build_runs(tmp_path / "runs", skip={(pe, s, "mnemonics") for pe in ("tape", "rope") for s in range(8)})
    every, _ = rendered(tmp_path, claims, runs)
    assert every["effect Δ [95 % CI]"] == "no valid pair"
    assert every["verdict"].startswith("**no verdict**: 8 seed(s) left out, a positive control not run: "
                                       "0: TAPE at task.scratchpad=mnemonics, RoPE at task.scratchpad=mnemonics;")


def test_a_claim_without_controls_reads_only_its_arms_runs(tmp_path: Path) -> None:
    claims = write_claims(tmp_path / "claims.yaml", lambda c: c.pop("controls"))
    runs = build_runs(tmp_path / "runs", skip={("rope", 5, "mnemonics")}, fail={("tape", 3, "interleaved")})
    cfg = load_claims(claims)
    assert cfg.claims[0].controls is None
    result = evaluate_claim(cfg.claims[0], cfg, find_runs(runs))
    assert result.comparisons[0].seeds == tuple(range(8)) and len(result.runs) == 16
    every, notes = rendered(tmp_path, claims, runs)
    assert every["verdict"].startswith("**better**") and "left out" not in every["verdict"]
    assert not any("positive controls" in n for n in notes)
    assert [s.name for s in claim_steps(cfg)] == ["C6-tape", "C6-rope"]


def _set(key: str, value: object):  # noqa: ANN202
    def edit(claim: dict) -> None:
        if value is None:
            claim.pop(key)
        else:
            claim[key] = value
    return edit


@pytest.mark.parametrize("edit, message", [
    (_set("controls", {"settings": [{"task.scratchpad": "interleaved"}]}),
     r"claim C6: controls: give exactly the keys settings and valid \(got \['settings'\]\), e.g. controls: "),
    (_set("controls", {"setting": [{"task.scratchpad": "interleaved"}], "valid": {"exact_match_id": 90}}),
     r"controls: give exactly the keys settings and valid \(got \['setting', 'valid'\]\)"),
    (_set("controls", {"settings": {"task.scratchpad": "interleaved"}, "valid": {"exact_match_id": 90}}),
     r"controls.settings: give a non-empty list with one mapping of dotted config keys to values per control"),
    (_set("controls", {"settings": [{"task.scratchpad": "interleaved"}], "valid": {"exact_match_id": "90"}}),
     r"controls.valid: give a mapping of metrics.json keys to the least value a control run must reach"),
    (_set("settings", None),
     r"controls.settings\[0\]: task.scratchpad is not pinned for arm 'tape', so its own runs could be taken "
     r"for the control's: give the claim's value in its `settings` \(e.g. task.scratchpad: <the claim's value>\)"),
    (_set("controls", {"settings": [{"task.scratchpad": "interleaved"}, {"task.scratchpad": "standard"}],
                       "valid": {"exact_match_id": 90}}),
     r"controls.settings\[1\]: task.scratchpad=standard is what arm 'tape' runs already: a control must "
     r"change at least one of its values"),
])
def test_bad_controls_are_refused_with_the_key_and_the_fix(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        load_claims(write_claims(tmp_path / "claims.yaml", edit))


def test_the_plan_runs_every_arms_controls_at_its_seeds(tmp_path: Path) -> None:
    cfg = load_claims(write_claims(tmp_path / "claims.yaml"))
    steps = {s.name: s for s in claim_steps(cfg, {"parity/cpu": 3.0})}
    assert list(steps) == ["C6-tape", "C6-tape-control-scratchpad=interleaved", "C6-tape-control-scratchpad=mnemonics",
                           "C6-rope", "C6-rope-control-scratchpad=interleaved", "C6-rope-control-scratchpad=mnemonics"]
    control = steps["C6-rope-control-scratchpad=mnemonics"]
    assert control.pes == ("rope",) and control.seeds == tuple(range(8)) and control.tier == 0
    assert control.overrides == ("task.scratchpad=mnemonics",) and control.minutes == 3.0
    assert control.match == {"paired_init": True, "task.scratchpad": "mnemonics"}
    assert steps["C6-rope"].overrides == ("task.scratchpad=standard",)
    # a finished control run counts for its control only, never for the arm's own step
    runs = tmp_path / "runs"
    parity_run(runs, "rope", 0, "mnemonics", 0.0)
    found = find_runs(runs)
    assert [seed for _, _, seed in pending(control, found)] == list(range(1, 8))
    assert [seed for _, _, seed in pending(steps["C6-rope"], found)] == list(range(8))
    lines: list[str] = []
    execute(list(steps.values()), runs, lambda launch: 1 / 0, dry_run=True, log=lines.append)
    assert any(line.startswith("[C6-tape-control-scratchpad=interleaved] would run: python -m pipelines.train -m "
                               "experiment=parity/cpu pe=tape seed=0 task.scratchpad=interleaved") for line in lines)
    assert "[C6-rope-control-scratchpad=mnemonics] 1 finished run(s) skipped, 7 to run" in lines


def test_the_figure_draws_each_arm_by_length_and_its_controls_dashed(tmp_path: Path) -> None:
    """C6's figure: step accuracy by bits from each run's parity.csv, the controls beside the arms."""
    from tape.report.claim_figures import TASK_CURVES

    claims = write_claims(tmp_path / "claims.yaml")
    runs = build_runs(tmp_path / "runs", skip={("rope", 5, "mnemonics")})
    for metrics in runs.rglob("metrics.json"):
        ood = 55.0 if metrics.parent.name.endswith("-0") else 90.0  # -0: standard; the controls generalise
        (metrics.parent / "parity.csv").write_text(
            "scratchpad,bits,tokens,sequences,step_accuracy,exact_match\n"
            f"x,1,6,200,100.0,100.0\nx,2,8,200,{ood},0.0\n")
    cfg = load_claims(claims)
    result = evaluate_claim(cfg.claims[0], cfg, find_runs(runs))
    assert {k: len(v) for k, v in result.control_runs["rope"].items()} == {
        "task.scratchpad=interleaved": 8, "task.scratchpad=mnemonics": 7}
    curve = TASK_CURVES["parity"][0](result.control_runs["tape"]["task.scratchpad=interleaved"][0])
    assert curve == {1: 100.0, 2: 90.0}
    assert TASK_CURVES["parity"][0](result.arm_runs["tape"][0]) == {1: 100.0, 2: 55.0}
    section = build(Context(find_runs(runs), tmp_path / "results", "test"), cfg)
    (figure,) = [f for f in section.figures if "claim_c6" in str(f.path)]
    assert "dashed: the arms' positive controls" in figure.caption
    assert (tmp_path / "results" / figure.path).read_bytes()[:4] == b"\x89PNG"
