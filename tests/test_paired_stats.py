"""Paired statistics (tape/report/paired.py) against hand-worked values, and the verdict rules
on fixtures whose answer is known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from tape.report.claim_registry import load_claims
from tape.report.paired import (
    DESCRIBED, MetricSpec, compare, decide, fisher_pvalue, hierarchical_bootstrap, holm, mcnemar_pvalue,
    needed_pairs, paper_effect_test, sign_flip_pvalue, successes, t_interval, wilson_interval,
)

PPL = MetricSpec("ppl_1x", margin=1.0, better="lower")


def seeds(values) -> dict[int, float]:
    return dict(enumerate(values))


# ---------------------------------------------------------------------------- hand-worked values
def test_sign_flip_exact_at_n6() -> None:
    assert sign_flip_pvalue(np.array([0.3, 1.2, 0.7, 2.0, 0.1, 0.9])) == 2 / 64
    assert sign_flip_pvalue(np.ones(6)) == 2 / 64
    # |sum| of [-1, 2, 3, 4, 5, 6] is 19; flipping a subset S gives 21 - 2 sum(S) (ignoring the
    # sign already on 1): |.| >= 19 needs sum(S) <= 1 or >= 20: {}, {1} and their complements
    assert sign_flip_pvalue(np.array([-1.0, 2, 3, 4, 5, 6])) == 4 / 64
    assert sign_flip_pvalue(np.ones(5)) == 2 / 32  # n = 5 can never reach 0.05
    assert sign_flip_pvalue(np.zeros(6)) == 1.0


def test_sign_flip_monte_carlo_above_the_exact_limit() -> None:
    p = sign_flip_pvalue(np.ones(20), n_resamples=50_000)
    assert p == pytest.approx(2 / 2**20, abs=1e-4)


def test_t_interval_by_hand() -> None:
    low, high = t_interval(np.array([1.0, 2.0, 3.0]), 0.95)
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * sd 1 / sqrt(3)
    assert (low, high) == pytest.approx((2 - half, 2 + half), rel=1e-9)
    assert all(math.isnan(x) for x in t_interval(np.array([1.0])))


def test_holm_hand_worked() -> None:
    # sorted: 0.005 * 4 = 0.02; 0.01 * 3 = 0.03; 0.03 * 2 = 0.06; 0.04 * 1 -> max(0.06, 0.04)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_holm_and_sign_flip_refuse_nan() -> None:
    """holm([0.01, nan, 0.04, 0.001]) gave [0.04, 1, 1, 1] (a NaN reorders the others); the
    sign-flip test gave p = 0 for a NaN difference."""
    with pytest.raises(ValueError, match="NaN"):
        holm([0.01, math.nan, 0.04, 0.001])
    with pytest.raises(ValueError, match="non-finite"):
        sign_flip_pvalue(np.array([1.0, math.nan, 2.0]))


def test_wilson_by_hand() -> None:
    assert wilson_interval(8, 10) == pytest.approx((0.490, 0.943), abs=5e-4)
    z2 = 1.959963984540054 ** 2
    low, high = wilson_interval(0, 6)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(z2 / (6 + z2))


def test_mcnemar_by_hand() -> None:
    assert mcnemar_pvalue(5, 0) == pytest.approx(2 / 32) and mcnemar_pvalue(0, 0) == 1.0
    assert mcnemar_pvalue(3, 1) == pytest.approx(10 / 16)  # 2 * P(X <= 1), X ~ Bin(4, 1/2)


def test_fisher_by_hand() -> None:
    assert fisher_pvalue(6, 6, 0, 6) == pytest.approx(2 / 924)  # 2 / C(12, 6)
    # margins 6, 6 | 4, 8: P(X = k) = C(4, k) C(8, 6 - k) / 924 = 28, 224, 420, 224, 28 (/924)
    assert fisher_pvalue(3, 6, 1, 6) == pytest.approx(504 / 924)


# ---------------------------------------------------------------------------- verdicts
def test_known_difference_is_better_and_its_reverse_worse() -> None:
    rng = np.random.default_rng(0)
    base = 100 + 5 * rng.standard_normal(8)  # large seed-to-seed spread, shared by both arms
    tape = base - 2.0 + 0.3 * rng.standard_normal(8)
    [c] = decide([compare(seeds(tape), seeds(base), PPL, ("tape", "rope"))])
    assert c.n == 8 and c.verdict == "better" and c.ci95[1] < 0 and c.p_sign_flip == 2 / 256
    [w] = decide([compare(seeds(base), seeds(tape), PPL)])
    assert w.verdict == "worse"
    # the same arms unpaired would be inconclusive: pairing is what removes the seed spread
    shuffled = dict(zip(range(8), np.roll(tape, 3)))
    [u] = decide([compare(shuffled, seeds(base), PPL)])
    assert u.verdict == "inconclusive"


def test_no_difference_equivalent_with_wide_margin_inconclusive_with_narrow() -> None:
    rng = np.random.default_rng(1)
    base = 100 + 5 * rng.standard_normal(8)
    tape = base + 0.2 * rng.standard_normal(8)
    wide = MetricSpec("ppl_1x", margin=1.0, better="lower")
    narrow = MetricSpec("ppl_1x", margin=0.05, better="lower")
    [c] = decide([compare(seeds(tape), seeds(base), wide)])
    assert c.verdict == "equivalent" and -1 < c.ci90[0] and c.ci90[1] < 1
    [c] = decide([compare(seeds(tape), seeds(base), narrow)])
    assert c.verdict == "inconclusive"


def test_equivalence_reads_the_90_percent_interval_not_the_95() -> None:
    """Δ alternating ±1.26 over 8 seeds: the 90 % interval (≈ ±0.90) lies inside ±1, the 95 %
    one (≈ ±1.13) does not; two one-sided tests at 5 % make it equivalent."""
    d = np.array([1.26, -1.26] * 4)
    [c] = decide([compare(seeds(100 + d), seeds(np.full(8, 100.0)), PPL)])
    assert -1 < c.ci90[0] and c.ci90[1] < 1 and c.ci95[0] < -1 and 1 < c.ci95[1]
    assert c.within_margin and c.verdict == "equivalent"


def test_t_and_sign_flip_must_agree() -> None:
    # five large improvements and one small loss: the t test says p ~ 0.01, the sign-flip test
    # 4/64 (flipping the small one is as extreme): no difference
    d = np.array([-2.0, -2.1, -1.9, -2.05, -1.95, 0.5])
    [c] = decide([compare(seeds(100 + d), seeds(np.full(6, 100.0)), PPL)])
    assert c.ci95[1] < 0 and c.p_t < 0.05 and c.p_sign_flip == 4 / 64
    assert c.verdict == "inconclusive"


def test_below_six_pairs_a_comparison_is_described_never_judged() -> None:
    d = np.array([-2.0, -2.1, -1.9, -2.05, -1.95])  # consistent, but 5 pairs: min p = 2/32
    [c] = decide([compare(seeds(100 + d), seeds(np.full(5, 100.0)), PPL)])
    assert c.verdict == DESCRIBED and "n = 5 < 6" in c.reason
    tight = np.array([0.01, -0.01])  # a 90 % interval well inside ±1 from 2 pairs: still no word
    [e] = decide([compare(seeds(100 + tight), seeds(np.full(2, 100.0)), PPL)])
    assert e.within_margin and e.verdict == DESCRIBED


def test_described_comparisons_stay_out_of_the_holm_family() -> None:
    base = seeds(np.arange(6, dtype=float) * 10)
    tape = {s: v - 1.0 - 0.1 * s for s, v in base.items()}
    tested = compare(tape, base, PPL, primary=False)
    described = [compare(tape, base, PPL, primary=False, tested=False) for _ in range(5)]
    decided = decide([compare(tape, base, PPL), tested, *described])
    assert decided[1].p_adjusted == pytest.approx(2 / 64)  # a family of one: no Holm factor
    assert decided[1].verdict == "better"
    assert all(c.verdict == DESCRIBED and "registered to be described" in c.reason for c in decided[2:])


@pytest.mark.parametrize(("k", "n"), [(1, 6), (2, 7), (3, 7), (4, 8), (6, 8), (7, 9), (12, 9), (13, 10)])
def test_needed_pairs_is_the_least_n_whose_best_holm_p_passes(k: int, n: int) -> None:
    assert needed_pairs(k) == n
    assert k * 2 / 2 ** n < 0.05 <= k * 2 / 2 ** (n - 1)


def test_the_paper_effect_is_excluded_only_when_our_interval_lies_short_of_it() -> None:
    small = [0.5, -0.3, 0.2, 0.1, -0.4, 0.3, 0.0, 0.2]  # Δ near 0 against a paper's +8.7
    assert paper_effect_test(small, 8.7).p == pytest.approx(1 / 256)  # every Δ below δ: one pattern
    assert paper_effect_test(small, 8.7).excluded()
    big = [9.5, 10.1, 8.2, 9.9, 11.0, 8.9, 9.4, 10.2]  # as large as the paper's or more
    assert not paper_effect_test(big, 8.7).excluded() and paper_effect_test(big, 8.7).p > 0.5
    # lower is better: the paper's -0.053 nats against Δ about 0 is excluded, against -0.06 not
    assert paper_effect_test([x / 100 for x in small], -0.053).excluded()
    assert not paper_effect_test([-0.06 + x / 1000 for x in small], -0.053).excluded()
    few = paper_effect_test(small[:5], 8.7)
    assert not few.excluded() and "not tested (n = 5 < 6)" in few.format()


def test_secondary_comparisons_are_holm_corrected() -> None:
    base = seeds(np.arange(6, dtype=float) * 10)
    # all six Δ negative, distinct: p_sign_flip = 2/64 < 0.05 alone, but x3 under Holm
    tape = {s: v - 1.0 - 0.1 * s for s, v in base.items()}
    same = [compare(tape, base, PPL, primary=False) for _ in range(3)]
    decided = decide([compare(tape, base, PPL), *same])
    assert decided[0].verdict == "better" and decided[0].p_adjusted == decided[0].p
    assert all(c.p_adjusted == pytest.approx(3 * 2 / 64) for c in decided[1:])
    assert all(c.verdict != "better" for c in decided[1:])


def test_single_seed_is_never_a_verdict() -> None:
    [c] = decide([compare({0: 90.0}, {0: 100.0}, PPL)])
    assert c.verdict == DESCRIBED and "no interval" in c.effect()


def test_successes_counts_wilson_fisher_and_median() -> None:
    spec = MetricSpec("read_error_ood", margin=0.2, better="lower", success=1.0)
    s = successes(seeds([0.1, 0.5, 30.0, 0.2]), seeds([20.0, 15.0, 25.0, 0.9]), spec)
    assert (s.k_treatment, s.n_treatment, s.k_baseline, s.n_baseline) == (3, 4, 1, 4)
    assert s.p_fisher == pytest.approx(fisher_pvalue(3, 4, 1, 4))
    # paired seeds 0 and 1 succeed only with the treatment, 3 with both, 2 with neither: two
    # discordant pairs, both one way: exact two-sided p = 2 / 2^2
    assert s.p_mcnemar == pytest.approx(2 / 4) and "McNemar p = 0.5" in s.format()
    assert s.median_delta == pytest.approx(np.median([-19.9, -14.5, 5.0, -0.7]))
    assert "3/4" in s.format() and "1/4" in s.format()


def test_hierarchical_bootstrap_sees_both_levels() -> None:
    rng = np.random.default_rng(0)
    same = [rng.binomial(1, 0.5, 2000).astype(float) for _ in range(6)]
    est, low, high = hierarchical_bootstrap(same, seed=1)
    assert est == pytest.approx(np.mean([x.mean() for x in same]))
    assert low < est < high and high - low < 0.03  # items only: about ±1.96 * 0.5 / sqrt(12000)
    spread = [np.full(2000, p) for p in (0.1, 0.9, 0.2, 0.8, 0.3, 0.7)]
    _, low2, high2 = hierarchical_bootstrap(spread, seed=1)
    assert high2 - low2 > 0.3  # between-seed spread dominates
    few = [rng.binomial(1, 0.5, 20).astype(float) for _ in range(6)]
    _, low3, high3 = hierarchical_bootstrap(few, seed=1)
    assert high3 - low3 > 3 * (high - low)  # fewer items per seed: wider
    est_d, lo_d, hi_d = hierarchical_bootstrap([x + 0.0 for x in spread], baseline=spread, seed=1)
    assert est_d == 0 and lo_d == hi_d == 0  # paired difference of identical arms
    assert hierarchical_bootstrap(same, seed=3) == hierarchical_bootstrap(same, seed=3)


# ---------------------------------------------------------------------------- margins in config
def test_margins_come_from_conf_claims_yaml(tmp_path: Path) -> None:
    cfg = load_claims()
    nll = cfg.metrics["nll_1x"]
    assert (nll.margin, nll.better, nll.of, nll.transform) == (0.01, "lower", ("ppl_1x",), "log")
    assert nll.value({"ppl_1x": math.e ** 4.5}) == pytest.approx(4.5) and nll.value({}) is None
    assert (cfg.metrics["ood_accuracy"].margin, cfg.metrics["ood_accuracy"].better) == (2.0, "higher")
    dense = cfg.metrics["read_error_ood_dense"]
    assert dense.margin == 1.0 and dense.value({"read_error_dense_2x": 1.0, "read_error_dense_3x": 4.0}) == 2.5
    assert [c.id for c in cfg.claims] == ["C1", "C1b", "C1y", "C2", "C2e", "C2f", "C2x", "C2u", "C2w", "C2wc", "C3", "C3c", "C3s", "C3d", "C3sc", "C3dc", "C3fp", "C3bl", "C4", "C5", "C5c", "C6", "C6fp", "C7", "C7s", "C7a", "C7as", "C7m", "C7ms", "C7msc", "C7asc", "C1g", "C3g"]
    assert cfg.claims[3].primary == ("tape", "rope")
    raw = yaml.safe_load(Path("conf/claims.yaml").read_text())
    raw["metrics"]["nll_1x"]["margin"] = 5.0
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert load_claims(tmp_path / "c.yaml").metrics["nll_1x"].margin == 5.0
    raw["claims"][0]["primary"] = ["tape", "no_such_arm"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="no_such_arm"):
        load_claims(tmp_path / "bad.yaml")
    raw["claims"][0]["primary"] = ["tape_abacus", "rope_abacus"]
    raw["claims"][0]["paper_effect"]["comparisons"] = [["nope_abacus", "rope_abacus"]]  # not tested
    (tmp_path / "bad2.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="paper_effect.comparisons"):
        load_claims(tmp_path / "bad2.yaml")


def test_a_plan_whose_seeds_cannot_reach_alpha_is_refused_naming_the_n_needed(tmp_path: Path) -> None:
    raw = yaml.safe_load(Path("conf/claims.yaml").read_text())
    raw["claims"][0]["seeds"] = 6  # C1: 3 Holm-corrected secondary comparisons need 7
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="seeds: 6 cannot reach alpha 0.05 .* 3 Holm.* set seeds: 7"):
        load_claims(tmp_path / "c.yaml")
    raw["claims"][0]["seeds"] = 7
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert load_claims(tmp_path / "c.yaml").claims[0].planned_seeds == tuple(range(7))
    c3 = next(c for c in raw["claims"] if c["id"] == "C3")
    c3["seeds"] = 5  # C3: a primary comparison alone needs 6
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="C3: seeds: 5 .* set seeds: 6"):
        load_claims(tmp_path / "c.yaml")


def test_metric_spec_rejects_bad_direction_and_margin() -> None:
    with pytest.raises(ValueError, match="better="):
        MetricSpec("x", margin=1.0, better="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin="):
        MetricSpec("x", margin=0.0, better="lower")
