"""Paired comparisons of two arms over seeds, with intervals and verdicts (DESIGN.md "Evidence").

Runs with one seed share their data order and initial shared weights (tape/model/pairing.py), so
the unit of evidence is the per-seed difference Δ = treatment - baseline. A comparison gives the
mean Δ with t-based 95 % and 90 % intervals, a two-sided t-test p-value and an exact sign-flip
(permutation) p-value; its p-value is the larger of the two, so a difference counts only when the
t interval excludes 0 *and* the sign-flip test agrees. Verdicts:

- better / worse: p < alpha for the pre-named primary comparison; Holm-adjusted p < alpha for
  the secondary ones;
- equivalent: otherwise, when the 90 % interval lies inside ±margin (two one-sided tests);
- inconclusive: otherwise (a non-significant difference is not a tie);
- described (no verdict word): fewer than MIN_VERDICT_PAIRS pairs, or a comparison registered
  only to be described; it keeps its effect and interval. Only the latter stays out of the Holm
  family: the family is every registered secondary comparison, fixed before the runs, so a
  secondary short of pairs still counts in Holm's k (the conservative side).

A family of k tested comparisons can reach alpha only with n >= needed_pairs(k, alpha) pairs
(the sign-flip test's smallest p is 2 / 2^n). ``paper_effect_test`` tests the paper's own
effect δ one-sided: H0 "Δ is at least δ in δ's direction"; a small p excludes the paper's effect.

For success metrics that are bimodal across seeds it also counts the seeds that succeeded
(Wilson intervals, Fisher's exact test) and the median Δ; for accuracies over items it gives a
hierarchical bootstrap (seeds, then items).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Literal, Mapping, Sequence

import numpy as np
from scipy import stats

Direction = Literal["lower", "higher"]
EXACT_SIGN_FLIP_MAX_N = 16  # 2^16 sign patterns; above, a seeded Monte Carlo estimate
MIN_VERDICT_PAIRS = 6  # the fewest pairs at which a single comparison can reach p < 0.05
DESCRIBED = "described"


def needed_pairs(k: int, alpha: float = 0.05) -> int:
    """The fewest pairs n at which the smallest sign-flip p (2 / 2^n), Holm-multiplied by the
    family's k comparisons, is below alpha: 6 for k = 1, 7 for k = 2-3, 8 for k = 4-6."""
    return math.floor(math.log2(2 * max(k, 1) / alpha)) + 1


@dataclass(frozen=True)
class MetricSpec:
    """How one metric is compared: its margin of equivalence (in its own units), which direction
    is better, and (optional) the threshold a seed must reach to count as a success."""

    key: str
    margin: float
    better: Direction
    label: str = ""
    success: float | None = None
    of: tuple[str, ...] = ()  # derived: the mean of these metrics.json keys (default: key itself)
    transform: Literal["", "log"] = ""  # applied to that mean (log: nats per token from perplexity)

    def __post_init__(self) -> None:
        if self.better not in ("lower", "higher"):
            raise ValueError(f"metric {self.key}: better={self.better!r} must be 'lower' or 'higher'")
        if not self.margin > 0:
            raise ValueError(f"metric {self.key}: margin={self.margin} must be > 0")
        if self.transform not in ("", "log"):
            raise ValueError(f"metric {self.key}: transform={self.transform!r} must be '' or 'log'")

    def value(self, metrics: Mapping[str, object]) -> float | None:
        """This metric from one run's metrics.json (None when a key it needs is missing)."""
        keys = self.of or (self.key,)
        values = [metrics.get(k) for k in keys]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return None
        mean = float(np.mean(values))
        return math.log(mean) if self.transform == "log" else mean

    def succeeded(self, value: float) -> bool:
        """Whether one seed's value reaches the success threshold."""
        if self.success is None:
            raise ValueError(f"metric {self.key} has no success threshold")
        return value <= self.success if self.better == "lower" else value >= self.success


# ---------------------------------------------------------------------------- tests
def paired_deltas(treatment: Mapping[int, float], baseline: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """The seeds both arms ran and treatment - baseline at each, in seed order."""
    seeds = sorted(set(treatment) & set(baseline))
    return seeds, np.array([treatment[s] - baseline[s] for s in seeds], dtype=float)


def t_interval(deltas: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Two-sided t interval for the mean of ``deltas`` (NaNs for fewer than two values)."""
    n = len(deltas)
    if n < 2:
        return math.nan, math.nan
    mean, se = float(np.mean(deltas)), float(np.std(deltas, ddof=1)) / math.sqrt(n)
    half = float(stats.t.ppf(0.5 + level / 2, df=n - 1)) * se
    return mean - half, mean + half


def t_pvalue(deltas: np.ndarray) -> float:
    """Two-sided one-sample t-test of mean 0 (1.0 for fewer than two values; with no spread,
    0.0 when every Δ is the same non-zero value)."""
    if len(deltas) < 2:
        return 1.0
    if np.std(deltas) == 0:
        return 1.0 if deltas[0] == 0 else 0.0
    return float(stats.ttest_1samp(deltas, 0.0).pvalue)


def sign_flip_pvalue(deltas: np.ndarray, n_resamples: int = 200_000, seed: int = 0,
                     alternative: Literal["two-sided", "less"] = "two-sided") -> float:
    """Sign-flip p-value: the share of the 2^n sign patterns whose sum is at least as extreme as
    the observed one (two-sided: |sum| at least |observed|; less: sum at most observed), exact
    up to EXACT_SIGN_FLIP_MAX_N values, else Monte Carlo. Two-sided, the smallest possible p at
    n values is 2 / 2^n: n = 6 is the least that can reach 0.05."""
    d = np.asarray(deltas, dtype=float)
    n = len(d)
    if n == 0:
        return 1.0
    if not np.isfinite(d).all():
        raise ValueError(f"sign-flip test of non-finite differences {d.tolist()}: leave diverged runs out")
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))

    def extreme(sums: np.ndarray) -> np.ndarray:
        if alternative == "less":
            return sums <= d.sum() + tol
        return np.abs(sums) >= abs(d.sum()) - tol

    if n <= EXACT_SIGN_FLIP_MAX_N:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2^n, n)
        return float(np.mean(extreme(signs @ d)))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(n_resamples, n))
    return (int(np.sum(extreme(signs @ d))) + 1) / (n_resamples + 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order."""
    if any(not 0 <= p <= 1 for p in pvalues):  # a NaN would reorder the others
        raise ValueError(f"Holm over p-values outside [0, 1] (or NaN): {list(pvalues)}")
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (NaNs when n = 0)."""
    if n == 0:
        return math.nan, math.nan
    z = float(stats.norm.ppf(0.5 + level / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_pvalue(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher's exact test of k1/n1 against k2/n2 successes."""
    return float(stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)


@dataclass(frozen=True)
class PairedDifference:
    """Model a - model b on the same items: accuracy difference (points) with its 95 % interval
    and McNemar's exact two-sided p over the items only one model got right."""

    delta: float
    low: float
    high: float
    p_value: float
    items: int


def paired_difference(a: Sequence[bool], b: Sequence[bool]) -> PairedDifference:
    """``a`` and ``b``: each item's outcome under two models, in the same order. The interval is
    the normal one of the mean per-item difference (thousands of items, e.g. MMLU's)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired outcomes need the same items: {len(a)} and {len(b)}")
    d = np.array(a, dtype=float) - np.array(b, dtype=float)
    n, mean = len(d), float(d.mean())
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    half = float(stats.norm.ppf(0.975)) * sd / math.sqrt(n)
    p = mcnemar_pvalue(int((d > 0).sum()), int((d < 0).sum()))
    return PairedDifference(100 * mean, 100 * (mean - half), 100 * (mean + half), p, n)


def mcnemar_pvalue(only_treatment: int, only_baseline: int) -> float:
    """Exact two-sided McNemar test on paired seeds: of the discordant pairs (one arm succeeded,
    the other not), is the split unlike a fair coin's? 1.0 without discordant pairs."""
    n = only_treatment + only_baseline
    return 1.0 if n == 0 else float(stats.binomtest(only_treatment, n, 0.5).pvalue)


def hierarchical_bootstrap(items: Sequence[np.ndarray], baseline: Sequence[np.ndarray] | None = None,
                           n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high): the mean over seeds of each seed's item mean (or, with
    ``baseline`` paired by position, of the per-seed difference of item means), with a
    percentile interval from resampling seeds, then items within each resampled seed."""
    arms = [list(items)] + ([list(baseline)] if baseline is not None else [])
    if baseline is not None and len(baseline) != len(items):
        raise ValueError(f"paired bootstrap needs one baseline per seed: {len(items)} vs {len(baseline)}")
    if not items or any(len(x) == 0 for arm in arms for x in arm):
        raise ValueError("every seed needs at least one item")
    rng = np.random.default_rng(seed)
    n_seeds = len(items)

    def seed_means(arm: list[np.ndarray], picks: np.ndarray) -> np.ndarray:  # (n_boot, n_seeds)
        out = np.empty(picks.shape)
        for j in range(n_seeds):
            for s in np.unique(picks[:, j]):
                rows = picks[:, j] == s
                x = np.asarray(arm[s], dtype=float)
                if np.isin(x, (0.0, 1.0)).all():  # binary items: resampled count ~ Binomial(n, p)
                    out[rows, j] = rng.binomial(len(x), x.mean(), size=rows.sum()) / len(x)
                else:
                    idx = rng.integers(0, len(x), size=(rows.sum(), len(x)))
                    out[rows, j] = x[idx].mean(axis=1)
        return out

    picks = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    boots = seed_means(arms[0], picks).mean(axis=1)
    estimate = float(np.mean([np.mean(x) for x in arms[0]]))
    if baseline is not None:
        boots = boots - seed_means(arms[1], picks).mean(axis=1)
        estimate -= float(np.mean([np.mean(x) for x in arms[1]]))
    low, high = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2])
    return estimate, float(low), float(high)


# ---------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Comparison:
    """treatment - baseline on one metric over the paired seeds, and its verdict."""

    metric: MetricSpec
    treatment: str
    baseline: str
    seeds: tuple[int, ...]
    deltas: tuple[float, ...]
    ci95: tuple[float, float]
    ci90: tuple[float, float]
    p_t: float
    p_sign_flip: float
    primary: bool = True
    p_adjusted: float = math.nan  # Holm-adjusted for secondary comparisons; p for the primary
    verdict: str = "inconclusive"
    reason: str = ""
    tested: bool = True  # False: registered to be described only (no verdict, not in Holm)

    @property
    def n(self) -> int:
        return len(self.deltas)

    @property
    def mean(self) -> float:
        return float(np.mean(self.deltas)) if self.deltas else math.nan

    @property
    def p(self) -> float:
        """The comparison's p-value: the larger of the t-test's and the sign-flip test's."""
        return max(self.p_t, self.p_sign_flip)

    @property
    def within_margin(self) -> bool:
        """Whether the 90 % interval lies inside ±margin (two one-sided tests)."""
        low, high = self.ci90
        return self.n >= 2 and -self.metric.margin < low and high < self.metric.margin

    def effect(self, digits: int = 2) -> str:
        """``Δ -1.23 [-2.01, -0.45]`` (95 % t interval)."""
        if not self.deltas:
            return "no paired seeds"
        if self.n < 2:
            return f"Δ {self.mean:+.{digits}f} (one seed: no interval)"
        low, high = self.ci95
        return f"Δ {self.mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def compare(treatment: Mapping[int, float], baseline: Mapping[int, float], metric: MetricSpec,
            names: tuple[str, str] = ("treatment", "baseline"), primary: bool = True,
            tested: bool = True) -> Comparison:
    """The paired statistics of one comparison (its verdict is set by ``decide``)."""
    seeds, d = paired_deltas(treatment, baseline)
    return Comparison(metric=metric, treatment=names[0], baseline=names[1], seeds=tuple(seeds),
                      deltas=tuple(float(x) for x in d), ci95=t_interval(d, 0.95),
                      ci90=t_interval(d, 0.90), p_t=t_pvalue(d), p_sign_flip=sign_flip_pvalue(d),
                      primary=primary, tested=tested)


def verdict(c: Comparison, p_adjusted: float, alpha: float = 0.05) -> tuple[str, str]:
    """(verdict, reason) of one comparison given its (adjusted) p-value."""
    m = c.metric
    if not c.tested:
        return DESCRIBED, f"n = {c.n}: registered to be described, not tested"
    if c.n < MIN_VERDICT_PAIRS:
        return DESCRIBED, f"n = {c.n} < {MIN_VERDICT_PAIRS} paired seeds: no verdict"
    if p_adjusted < alpha:
        improves = c.mean < 0 if m.better == "lower" else c.mean > 0
        extra = f"; Δ within ±{m.margin:g}" if c.within_margin else ""
        return ("better" if improves else "worse"), f"p = {p_adjusted:.3g} < {alpha:g}{extra}"
    if c.within_margin:
        return "equivalent", f"90 % interval inside ±{m.margin:g}"
    return "inconclusive", f"p = {p_adjusted:.3g}; 90 % interval not inside ±{m.margin:g}"


def decide(comparisons: Sequence[Comparison], alpha: float = 0.05) -> list[Comparison]:
    """Verdicts: the primary comparisons at ``alpha``; the tested secondary ones Holm-adjusted
    together; the described ones get no verdict."""
    secondary = [i for i, c in enumerate(comparisons) if not c.primary and c.tested]
    adjusted = dict(zip(secondary, holm([comparisons[i].p for i in secondary])))
    out = []
    for i, c in enumerate(comparisons):
        p_adj = adjusted.get(i, c.p)
        word, reason = verdict(c, p_adj, alpha)
        out.append(replace(c, p_adjusted=p_adj, verdict=word, reason=reason))
    return out


@dataclass(frozen=True)
class PaperEffect:
    """The one-sided test of the paper's effect δ (in our metric) against our paired Δ."""

    delta: float
    p: float  # the larger of the one-sided t-test's and sign-flip test's p
    n: int

    def excluded(self, alpha: float = 0.05) -> bool:
        return self.n >= MIN_VERDICT_PAIRS and self.p < alpha

    def format(self, alpha: float = 0.05, digits: int = 2) -> str:
        head = f"δ_paper {self.delta:+.{digits}g}: "
        if self.n < MIN_VERDICT_PAIRS:
            return head + f"not tested (n = {self.n} < {MIN_VERDICT_PAIRS})"
        if self.excluded(alpha):
            return head + f"**the paper's effect is excluded at this scale** (one-sided p = {self.p:.3g})"
        return head + f"not excluded (one-sided p = {self.p:.3g})"


def paper_effect_test(deltas: Sequence[float], delta: float, n_resamples: int = 200_000,
                      seed: int = 0) -> PaperEffect:
    """One-sided test of H0 "the mean Δ is at least ``delta`` in its direction" against H1 "it
    is smaller": a t-test and a sign-flip test on s·(Δ - δ), s = sign(δ); p is the larger."""
    d = np.asarray(deltas, dtype=float)
    n = len(d)
    if n < 2 or delta == 0:
        return PaperEffect(delta, 1.0, n)
    x = math.copysign(1.0, delta) * (d - delta)  # H1: mean(x) < 0
    if np.std(x) == 0:
        p_t = 0.0 if x[0] < 0 else 1.0
    else:
        p_t = float(stats.ttest_1samp(x, 0.0, alternative="less").pvalue)
    p_sf = sign_flip_pvalue(x, n_resamples, seed, alternative="less")
    return PaperEffect(delta, max(p_t, p_sf), n)


@dataclass(frozen=True)
class Successes:
    """How many seeds of each arm reached a metric's success threshold."""

    k_treatment: int
    n_treatment: int
    k_baseline: int
    n_baseline: int
    p_fisher: float  # every seed of each arm, as independent samples
    p_mcnemar: float  # the paired seeds only: the test that matches the paired design
    median_delta: float  # median of the paired Δ (NaN without paired seeds)

    def format(self) -> str:
        def arm(k: int, n: int) -> str:
            low, high = wilson_interval(k, n)
            return f"{k}/{n} [{low:.2f}, {high:.2f}]" if n else "0/0"
        return (f"{arm(self.k_treatment, self.n_treatment)} vs {arm(self.k_baseline, self.n_baseline)} "
                f"seeds succeeded (paired McNemar p = {self.p_mcnemar:.3g}, Fisher p = {self.p_fisher:.3g}); "
                f"median Δ {self.median_delta:+.2f}")


def successes(treatment: Mapping[int, float], baseline: Mapping[int, float], metric: MetricSpec) -> Successes:
    """Seeds succeeded per arm (every seed of each arm) with Fisher's test, McNemar's test over
    the paired seeds, and the median paired Δ."""
    kt = sum(metric.succeeded(v) for v in treatment.values())
    kb = sum(metric.succeeded(v) for v in baseline.values())
    paired, d = paired_deltas(treatment, baseline)
    won = [metric.succeeded(treatment[s]) for s in paired], [metric.succeeded(baseline[s]) for s in paired]
    only_t = sum(t and not b for t, b in zip(*won))
    only_b = sum(b and not t for t, b in zip(*won))
    return Successes(kt, len(treatment), kb, len(baseline),
                     fisher_pvalue(kt, len(treatment), kb, len(baseline)), mcnemar_pvalue(only_t, only_b),
                     float(np.median(d)) if len(d) else math.nan)
