"""The Claims section and the flip-flop section on fake run directories laid out as the
pipelines write them. Every number is made up for the test and never leaves tmp_path."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml

from tape.report.claim_registry import CLAIMS_FILE, load_claims
from tape.report.render import render
from test_report import make_run

TAPE_PE = {"name": "tape", "tape_attn_update": True, "tape_mlp_update": True, "tape_post_attn": "mix"}


PRESET_STEPS = {"pretrain": 500, "flipflop": 400}  # the cpu presets' steps, which C2-C4 pin


def config(task: str, pe: dict, paired: bool = True, steps: int | None = None, val_every: int = 100) -> dict:
    return {"task": {"name": task, "seq_len": 64}, "pe": pe, "paired_init": paired,
            "trainer": {"max_steps": steps or PRESET_STEPS.get(task, 1000), "val_check_interval": val_every}}


def flipflop_metrics(ood: float) -> dict:
    out = {"task": "flipflop", "read_error_ood": ood}
    for m in (1, 2, 3, 4):
        for s in ("in_dist", "sparse", "dense"):
            out[f"read_error_{s}_{m}x"] = 0.0 if m == 1 else ood * m / 2
        out[f"read_error_{m}x"] = 0.0 if m == 1 else ood * m / 2  # the mean over sparsities
    return out


def build_runs(root: Path) -> Path:
    runs = root / "runs"
    rng = np.random.default_rng(0)
    rope = 20 + 8 * rng.standard_normal(6)
    for seed in range(6):
        name = f"20261123-10000{seed}-aaaaaa-{seed}"
        make_run(runs, "flipflop/cpu", "rope", seed, name, flipflop_metrics(float(rope[seed])),
                 config("flipflop", {"name": "rope"}))
        make_run(runs, "flipflop/cpu", "tape", seed, name, flipflop_metrics(float(rope[seed]) - 5 - 0.1 * seed),
                 config("flipflop", TAPE_PE))
        # an ablation arm at the same seeds: never pooled into TAPE's arm
        make_run(runs, "flipflop/cpu", "tape", seed, f"20261123-20000{seed}-bbbbbb-{seed}",
                 flipflop_metrics(99.0), config("flipflop", {**TAPE_PE, "tape_mlp_update": False}))
        ppl = 90 + 3 * rng.standard_normal()
        make_run(runs, "pretrain/cpu", "rope", seed, name, {"task": "pretrain", "ppl_1x": ppl},
                 config("pretrain", {"name": "rope"}))
        make_run(runs, "pretrain/cpu", "tape", seed, name,
                 {"task": "pretrain", "ppl_1x": ppl + 0.05 * rng.standard_normal()},
                 config("pretrain", TAPE_PE))
        # RoPE trained longer (TAPE's compute): its own arm, never pooled into RoPE's
        make_run(runs, "pretrain/cpu", "rope", seed, f"20261123-30000{seed}-cccccc-{seed}",
                 {"task": "pretrain", "ppl_1x": ppl - 4.0}, config("pretrain", {"name": "rope"}, steps=550, val_every=110))
    make_run(runs, "flipflop/cpu", "alibi", 0, "20261123-100000-aaaaaa-9", flipflop_metrics(1.0),
             config("flipflop", {"name": "alibi"}))
    # an unpaired run (made before paired initialisation) never counts as a pair
    make_run(runs, "flipflop/cpu", "rope", 7, "20261120-100000-cccccc-0", flipflop_metrics(50.0),
             config("flipflop", {"name": "rope"}, paired=False))
    make_run(runs, "flipflop/cpu", "tape", 7, "20261120-100000-cccccc-1", flipflop_metrics(0.0),
             config("flipflop", TAPE_PE, paired=False))
    return runs


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("claims")
    out = root / "results"
    render(build_runs(root), out)
    return out


def rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r["claim"].split(":")[0]: r for r in csv.DictReader(f)}


def test_claims_open_the_readme(rendered: Path) -> None:
    text = (rendered / "README.md").read_text()
    assert text.split("\n## ")[1].startswith("Claims\n")  # the first section


def test_the_readme_has_the_claims_table_and_its_legend_the_rest_is_in_claims_detail(rendered: Path) -> None:
    """Issue 24.5: README.md opens with the Claims table and a three-line legend; every
    comparison, every arm, the notes and the figures go to claims_detail.md."""
    claims_part = (rendered / "README.md").read_text().split("\n## ")[1]
    legend = [line for line in claims_part.split("\n") if line.startswith("- ")]
    assert len(legend) == 3 and "[claims_detail.md](claims_detail.md)" in legend[2]
    assert "Provenance: " in legend[2] and "commit(s)" in legend[2]
    assert "### Claims: the paper's claims, tested at laptop scale" in claims_part
    for moved in ("Claims: every comparison", "Claims: every arm", "Seeds are planned per claim", "figures/"):
        assert moved not in claims_part, moved
    detail = (rendered / "claims_detail.md").read_text()
    for title in ("## Notes on the Claims table", "## Claims: every comparison (primary first, then secondary)",
                  "## Claims: every arm over its seeds", "## Figures"):
        assert title in detail, title
    assert "Seeds are planned per claim" in detail and "- Provenance: " in detail
    every = rows(rendered / "tables" / "claims_all.csv")
    assert every["C2"]["effect Δ [95 % CI]"].replace("|", "\\|") in detail  # the same numbers, moved


def test_claim_rows_from_runs(rendered: Path) -> None:
    claims = rows(rendered / "tables" / "claims_all.csv")
    c3 = claims["C3"]  # read error at the training sparsity: mean of 1x and 1.5x the fixture's ood
    assert c3["n paired seeds (planned)"] == "6 (planned 8)"  # seed 7 is unpaired, the ablation is not TAPE
    assert c3["effect Δ [95 % CI]"].startswith("Δ -6.56 [")  # exploratory (split after seeing runs):
    assert c3["verdict"].startswith("no verdict, described (exploratory, p = 0.0312")  # no verdict word
    assert "the paper has no flip-flop task" in c3["the paper's statement and number (paper)"]
    c2 = claims["C2"]  # nats per token: TAPE's perplexity within 0.05 of RoPE's
    assert c2["n paired seeds (planned)"] == "6 (planned 8)" and c2["verdict"].startswith("**equivalent**")
    assert "δ_paper -0.0531: **the paper's effect is excluded at this scale** (one-sided p = 0.0156)" in \
        c2["the paper's effect in our metric (δ_paper), one-sided test"]
    c1 = claims["C1"]  # no addition runs at all
    assert c1["n paired seeds (planned)"] == "0 (planned 8)" and c1["effect Δ [95 % CI]"] == "not run"
    assert "python -m pipelines.train -m experiment=addition_c1/cpu" in c1["verdict"]
    assert "lack" not in c1["verdict"]
    assert claims["C4"]["effect Δ [95 % CI]"] == "not run"  # no row-sum runs


def c1_config(pe: dict, abacus: bool, paired: bool = True, lr: float = 0.0003) -> dict:
    """A C1 run's config: the claim counts only runs with its settings (lr 3e-4, 2,000 steps)."""
    return {**config("addition", pe, paired), "model": {"abacus": abacus, "abacus_max_offset": 10},
            "optim": {"lr": lr}, "trainer": {"max_steps": 2000}}


def test_unpaired_runs_are_named_but_never_paired(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed in range(6):
        for pe, cfg_pe in (("rope", {"name": "rope"}), ("tape", TAPE_PE)):
            make_run(runs, "addition_c1/cpu", pe, seed, f"20261120-10000{seed}-dddddd-0",
                     {"task": "addition", "ood_accuracy": 5.0 + seed},
                     c1_config(cfg_pe, abacus=True, paired=False))
    out = tmp_path / "results"
    render(runs, out)
    c1 = rows(out / "tables" / "claims_all.csv")["C1"]
    assert c1["n paired seeds (planned)"] == "0 (planned 8)" and c1["effect Δ [95 % CI]"] == "not run"
    assert "12 finished run(s) of these arms lack paired_init=True" in c1["verdict"]


def test_c1_factorial_arms_are_told_apart_by_abacus_and_paired(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ood = {  # (pe, abacus) -> OOD exact match of seed s
        ("rope", True): lambda s: 15.0 + s, ("tape", True): lambda s: 20.0 + s + 0.1 * (s % 3),
        ("rope", False): lambda s: 0.5, ("tape", False): lambda s: 0.5 + 0.02 * s,
        ("nope", True): lambda s: 18.0 + s,
    }
    for seed in range(8):
        for j, ((pe, abacus), value) in enumerate(ood.items()):
            cfg_pe = TAPE_PE if pe == "tape" else {"name": pe}
            make_run(runs, "addition_c1/cpu", pe, seed, f"20261123-10000{seed}-eeeeee-{j}",
                     {"task": "addition", "ood_accuracy": value(seed), "ood_digit_accuracy": 60.0,
                      "in_distribution_accuracy": 100.0}, c1_config(cfg_pe, abacus))
    # the plain addition experiment's runs (no model.abacus key) never enter C1's arms
    make_run(runs, "addition/cpu", "rope", 0, "20261123-100000-ffffff-0",
             {"task": "addition", "ood_accuracy": 99.0}, config("addition", {"name": "rope"}))
    out = tmp_path / "results"
    render(runs, out)
    c1 = rows(out / "tables" / "claims_all.csv")["C1"]
    assert c1["comparison (Δ = first - second)"] == "TAPE + Abacus - RoPE + Abacus"
    assert c1["n paired seeds (planned)"] == "8 (planned 8)" and c1["effect Δ [95 % CI]"].startswith("Δ +5.09 [")
    assert c1["verdict"].startswith("**better**")
    assert "δ_paper +8.7: **the paper's effect is excluded" in c1["the paper's effect in our metric (δ_paper), one-sided test"]
    with open(out / "tables" / "claims_all.csv", newline="") as f:
        every = {r["comparison (Δ = first - second)"]: r for r in csv.DictReader(f)
                 if r["our experiment and metric"].startswith("addition_c1/cpu, OOD exact")}
    assert every.pop("TAPE + YaRN + Abacus - TAPE + Abacus")["n paired seeds (planned)"] == "0 (planned 8)"  # C1y
    assert set(every) == {"TAPE + Abacus - RoPE + Abacus", "TAPE - RoPE", "TAPE + Abacus - NoPE + Abacus",
                          "NoPE + Abacus - RoPE"}
    assert all(r["n paired seeds (planned)"] == "8 (planned 8)" for r in every.values())
    assert "excluded" in every["TAPE - RoPE"]["the paper's effect in our metric (δ_paper), one-sided test"]
    assert every["NoPE + Abacus - RoPE"]["the paper's effect in our metric (δ_paper), one-sided test"] == ""
    headline = {r["claim"].split(":")[0]: r for r in csv.DictReader(open(out / "tables" / "claims.csv"))}
    assert headline["C1"]["answer at this scale"] == (
        "TAPE + Abacus better than RoPE + Abacus; the paper's effect is excluded for "
        "TAPE + Abacus - RoPE + Abacus, TAPE - RoPE; secondary: TAPE better than RoPE, "
        "TAPE + Abacus better than NoPE + Abacus, NoPE + Abacus better than RoPE")
    assert headline["C1"]["question"].startswith("Does TAPE add numbers longer")
    assert every["TAPE - RoPE"]["effect Δ [95 % CI]"].startswith("Δ +0.07 [")  # the runs without Abacus
    assert every["NoPE + Abacus - RoPE"]["effect Δ [95 % CI]"].startswith("Δ +21.00 [")  # the confound
    with open(out / "tables" / "addition_cpu.csv", newline="") as f:  # C1's runs stay out of it
        addition = {r["PE"]: r for r in csv.DictReader(f)}
    assert addition["RoPE"]["seeds"] == "1" and addition["TAPE"]["seeds"] == "0"


def test_secondary_comparisons_listed(rendered: Path) -> None:
    with open(rendered / "tables" / "claims_all.csv", newline="") as f:
        every = list(csv.DictReader(f))
    alibi = next(r for r in every if r["comparison (Δ = first - second)"] == "TAPE - ALiBi"
                 and r["our experiment and metric"].startswith("flipflop"))
    assert alibi["n paired seeds (planned)"] == "1 (planned 2)" and alibi["verdict"].startswith("no verdict, described")
    ablation = next(r for r in every if "MLP update only" in r["comparison (Δ = first - second)"]
                    and r["our experiment and metric"].startswith("pretrain"))
    assert ablation["effect Δ [95 % CI]"] == "not run"  # pretrain has no ablation runs
    compute = next(r for r in every if r["comparison (Δ = first - second)"] == "TAPE - RoPE at TAPE's compute (550 steps)")
    assert compute["n paired seeds (planned)"] == "6 (planned 2)"  # described, whatever its n
    assert compute["verdict"].startswith("no verdict, described (n = 6: registered to be described")
    assert abs(float(compute["effect Δ [95 % CI]"].split()[1]) - 4.0 / 90) < 0.005  # 4 ppl at 90, in nats


def test_flipflop_section_table_and_log_figure(rendered: Path) -> None:
    text = (rendered / "README.md").read_text()
    assert "## Flip-flop (cpu)" in text and "figures/flipflop_cpu.png" in text
    assert (rendered / "figures" / "flipflop_cpu.png").read_bytes()[:4] == b"\x89PNG"
    with open(rendered / "tables" / "flipflop_cpu.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert {r["PE"] for r in table} >= {"RoPE", "TAPE", "ALiBi", "NoPE", "FIRE"}
    nope = [r for r in table if r["PE"] == "NoPE"]
    assert all(r["2x (128 tokens)"] == "not run" for r in nope)
    rope_sparse = next(r for r in table if r["PE"] == "RoPE" and r["sparsity"] == "sparse")
    assert float(rope_sparse["mean of 2x, 3x"]) == pytest.approx(float(rope_sparse["2x (128 tokens)"]) * 1.25)


def test_claims_config_paths_are_checked() -> None:
    cfg = load_claims()
    for claim in cfg.claims:
        assert claim.command.startswith("python -m pipelines.train -m experiment=" + claim.experiment)


def test_arm_table_puts_in_distribution_speed_and_e_movement_beside_the_metric(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed in range(3):
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            run = make_run(runs, "addition_c1/cpu", pe, seed, f"20261123-10000{seed}-eeeeee-{j}",
                           {"task": "addition", "ood_accuracy": 10.0 + seed + j,
                            "in_distribution_accuracy": 99.0 + 0.5 * j},
                           c1_config(cfg_pe, abacus=True))
            (run / "csv").mkdir()
            reach = 500 if pe == "tape" else (750 if seed < 2 else None)  # RoPE seed 2 never reaches 99 %
            lines = ["step,train/loss,val/exact_match"]
            for step in (250, 500, 750, 1000):
                lines.append(f"{step - 2},1.0,")  # a training row: no validation value
                # Lightning logs validation after `step` batches at the 0-based index step - 1
                lines.append(f"{step - 1},,{0.995 if reach is not None and step >= reach else 0.5}")
            (run / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
        make_run(runs, "pretrain/cpu", "tape", seed, f"20261123-10000{seed}-ffffff-0",
                 {"task": "pretrain", "ppl_1x": 90.0, "e_move_last": 0.2 + 0.1 * seed},
                 config("pretrain", TAPE_PE))
    out = tmp_path / "results"
    render(runs, out)
    with open(out / "tables" / "claims_arms.csv", newline="") as f:
        table = [(r["claim"], r["arm"], r) for r in csv.DictReader(f)]
    arms = {(c, a): r for c, a, r in table}
    tape_c1, rope_c1 = arms[("C1", "TAPE + Abacus")], arms[("C1", "RoPE + Abacus")]
    assert tape_c1["seeds"] == "0, 1, 2"
    assert tape_c1["the claim's metric: mean ± sd [min, max]"] == "12.00 ± 1.00 [11.00, 13.00]"
    assert "in_distribution_accuracy: 99.50 ± 0.00" in tape_c1["beside it (mean ± sd [min, max] over the same seeds)"]
    assert "steps_to_99: median 500 (3/3 reached)" in tape_c1["beside it (mean ± sd [min, max] over the same seeds)"]
    assert "steps_to_99: median 750 (2/3 reached)" in rope_c1["beside it (mean ± sd [min, max] over the same seeds)"]
    c2 = arms[("C2", "TAPE")]["beside it (mean ± sd [min, max] over the same seeds)"]
    assert "e_move_last: 0.300 ± 0.100 [0.200, 0.400]" in c2


def test_seeds_where_an_arm_did_not_learn_the_task_are_left_out_and_named(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed in range(7):
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            in_dist = 40.0 if (pe, seed) in {("tape", 1), ("rope", 4)} else 99.0
            make_run(runs, "addition_c1/cpu", pe, seed, f"20261123-10000{seed}-eeeeee-{j}",
                     {"task": "addition", "ood_accuracy": 10.0 + seed + 3 * j, "in_distribution_accuracy": in_dist},
                     c1_config(cfg_pe, abacus=True))
    out = tmp_path / "results"
    render(runs, out)
    c1 = rows(out / "tables" / "claims_all.csv")["C1"]
    assert c1["n paired seeds (planned)"] == "5 (planned 8)" and c1["effect Δ [95 % CI]"].startswith("Δ +3.00 [")
    assert c1["verdict"].startswith("no verdict, described (n = 5 < 6 paired seeds")
    assert "2 seed(s) invalid, left out (1, 4: in_distribution_accuracy < 95)" in c1["verdict"]
    # the per-arm table never averages an invalid seed: it names it
    arms = {r["arm"]: r for r in csv.DictReader(open(out / "tables" / "claims_arms.csv", newline=""))}
    tape = arms["TAPE + Abacus"]
    assert tape["seeds"] == "0, 2, 3, 4, 5, 6 (left out: 1 invalid)"
    assert tape["the claim's metric: mean ± sd [min, max]"].startswith("16.33 ± ")
    assert arms["RoPE + Abacus"]["seeds"] == "0, 1, 2, 3, 5, 6 (left out: 4 invalid)"
    # none valid: no verdict, and the reason
    for path in runs.rglob("metrics.json"):
        path.write_text(path.read_text().replace('"in_distribution_accuracy": 99.0', '"in_distribution_accuracy": 50.0'))
    render(runs, tmp_path / "again")
    c1 = rows(tmp_path / "again" / "tables" / "claims_all.csv")["C1"]
    assert c1["effect Δ [95 % CI]"] == "no valid pair" and c1["verdict"].startswith("**no verdict**: 7 seed(s) invalid")


def test_each_claim_with_runs_gets_a_figure_by_length(rendered: Path) -> None:
    claims_part = (rendered / "claims_detail.md").read_text()  # the Claims section's figures
    for name in ("claim_c2.png", "claim_c3.png"):
        assert f"figures/{name}" in claims_part
        assert (rendered / "figures" / name).read_bytes()[:4] == b"\x89PNG"
    assert "claim_c1.png" not in claims_part  # no addition runs


def test_addition_curve_pools_cells_by_the_longer_operand(tmp_path: Path) -> None:
    from tape.report.claim_figures import addition_curve, interval
    from tape.report.runs import find_runs
    from test_report import grid_csv

    make_run(tmp_path, "addition_c1/cpu", "rope", 0, "20261123-100000-aaaaaa-0", {"task": "addition"},
             c1_config({"name": "rope"}, abacus=True),
             {"grid.csv": grid_csv({(1, 1): 10, (1, 2): 5, (2, 1): 0, (2, 2): 3})})
    (run,) = find_runs(tmp_path)
    assert addition_curve(run) == {1: 100.0, 2: pytest.approx(100 * 8 / 30)}
    mean, low, high = interval(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0 and low == pytest.approx(2 - 4.302653 / np.sqrt(3), rel=1e-5) and high > 3


def test_runs_without_the_claims_settings_do_not_count(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed in range(6):
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            make_run(runs, "addition_c1/cpu", pe, seed, f"20261123-10000{seed}-eeeeee-{j}",
                     {"task": "addition", "ood_accuracy": 5.0, "in_distribution_accuracy": 100.0},
                     c1_config(cfg_pe, abacus=True, lr=0.001))  # the first sizing's rate
    render(runs, tmp_path / "results")
    c1 = rows(tmp_path / "results" / "tables" / "claims_all.csv")["C1"]
    assert c1["n paired seeds (planned)"] == "0 (planned 8)" and c1["effect Δ [95 % CI]"] == "not run"


def test_a_claim_reads_only_its_planned_seeds(tmp_path: Path) -> None:
    """C1 reads seeds 0-7 and C1b, registered on fresh seeds, 8-15 of the same arms."""
    runs = tmp_path / "runs"
    for seed in range(16):
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            make_run(runs, "addition_c1/cpu", pe, seed, f"20261123-1000{seed:02d}-eeeeee-{j}",
                     {"task": "addition", "ood_accuracy": 5.0 + j * (1 if seed < 8 else 0),
                      "ood_digit_accuracy": 40.0 + j * (0.1 * seed if seed < 8 else 3.0 + 0.1 * seed),
                      "in_distribution_accuracy": 100.0}, c1_config(cfg_pe, abacus=True))
    render(runs, tmp_path / "results")
    every = list(csv.DictReader(open(tmp_path / "results" / "tables" / "claims_all.csv")))
    c1b = next(r for r in every if r["claim"].startswith("C1b"))
    assert c1b["n paired seeds (planned)"] == "8 (planned 8)"
    assert c1b["effect Δ [95 % CI]"].startswith("Δ +4.15 [")  # 3 + 0.1 * mean(8..15), not seeds 0-7
    c1 = next(r for r in every if r["claim"].startswith("C1:"))
    assert c1["n paired seeds (planned)"] == "8 (planned 8)" and c1["effect Δ [95 % CI]"].startswith("Δ +1.00 [")


def test_digit_curve_reads_the_answer_digits(tmp_path: Path) -> None:
    """C1b's figure: digit accuracy by length, from the grid's digits / digits_correct columns."""
    from tape.report.claim_figures import METRIC_CURVES, addition_curve
    from tape.report.runs import find_runs

    grid = "len_a,len_b,n,correct,digits,digits_correct\n1,1,10,10,20,20\n1,2,10,0,30,24\n2,2,10,2,30,12\n"
    make_run(tmp_path, "addition_c1/cpu", "tape", 0, "20261123-100000-aaaaaa-0", {"task": "addition"},
             c1_config(TAPE_PE, abacus=True), {"grid.csv": grid})
    (run,) = find_runs(tmp_path)
    digits = METRIC_CURVES["ood_digit_accuracy"][0](run)
    assert digits == {1: 100.0, 2: pytest.approx(100 * 36 / 60)}
    assert addition_curve(run) == {1: 100.0, 2: pytest.approx(100 * 2 / 20)}  # whole sums differ


def test_flop_matched_arms_take_tapes_flops_per_step() -> None:
    """The FLOP-matched RoPE arms' step counts follow the FLOP counter at the presets' shapes."""
    from conftest import compose_config
    from tape.bench.flops import model_costs
    import tape.pe
    from tape.model import ModelConfig

    cfg = load_claims()
    for experiment, arm in (("pretrain/cpu", "rope_pretrain_flops"), ("flipflop/cpu", "rope_flipflop_flops")):
        flops = {}
        for pe in ("tape", "rope"):
            c = compose_config("config", [f"experiment={experiment}", f"pe={pe}"])
            mc = ModelConfig.from_groups(dict(c.model), dict(c.pe), tape.pe.option_names())
            flops[pe] = model_costs(mc, c.task.batch_size, c.task.seq_len, backward=True)["flops"]
        preset = compose_config("config", [f"experiment={experiment}"]).trainer.max_steps
        steps = cfg.arms[arm].match["trainer.max_steps"]
        assert abs(steps / preset - flops["tape"] / flops["rope"]) < 0.005, (arm, steps, flops)
        assert steps % cfg.arms[arm].match["trainer.val_check_interval"] == 0


def test_pretraining_claims_draw_loss_against_training_flops(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed in range(2):
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            c = config("pretrain", cfg_pe)
            c["model"] = {"vocab_size": 64, "n_layers": 1, "d_model": 16, "n_heads": 2, "max_seq_len": 64}
            c["task"]["batch_size"] = 2
            run = make_run(runs, "pretrain/cpu", pe, seed, f"20261123-10000{seed}-eeeeee-{j}",
                           {"task": "pretrain", "ppl_1x": 90.0 + j + seed}, c)
            (run / "csv").mkdir()
            (run / "csv" / "metrics.csv").write_text("step,val/loss\n99,5.0\n199,4.6\n499,4.4\n")
    render(runs, tmp_path / "results")
    assert (tmp_path / "results" / "figures" / "claim_c2_flops.png").read_bytes()[:4] == b"\x89PNG"
    assert "claim_c2_flops.png" in (tmp_path / "results" / "claims_detail.md").read_text()


def test_an_exploratory_claim_with_a_paper_effect_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load(CLAIMS_FILE.read_text())
    claim = next(c for c in raw["claims"] if c.get("paper_effect"))
    claim["exploratory"] = True
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=rf"claim {claim['id']}: an exploratory claim is described, never "
                                         r"judged, so its paper_effect cannot be tested: remove paper_effect"):
        load_claims(path)


def c1_runs(runs: Path, seeds: range, ood: dict[tuple[str, int], float] | None = None,
            model: dict[tuple[str, int], dict] | None = None) -> None:
    """C1's primary arms (TAPE + Abacus, RoPE + Abacus): TAPE 3 points better at every seed, but
    for the values and model settings given per (pe, seed)."""
    for seed in seeds:
        for j, (pe, cfg_pe) in enumerate((("rope", {"name": "rope"}), ("tape", TAPE_PE))):
            cfg = c1_config(cfg_pe, abacus=True)
            cfg["model"].update((model or {}).get((pe, seed), {}))
            value = (ood or {}).get((pe, seed), 10.0 + seed + 3 * j + 0.1 * (seed % 3) * j)
            make_run(runs, "addition_c1/cpu", pe, seed, f"20261123-10000{seed}-eeeeee-{j}",
                     {"task": "addition", "ood_accuracy": value, "in_distribution_accuracy": 99.0}, cfg)


def test_a_seed_with_a_non_finite_metric_is_left_out_and_named(tmp_path: Path) -> None:
    """A NaN value (a diverged run) became Δ +nan with p 0, and Holm over a NaN reordered the
    other comparisons' p-values."""
    runs = tmp_path / "runs"
    c1_runs(runs, range(8), ood={("tape", 3): float("nan")})
    render(runs, tmp_path / "results")
    c1 = rows(tmp_path / "results" / "tables" / "claims_all.csv")["C1"]
    assert c1["n paired seeds (planned)"] == "7 (planned 8)" and c1["effect Δ [95 % CI]"].startswith("Δ +3.")
    assert "nan" not in c1["effect Δ [95 % CI]"] + c1["verdict"]
    assert c1["verdict"].startswith("**better**") and "1 seed(s) left out, ood_accuracy not finite (NaN or inf: 3)" in c1["verdict"]
    arms = {r["arm"]: r for r in csv.DictReader(open(tmp_path / "results" / "tables" / "claims_arms.csv", newline=""))}
    assert arms["TAPE + Abacus"]["seeds"] == "0, 1, 2, 4, 5, 6, 7 (left out: 3 ood_accuracy not finite)"


def test_below_six_pairs_the_answer_does_not_speak_of_the_papers_effect(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    c1_runs(runs, range(3))
    render(runs, tmp_path / "results")
    headline = {r["claim"].split(":")[0]: r for r in csv.DictReader(open(tmp_path / "results" / "tables" / "claims.csv"))}
    answer = headline["C1"]["answer at this scale"]
    assert answer.startswith("not answered yet") and "the paper's effect is not tested yet (n < 6)" in answer
    assert "not excluded" not in answer


def test_pairs_that_differ_in_more_than_the_arms_are_flagged(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    """Each arm pools only runs of one setting, but nothing checked that the two arms' settings
    agree beyond the PE and the arms' own keys (here every RoPE run has another Abacus offset)."""
    c1_runs(runs, range(8), model={("rope", s): {"abacus_max_offset": 20} for s in range(8)})
    render(runs, tmp_path / "results")
    c1 = rows(tmp_path / "results" / "tables" / "claims_all.csv")["C1"]
    assert c1["n paired seeds (planned)"] == "8 (planned 8)"
    assert ("**not like for like**: the arms' runs also differ (first vs second) in model.abacus_max_offset=10 vs 20 at seed(s) "
            "0, 1, 2, 3, 4, 5, 6, 7") in c1["verdict"]
    runs_alike = tmp_path / "alike"
    c1_runs(runs_alike, range(8))
    render(runs_alike, tmp_path / "alike-results")
    assert "like for like" not in rows(tmp_path / "alike-results" / "tables" / "claims_all.csv")["C1"]["verdict"]


def test_the_flipflop_figure_gives_every_arm_its_own_colour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """13 arms in the committed records shared matplotlib's 10 default colours (RoPE and a RoPE
    ablation drawn alike), and the legend sat on the dense panel's data."""
    import tape.report.flipflop as flipflop

    runs = tmp_path / "runs"
    for i in range(12):  # 12 arms: each PE twice, the second trained longer (its own arm)
        pe = ("rope", "tape", "nope", "fire", "alibi", "randpe")[i % 6]
        make_run(runs, "flipflop/cpu", pe, 0, f"20261123-1000{i:02d}-aaaaaa-{i}", flipflop_metrics(1.0 + i),
                 config("flipflop", TAPE_PE if pe == "tape" else {"name": pe}, steps=400 + 10 * (i // 6)))
    drawn: list = []
    monkeypatch.setattr(flipflop, "save_png", lambda fig, path, overwrite=False: drawn.append(fig))
    render(runs, tmp_path / "results")
    (fig,) = drawn
    panels = [ax for ax in fig.axes if ax.get_lines()]
    for ax in panels:
        colours = [line.get_color() for line in ax.get_lines()]
        assert len(colours) == 12 and len(set(colours)) == 12, ax.get_title()
    legend = panels[-1].get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().x0 > panels[-1].bbox.x1  # beside, not on, the data


def test_an_arm_reads_an_option_added_since_a_record_as_its_former_value() -> None:
    """A TAPE record older than tape_equivariant / tape_tensorial counts as TAPE (they were on),
    and an ablation run, which sets one off, never stands for TAPE's arm."""
    from types import SimpleNamespace

    arms = load_claims().arms
    old = SimpleNamespace(pe="tape", config=lambda: config("pretrain", TAPE_PE))
    ablated = SimpleNamespace(pe="tape", config=lambda: config(
        "pretrain", {**TAPE_PE, "tape_equivariant": False, "tape_tensorial": True}))
    require = {"paired_init": True}
    assert arms["tape"].matches(old, require) and not arms["tape"].matches(ablated, require)
    assert arms["tape_no_eq"].matches(ablated, require) and not arms["tape_no_eq"].matches(old, require)
    assert not arms["tape_vector"].matches(ablated, require)


def test_a_record_older_than_an_option_pools_with_its_former_value_only(tmp_path: Path) -> None:
    """Old TAPE records (no tape_equivariant key) pool with new TAPE runs as seeds, and stay
    apart from the ablation, whose runs are newer and share every key the old records have."""
    from tape.report.groups import group_by
    from tape.report.runs import find_runs

    runs = tmp_path / "runs"
    for seed in (0, 1):
        make_run(runs, "pretrain/cpu", "tape", seed, f"20261120-10000{seed}-aaaaaa-{seed}",
                 {"task": "pretrain", "ppl_1x": 90.0}, config("pretrain", TAPE_PE))
        make_run(runs, "pretrain/cpu", "tape", seed, f"20261206-10000{seed}-bbbbbb-{seed}",
                 {"task": "pretrain", "ppl_1x": 95.0}, config("pretrain", {**TAPE_PE, "tape_equivariant": False}))
    make_run(runs, "pretrain/cpu", "tape", 2, "20261205-200000-cccccc-2", {"task": "pretrain", "ppl_1x": 91.0},
             config("pretrain", {**TAPE_PE, "tape_equivariant": True, "tape_tensorial": True}))
    groups = group_by(find_runs(runs), lambda r: r.pe)
    assert groups["tape"].seeds == [0, 1, 2] and {r.metrics["ppl_1x"] for r in groups["tape"].finished} == {90.0, 91.0}
    apart = [g for name, g in groups.items() if name != "tape"]
    assert len(apart) == 1 and apart[0].seeds == [0, 1] and "tape_equivariant=False" in apart[0].differs


RECIPES = ("tape", "tape_mix", "lora", "longlora", "theta")


def extension_metrics(books: dict[str, float]) -> dict:
    """A context-extension run's metrics.json: every recipe's perplexity and passkey keys."""
    out: dict = {"task": "context_extension"}
    for method, ppl in books.items():
        out |= {f"ppl_books_{n}_{method}": ppl * 512 / n for n in (128, 256, 512)}
        out |= {f"ppl_stdlib_512_{method}": 10 * ppl, f"passkey_512_{method}": 0.5}
    return out


def test_recipes_of_one_run_are_arms_that_pair_by_seed(tmp_path: Path) -> None:
    """C7 reads each recipe's keys from the same context-extension run: TAPE 5 % below LoRA's
    perplexity at every planned seed (1-8); seed 0, seen before C7 was registered, is not read."""
    runs = tmp_path / "runs"
    for seed in range(9):
        lora = 60.0 + seed
        books = {m: lora for m in RECIPES} | {"tape": lora * (0.95 if seed else 2.0), "theta": lora * 1.01}
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261206-2100{seed:02d}-ffffff-0",
                 extension_metrics(books), {"task": {"name": "context_extension"}, "pe": {"name": "llama"},
                                            "paired_init": True})
    render(runs, tmp_path / "results")
    every = [r for r in csv.DictReader(open(tmp_path / "results" / "tables" / "claims_all.csv"))
             if r["comparison (Δ = first - second)"] and "LoRA" in r["comparison (Δ = first - second)"]]
    c7 = rows(tmp_path / "results" / "tables" / "claims_all.csv")["C7"]
    assert c7["n paired seeds (planned)"] == "8 (planned 8)"
    assert c7["effect Δ [95 % CI]"].startswith(f"Δ {np.log(0.95):+.3f} [")  # ln(0.95) = -0.051 at every seed
    assert c7["verdict"].startswith("**better**") and c7["comparison (Δ = first - second)"].startswith(
        "TAPE (official recipe) - LoRA")
    answer = rows(tmp_path / "results" / "tables" / "claims.csv")["C7"]["answer at this scale"]
    assert answer.startswith("TAPE (official recipe) better than LoRA")
    mixing = next(r for r in every if "mixing post map" in r["comparison (Δ = first - second)"])  # described
    assert mixing["n paired seeds (planned)"] == "8 (planned 8)"  # every run scores it: no seeds of its own
    arms = [r for r in csv.DictReader(open(tmp_path / "results" / "tables" / "claims_arms.csv"))
            if r["claim"] == "C7"]
    tape = next(r for r in arms if r["arm"] == "TAPE (official recipe)")
    assert tape["seeds"] == "1, 2, 3, 4, 5, 6, 7, 8" and "ppl_stdlib_512_tape: " in tape[ARM_ALSO]
    assert "figures/claim_c7.png" in (tmp_path / "results" / "claims_detail.md").read_text()


def test_the_control_recipe_claim_reads_only_runs_with_its_recipe_list(tmp_path: Path) -> None:
    """C7a's arms are recipes of runs made with extend.recipes=[tape,lora,embed_norm] at seeds
    15-20: newer preset runs at those seeds (no control recipe) are not read, and C7 never reads
    them."""
    runs = tmp_path / "runs"
    base = {"task": {"name": "context_extension"}, "pe": {"name": "llama"}, "paired_init": True}
    for seed in range(15, 21):
        control = 60.0 + seed
        books = {"tape": control * 1.02, "lora": control * 0.99, "embed_norm": control}
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261207-0500{seed:02d}-eeeeee-0",
                 extension_metrics(books), {**base, "extend": {"recipes": ["tape", "lora", "embed_norm"]}})
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261207-0600{seed:02d}-dddddd-0",  # the preset's
                 extension_metrics({m: 50.0 for m in RECIPES}), {**base, "extend": {"recipes": list(RECIPES)}})
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    c7a = claims["C7a"]
    assert c7a["n paired seeds (planned)"] == "6 (planned 6)"
    assert c7a["effect Δ [95 % CI]"].startswith(f"Δ {np.log(1.02):+.3f} [")  # the control runs only
    assert c7a["verdict"].startswith("**worse**") and c7a["comparison (Δ = first - second)"].startswith(
        "TAPE (official recipe) - embeddings and norms only")
    assert claims["C7"]["n paired seeds (planned)"].startswith("0 ")


def test_the_maps_off_claim_reads_only_runs_that_scored_the_maps_off(tmp_path: Path) -> None:
    """C7m pairs each run's TAPE model with itself, maps switched off, at seeds 21-26, from runs
    made with extend.recipes=[tape] and eval.maps_off=[tape]; a newer run at those seeds without
    eval.maps_off is not read."""
    runs = tmp_path / "runs"
    base = {"task": {"name": "context_extension"}, "pe": {"name": "llama"}, "paired_init": True}
    for seed in range(21, 27):
        off = 60.0 + seed
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261207-0700{seed:02d}-eeeeee-0",
                 extension_metrics({"tape": off * 0.98, "tape_maps_off": off}),
                 {**base, "extend": {"recipes": ["tape"]}, "eval": {"maps_off": ["tape"]}})
        make_run(runs, "context_extension/cpu", "llama", seed, f"20261207-0800{seed:02d}-dddddd-0",
                 extension_metrics({"tape": 50.0}), {**base, "extend": {"recipes": ["tape"]}, "eval": {"maps_off": []}})
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    for claim in ("C7m", "C7ms"):
        assert claims[claim]["n paired seeds (planned)"] == "6 (planned 6)"
        assert claims[claim]["effect Δ [95 % CI]"].startswith(f"Δ {np.log(0.98):+.3f} [")
        assert claims[claim]["verdict"].startswith("**better**")
        assert claims[claim]["comparison (Δ = first - second)"].startswith(
            "TAPE (official recipe) - TAPE (official recipe), maps switched off")
    assert claims["C7a"]["n paired seeds (planned)"].startswith("0 ")
    assert claims["C7msc"]["n paired seeds (planned)"] == "0 (planned 10)"  # its fresh seeds are 27-36
    assert claims["C7asc"]["n paired seeds (planned)"] == "0 (planned 10)"  # its fresh seeds are 37-46


def test_a_recipe_curve_reads_only_its_own_recipe() -> None:
    from tape.report.claim_figures import METHOD_CURVES
    from tape.report.runs import Run

    curve_of = METHOD_CURVES["nll_books_extended"][0]
    run = Run(path=Path("x"), experiment="context_extension/cpu", pe="llama", seed=1,
              metrics={"ppl_books_256_tape": 3.0, "ppl_books_512_tape": 4.0, "ppl_books_512_tape_mix": 9.0,
                       "ppl_stdlib_256_tape": 30.0, "ppl_stdlib_512_tape": 40.0})
    assert curve_of("tape")(run) == {256: 3.0, 512: 4.0} and curve_of("tape_mix")(run) == {512: 9.0}
    assert METHOD_CURVES["nll_stdlib_extended"][0]("tape")(run) == {256: 30.0, 512: 40.0}  # a code claim's corpus


def test_a_recipe_claims_figure_draws_the_corpus_its_metric_reads(tmp_path: Path) -> None:
    from tape.report.claim_figures import claim_figure
    from tape.report.document import Context
    from tape.report.runs import Run

    def runs_scored_on(corpus: str) -> list[Run]:
        return [Run(path=tmp_path / corpus / str(seed), experiment="context_extension/cpu", pe="llama", seed=seed,
                    metrics={f"ppl_{corpus}_{n}_{m}": 50.0 + seed + n / 64 for n in (256, 512)
                             for m in ("tape", "embed_norm")}) for seed in range(3)]

    methods = {"TAPE": "tape", "control": "embed_norm"}
    for metric, corpus, other in (("nll_stdlib_extended", "stdlib", "books"), ("nll_books_extended", "books", "stdlib")):
        ctx = Context([], tmp_path / metric, "test")
        drawn = runs_scored_on(corpus)
        figure = claim_figure(ctx, "C7x", "t", {"TAPE": drawn, "control": drawn}, "context_extension",
                              metric=metric, methods=methods)
        assert figure is not None and (tmp_path / metric / figure.path).exists(), metric
        missing = runs_scored_on(other)  # runs without the metric's corpus: nothing to draw
        assert claim_figure(ctx, "C7y", "t", {"TAPE": missing, "control": missing}, "context_extension",
                            metric=metric, methods=methods) is None, metric


ARM_ALSO = "beside it (mean ± sd [min, max] over the same seeds)"


@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw["arms"]["ext_lora"].pop("method"),
     r"claim C7: arms .* mix recipes scored inside one run .* give every arm a method, or none"),
    (lambda raw: raw["metrics"]["nll_books_extended"].update(of=["ppl_books_512_tape"]),
     r"claim C7: its arms are methods, so metric 'nll_books_extended' must read keys that name \{method\}"),
    (lambda raw: raw["claims"][0].update(also=["ppl_books_512_{method}"]),
     r"claim C1: a key names \{method\} but no arm has a method"),
    (lambda raw: next(c for c in raw["claims"] if c["id"] == "C7").update(
        controls={"settings": [{"extend.steps": 40}], "valid": {"ppl_books_512_{method}": 0.0}}),
     r"claim C7: its arms are recipes of one run, which has no control run of its own: remove `controls`"),
])
def test_method_arms_are_checked_when_the_claims_load(tmp_path: Path, edit, message: str) -> None:
    raw = yaml.safe_load(CLAIMS_FILE.read_text())
    edit(raw)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=message):
        load_claims(path)


def test_the_word_problem_confirmation_reads_only_its_fresh_seeds(tmp_path: Path) -> None:
    """C5 pairs the 2-layer arms at seeds 0-7, C5c at its fresh seeds 8-27: the same arms, the
    seeds each claim registered, no pooling (TAPE leads by 5 points at 0-7, trails by 1 after)."""
    runs = tmp_path / "runs"
    rng = np.random.default_rng(5)
    for seed in range(28):
        rope = 58 + 2 * rng.standard_normal()
        tape = rope + (5.0 if seed < 8 else -1.0) + 0.1 * rng.standard_normal()
        for pe, acc, pe_cfg in (("rope", rope, {"name": "rope"}), ("tape", tape, TAPE_PE)):
            cfg = {**config("word_problem", pe_cfg, steps=3000), "model": {"n_layers": 2}}
            make_run(runs, "word_problem/cpu", pe, seed, f"20261207-1300{seed:02d}-ffffff-0",
                     {"task": "word_problem", "token_accuracy": acc}, cfg)
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    assert claims["C5"]["n paired seeds (planned)"] == "8 (planned 8)"
    assert abs(float(claims["C5"]["effect Δ [95 % CI]"].split()[1]) - 5.0) < 0.2
    assert claims["C5c"]["n paired seeds (planned)"] == "20 (planned 20)"
    assert abs(float(claims["C5c"]["effect Δ [95 % CI]"].split()[1]) + 1.0) < 0.2
    assert claims["C5c"]["verdict"].startswith("**worse**")


def test_the_extrapolation_confirmation_reads_4x_at_its_fresh_seeds_only(tmp_path: Path) -> None:
    """C2x pairs TAPE with RoPE at 4x the training length on seeds 10-17 alone: C2's seeds 0-7
    (TAPE behind by 0.10 nats there) and the table's seeds 8-9 never pool into it."""
    runs = tmp_path / "runs"
    rng = np.random.default_rng(7)
    for seed in range(18):
        rope_4x = 97 * np.exp(0.01 * rng.standard_normal())
        tape_4x = rope_4x * np.exp(0.10 if seed < 10 else -0.02)
        for pe, ppl_4x, pe_cfg in (("rope", rope_4x, {"name": "rope"}), ("tape", tape_4x, TAPE_PE)):
            make_run(runs, "pretrain/cpu", pe, seed, f"20261207-1700{seed:02d}-eeeeee-0",
                     {"task": "pretrain", "ppl_1x": 91.0, "ppl_4x": float(ppl_4x)}, config("pretrain", pe_cfg))
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    assert claims["C2x"]["n paired seeds (planned)"] == "8 (planned 8)"
    assert abs(float(claims["C2x"]["effect Δ [95 % CI]"].split()[1]) + 0.02) < 0.002
    assert claims["C2x"]["verdict"].startswith("**better**")


def test_the_width_confirmation_reads_4x_at_seeds_10_to_23_only(tmp_path: Path) -> None:
    """C2wc pairs each width with the default TAPE at 4x on seeds 10-23; C2w's seeds 0-7 (where
    I = H sits 0.05 nats above) and the default's seeds 8-9 never pool into it, nor it into C2w."""
    runs = tmp_path / "runs"
    rng = np.random.default_rng(13)
    for seed in range(24):
        tape_4x = 98 * np.exp(0.01 * rng.standard_normal())
        make_run(runs, "pretrain/cpu", "tape", seed, f"20261207-1900{seed:02d}-cccccc-0",
                 {"task": "pretrain", "ppl_1x": 91.0, "ppl_4x": float(tape_4x)}, config("pretrain", TAPE_PE))
        if seed in (8, 9):
            continue
        for width, shift in ((4, 0.05 if seed < 8 else -0.02), (32, 0.01)):
            ppl_4x = tape_4x * np.exp(shift + 0.001 * rng.standard_normal())
            make_run(runs, "pretrain/cpu", "tape", seed, f"20261207-2000{seed:02d}-dddddd-{width}",
                     {"task": "pretrain", "ppl_1x": 91.0 * np.exp(shift), "ppl_4x": float(ppl_4x)},
                     config("pretrain", {**TAPE_PE, "tape_position_size": width}))
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    assert claims["C2wc"]["n paired seeds (planned)"] == "14 (planned 14)"
    assert abs(float(claims["C2wc"]["effect Δ [95 % CI]"].split()[1]) + 0.02) < 0.002
    assert claims["C2wc"]["verdict"].startswith("**better**")
    assert abs(float(claims["C2w"]["effect Δ [95 % CI]"].split()[1]) + 0.05) < 0.002  # TAPE minus I = H


def test_the_forgetting_encodings_claim_reads_seeds_2_to_9_only(tmp_path: Path) -> None:
    """C3fp pairs FoX and PaTH with TAPE on seeds 2-9: their seeds 0-1 (C3's describe arms, here
    far worse than TAPE) never pool into it."""
    runs = tmp_path / "runs"
    for seed in range(10):
        tape = 4.0 + 0.2 * seed  # training-sparsity read error 1.25x this, 5.0-7.25 %
        make_run(runs, "flipflop/cpu", "tape", seed, f"20261207-2100{seed:02d}-eeeeee-0",
                 flipflop_metrics(tape), config("flipflop", TAPE_PE))
        for i, (pe, pe_cfg) in enumerate((("fox", {"name": "fox", "fox_gate": "fox"}), ("path", {"name": "path"}))):
            make_run(runs, "flipflop/cpu", pe, seed, f"20261207-2200{seed:02d}-ffffff-{i}",
                     flipflop_metrics(50.0 if seed < 2 else 0.0), config("flipflop", pe_cfg))
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    assert claims["C3fp"]["n paired seeds (planned)"] == "8 (planned 8)"
    assert abs(float(claims["C3fp"]["effect Δ [95 % CI]"].split()[1]) + 1.25 * 5.1) < 0.01
    assert claims["C3fp"]["verdict"].startswith("**better**")


def test_the_parity_forgetting_encodings_claim_reads_seeds_2_to_9_and_drops_invalid_ones(tmp_path: Path) -> None:
    """C6fp pairs FoX and PaTH with TAPE on parity's standard scratchpad at seeds 2-9: their seeds
    0-1 (C6's describe arms, here far worse than TAPE) never pool into it, a seed whose FoX run
    did not learn the training lengths leaves FoX's pair, and no interleaved control is asked."""
    runs = tmp_path / "runs"

    def parity(pe: str, seed: int, pe_cfg: dict, ood: float, in_dist: float = 99.5) -> None:
        run_id = {"tape": "aaaaaa", "fox": "bbbbbb", "path": "cccccc"}[pe]  # hex, as run names are
        make_run(runs, "parity/cpu", pe, seed, f"20261207-2300{seed:02d}-{run_id}-0",
                 {"task": "parity", "step_accuracy_ood": ood, "step_accuracy_id": in_dist},
                 {**config("parity", pe_cfg), "task": {"name": "parity", "scratchpad": "standard"}})

    fox = {}
    for seed in range(10):
        tape = 55.0 + 0.5 * seed
        parity("tape", seed, TAPE_PE, tape)
        fox[seed] = 30.0 if seed < 2 else 70.0 + 0.3 * seed * seed
        parity("fox", seed, {"name": "fox", "fox_gate": "fox"}, fox[seed], 90.0 if seed == 9 else 99.5)
        parity("path", seed, {"name": "path"}, 30.0 if seed < 2 else 75.0 + (seed % 3))
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    assert claims["C6fp"]["n paired seeds (planned)"] == "7 (planned 8)"  # FoX's seed 9 is invalid
    expected = np.mean([fox[seed] - (55.0 + 0.5 * seed) for seed in range(2, 9)])
    assert abs(float(claims["C6fp"]["effect Δ [95 % CI]"].split()[1]) - expected) < 0.01
    assert claims["C6fp"]["verdict"].startswith("**better**")


def test_the_baselines_claim_reads_seeds_2_to_9_and_tells_worse_from_better(tmp_path: Path) -> None:
    """C3bl pairs TAPE with NoPE and ALiBi on seeds 2-9: their seeds 0-1 (C3's describe arms,
    here the other way round) never pool into it, and TAPE may come out better or worse."""
    runs = tmp_path / "runs"
    for seed in range(10):
        tape = 4.0 + 0.2 * seed  # training-sparsity read error 1.25x this, 5.0-7.25 %
        make_run(runs, "flipflop/cpu", "tape", seed, f"20261208-0100{seed:02d}-eeeeee-0",
                 flipflop_metrics(tape), config("flipflop", TAPE_PE))
        fresh = seed >= 2
        for i, (pe, error) in enumerate((("nope", 20.0 if fresh else 0.0), ("alibi", 0.0 if fresh else 40.0))):
            make_run(runs, "flipflop/cpu", pe, seed, f"20261208-0200{seed:02d}-ffffff-{i}",
                     flipflop_metrics(error), config("flipflop", {"name": pe}))
    render(runs, tmp_path / "results")
    with open(tmp_path / "results" / "tables" / "claims_all.csv", newline="") as f:
        every = list(csv.DictReader(f))
    first = next(i for i, r in enumerate(every) if r["claim"].startswith("C3bl:"))
    nope, alibi = every[first], every[first + 1]
    assert (nope["comparison (Δ = first - second)"], alibi["comparison (Δ = first - second)"]) == ("TAPE - NoPE", "TAPE - ALiBi")
    assert nope["n paired seeds (planned)"] == alibi["n paired seeds (planned)"] == "8 (planned 8)"
    assert abs(float(nope["effect Δ [95 % CI]"].split()[1]) - 1.25 * (5.1 - 20.0)) < 0.01
    assert abs(float(alibi["effect Δ [95 % CI]"].split()[1]) - 1.25 * 5.1) < 0.01
    assert nope["verdict"].startswith("**better**") and alibi["verdict"].startswith("**worse**")


def test_a_width_variant_pools_only_into_its_own_arm(tmp_path: Path) -> None:
    """C2w pairs the default TAPE (no width set: 4H) with each PE-MLP width; a width run, newer
    than the default's, never stands in for TAPE's arm in C2w or C2."""
    runs = tmp_path / "runs"
    rng = np.random.default_rng(11)
    for seed in range(8):
        rope = 91 * np.exp(0.01 * rng.standard_normal())
        make_run(runs, "pretrain/cpu", "rope", seed, f"20261207-1000{seed:02d}-aaaaaa-0",
                 {"task": "pretrain", "ppl_1x": float(rope)}, config("pretrain", {"name": "rope"}))
        make_run(runs, "pretrain/cpu", "tape", seed, f"20261207-1000{seed:02d}-aaaaaa-1",
                 {"task": "pretrain", "ppl_1x": float(rope)}, config("pretrain", TAPE_PE))
        for width, shift in ((4, 0.03), (8, 0.02), (32, 0.05)):
            make_run(runs, "pretrain/cpu", "tape", seed, f"20261207-1800{seed:02d}-bbbbbb-{width}",
                     {"task": "pretrain", "ppl_1x": float(rope * np.exp(shift))},
                     config("pretrain", {**TAPE_PE, "tape_position_size": width}))
    render(runs, tmp_path / "results")
    claims = rows(tmp_path / "results" / "tables" / "claims_all.csv")
    assert claims["C2w"]["n paired seeds (planned)"] == "8 (planned 8)"
    assert abs(float(claims["C2w"]["effect Δ [95 % CI]"].split()[1]) + 0.03) < 0.002
    assert abs(float(claims["C2"]["effect Δ [95 % CI]"].split()[1])) < 0.002
