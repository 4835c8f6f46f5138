"""The Claims section that opens results/README.md: per claim of the paper (conf/claims.yaml),
the paper's statement and number, our experiment, the paired effect with its interval, n paired
seeds and the verdict (tape/report/paired.py), and the command that runs it. A claim without
paired runs says "not run" and shows its command. README.md gets the headline table and a
three-line legend; results/claims_detail.md the notes, every comparison, every arm, the figures.

Arms are found with the same run-finding code as every other section (``find_runs`` and
``group_by``: the newest finished run per seed), restricted to one experiment, one PE and the
config values the arm names.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Mapping

import numpy as np

from tape.report.claim_figures import claim_figure, flops_figure, validation_curve
from tape.report.claim_registry import Arm, Claim, ClaimsConfig, Controls, Pair, load_claims
from tape.report.document import Context, Figure, Section, figure_markdown, files_line
from tape.report.groups import NOT_RUN, group_by
from tape.report.paired import (DESCRIBED, MIN_VERDICT_PAIRS, Comparison, MetricSpec, PaperEffect, compare,
                                decide, paper_effect_test, successes)
from tape.report.provenance import provenance_brief, provenance_line
from tape.report.runs import Run
from tape.report.settings import NOT_SETTINGS, describe, differences
from tape.report.tables import Table, to_markdown


def arm_finished(runs: list[Run], arm: Arm, experiment: str, require: Mapping[str, Any],
             seeds: Collection[int] | None = None) -> list[Run]:
    """The newest finished run per seed of ``arm`` in ``experiment`` (only ``seeds`` when given)."""
    mine = [r for r in runs if r.experiment == experiment and arm.matches(r, require)
            and (seeds is None or r.seed in seeds)]
    group = group_by(mine, lambda r: arm.name).get(arm.name)
    return [] if group is None else group.finished


def arm_values(runs: list[Run], arm: Arm, experiment: str, metric: MetricSpec,
               require: Mapping[str, Any], seeds: tuple[int, ...] | None = None
               ) -> tuple[dict[int, float], list[Run]]:
    """{seed: value} of the newest finished run per seed of ``arm`` in ``experiment`` (only
    ``seeds`` when given), and those runs."""
    finished = arm_finished(runs, arm, experiment, require, seeds)
    values = {r.seed: v for r in finished if (v := arm.metric(metric).value(r.metrics or {})) is not None}
    return values, [r for r in finished if r.seed in values]


def is_valid(run: Run, valid: Mapping[str, float], arm: Arm | None = None) -> bool:
    """Whether a run reached every threshold of its claim's ``valid`` (e.g. in-distribution
    accuracy >= 95 %: a model that has not learnt the task says nothing about generalisation),
    with ``arm``'s method in keys that name one."""
    metrics = run.metrics or {}
    keys = {(arm.key(k) if arm else k): v for k, v in valid.items()}
    return all(isinstance(metrics.get(k), (int, float)) and float(metrics[k]) >= v for k, v in keys.items())


@dataclass
class ClaimResult:
    """A claim's comparisons, primary first, with verdicts, and the runs they used."""

    claim: Claim
    comparisons: list[Comparison]
    values: dict[str, dict[int, float]]
    runs: list[Run]
    unpaired: int = 0  # finished runs of the claim's arms that lack the required values (paired_init)
    arm_runs: dict[str, list[Run]] = field(default_factory=dict)  # the runs each arm used
    invalid: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # per comparison: seeds left out
    nonfinite: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # ... whose metric is NaN or inf
    # per comparison, the seeds left out for a positive control (claim ``controls``), each with
    # the controls it lacks, "<arm> at <setting>": a control run below ``controls.valid``...
    control_failed: dict[tuple[str, str], dict[int, list[str]]] = field(default_factory=dict)
    # ... or none finished (counted only for seeds whose own runs are valid, and not failed)
    control_missing: dict[tuple[str, str], dict[int, list[str]]] = field(default_factory=dict)
    # per arm, its control runs by control ("task.scratchpad=interleaved": runs)
    control_runs: dict[str, dict[str, list[Run]]] = field(default_factory=dict)
    # per arm, its own seeds left out of every average: {seed: why} (invalid, or a control failed / not run)
    left_out: dict[str, dict[int, str]] = field(default_factory=dict)


def evaluate_claim(claim: Claim, cfg: ClaimsConfig, runs: list[Run]) -> ClaimResult:
    metric = cfg.metrics[claim.metric]
    require = {**cfg.require, **claim.settings}  # what a run of any of the claim's arms must have
    values, used, arm_runs, invalid, failed, missing, control_runs = {}, [], {}, {}, {}, {}, {}
    nonfinite: dict[str, set[int]] = {}
    for name in claim.arm_names:
        values[name], found = arm_values(runs, cfg.arms[name], claim.experiment, metric, require,
                                         claim.planned_seeds)
        failed[name], missing[name], control_runs[name] = control_results(claim, cfg.arms[name], runs, require,
                                                                          set(values[name]))
        # a seed past the arm's plan (a described arm's run made for another claim) is read only
        # with its controls: the plan never asked for them, so their absence is not a loss
        unplanned = set(missing[name]) - set(claim.arm_seeds(name, cfg.describe_seeds))
        values[name] = {s: v for s, v in values[name].items() if s not in unplanned}
        missing[name] = {s: why for s, why in missing[name].items() if s not in unplanned}
        found = [r for r in found if r.seed not in unplanned]
        used += found
        arm_runs[name] = found
        nonfinite[name] = {s for s, v in values[name].items() if not math.isfinite(v)}  # e.g. a diverged run
        invalid[name] = {r.seed for r in found if not is_valid(r, claim.valid, cfg.arms[name])} - nonfinite[name]
        used += [r for rs in control_runs[name].values() for r in rs]
    tested = 1 + len(claim.secondary)
    pairs = list(enumerate((claim.primary, *claim.secondary, *claim.describe)))
    left_out = {name: {**{s: "a control not run" for s in missing[name]},  # per arm: {seed: why}
                       **{s: "a control failed" for s in failed[name]},
                       **{s: "invalid" for s in invalid[name]},
                       **{s: f"{metric.key} not finite" for s in nonfinite[name]}}
                for name in claim.arm_names}
    out = {name: set(seeds) for name, seeds in left_out.items()}
    comparisons = [compare(_without(values[t], out[t] | out[b]), _without(values[b], out[t] | out[b]),
                           metric, (t, b), primary=i == 0, tested=i < tested)
                   for i, (t, b) in pairs]
    dropped, not_finite, control_failed, control_missing = {}, {}, {}, {}
    for _, (t, b) in pairs:  # each seed left out once: not finite, else invalid, else a control failed, else missing
        both = set(values[t]) & set(values[b])
        not_finite[t, b] = sorted((nonfinite[t] | nonfinite[b]) & both)
        dropped[t, b] = sorted((invalid[t] | invalid[b]) & both - set(not_finite[t, b]))
        kept = both - set(dropped[t, b]) - set(not_finite[t, b])
        control_failed[t, b] = _lacking(sorted(kept), failed, (t, b), cfg)
        control_missing[t, b] = _lacking(sorted(kept - set(control_failed[t, b])), missing, (t, b), cfg)
    arms = [cfg.arms[name] for name in values]
    unpaired = sum(1 for r in runs if r.finished and r.experiment == claim.experiment
                   and any(a.matches(r, claim.settings) for a in arms)
                   and not any(a.matches(r, require) for a in arms))
    decided = decide(comparisons, cfg.alpha)
    if claim.exploratory:  # a reading chosen after seeing results: no verdict word until confirmed
        decided = [replace(c, verdict=DESCRIBED, reason=f"exploratory, p = {c.p_adjusted:.3g}: the reading was "
                           "chosen after seeing earlier runs; a claim on fresh seeds confirms it or not")
                   if c.n >= MIN_VERDICT_PAIRS else c for c in decided]
    return ClaimResult(claim, decided, values, used, unpaired, arm_runs, dropped, not_finite, control_failed,
                       control_missing, control_runs, left_out)


def control_results(claim: Claim, arm: Arm, runs: list[Run], require: Mapping[str, Any], seeds: set[int]
                    ) -> tuple[dict[int, list[str]], dict[int, list[str]], dict[str, list[Run]]]:
    """An arm's positive controls at ``seeds``: {seed: the settings whose control run failed
    ``controls.valid``}, {seed: the settings with no finished control run}, and the control runs
    by setting."""
    failed: dict[int, list[str]] = {}
    missing: dict[int, list[str]] = {}
    found: dict[str, list[Run]] = {}
    for setting in claim.controls.settings if claim.controls else ():
        control = replace(arm, match={**arm.match, **setting})
        done = {r.seed: r for r in arm_finished(runs, control, claim.experiment, {**require, **setting}, seeds)}
        found[Controls.label(setting)] = sorted(done.values(), key=lambda r: r.seed)
        for seed in sorted(seeds):
            if seed not in done:
                missing.setdefault(seed, []).append(Controls.label(setting))
            elif not is_valid(done[seed], claim.controls.valid):
                failed.setdefault(seed, []).append(Controls.label(setting))
    return failed, missing, found


def _unlike(result: ClaimResult, c: Comparison, cfg: ClaimsConfig) -> list[tuple[dict[str, Any], list[int]]]:
    """The paired seeds whose two runs differ in more than the PE and the arms' own keys
    (NOT_SETTINGS aside), grouped by the values that differ (first's vs second's); [] when like for like."""
    runs = {name: {r.seed: r for r in result.arm_runs.get(name, [])} for name in (c.treatment, c.baseline)}
    ignore = (*NOT_SETTINGS, "pe", *cfg.arms[c.treatment].match, *cfg.arms[c.baseline].match)
    by_diff: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for seed in c.seeds:
        t, b = runs[c.treatment].get(seed), runs[c.baseline].get(seed)
        if t is not None and b is not None and (diff := differences(t.config(), b.config(), ignore)):
            theirs = differences(b.config(), t.config(), ignore)
            both = {k: f"{v} vs {theirs[k]}" for k, v in diff.items()}  # treatment's vs baseline's
            by_diff.setdefault(repr(sorted(both.items())), (both, []))[1].append(seed)
    return list(by_diff.values())


def _lacking(seeds: list[int], by_arm: Mapping[str, Mapping[int, list[str]]], pair: Pair,
             cfg: ClaimsConfig) -> dict[int, list[str]]:
    """{seed: ["<arm> at <setting>", ...]} of the ``seeds`` where an arm of ``pair`` lacks a control."""
    out: dict[int, list[str]] = {}
    for seed in seeds:
        for name in dict.fromkeys(pair):
            out.setdefault(seed, []).extend(f"{cfg.arms[name].title} at {s}" for s in by_arm[name].get(seed, []))
    return {seed: what for seed, what in out.items() if what}


def _without(values: Mapping[int, float], seeds: set[int]) -> dict[int, float]:
    return {s: v for s, v in values.items() if s not in seeds}


def _digits(metric: MetricSpec) -> int:
    """Decimals that resolve a tenth of the metric's margin (nats: 3; points: 2)."""
    return 3 if metric.margin < 0.1 else 2


def paper_effect(result: ClaimResult, c: Comparison) -> PaperEffect | None:
    """The one-sided test of the paper's effect on ``c`` (None when not registered for it)."""
    claim = result.claim
    if claim.paper_delta is None or (c.treatment, c.baseline) not in claim.paper_on or not c.n:
        return None
    return paper_effect_test(c.deltas, claim.paper_delta)


def _verdict(result: ClaimResult, c: Comparison, cfg: ClaimsConfig, first: bool) -> tuple[str, str]:
    """(effect, verdict) cells of one comparison."""
    claim = result.claim
    metric = cfg.metrics[claim.metric]
    pair = (c.treatment, c.baseline)
    dropped = result.invalid.get(pair, [])
    failed, missing = result.control_failed.get(pair, {}), result.control_missing.get(pair, {})
    not_finite = result.nonfinite.get(pair, [])
    reasons = [f"{len(not_finite)} seed(s) left out, {metric.key} not finite (NaN or inf: "
               f"{', '.join(str(s) for s in not_finite)})"] if not_finite else []
    reasons += [f"{len(dropped)} seed(s) invalid, left out ({', '.join(str(s) for s in dropped)}: "
                + " or ".join(f"{k} < {v:g}" for k, v in claim.valid.items()) + ")"] if dropped else []
    if failed:
        assert claim.controls is not None
        reasons.append(f"{len(failed)} seed(s) left out, a positive control failed ("
                       + " or ".join(f"{k} < {v:g}" for k, v in claim.controls.valid.items()) + "): "
                       + "; ".join(f"{s}: {', '.join(what)}" for s, what in failed.items()))
    if missing:
        reasons.append(f"{len(missing)} seed(s) left out, a positive control not run: "
                       + "; ".join(f"{s}: {', '.join(what)}" for s, what in missing.items()))
    if unlike := _unlike(result, c, cfg):
        reasons.append("**not like for like**: the arms' runs also differ (first vs second) in "
                       + "; ".join(f"{describe(d)} at seed(s) {', '.join(map(str, seeds))}" for d, seeds in unlike))
    why = "; ".join(reasons)
    dropped = [*not_finite, *dropped, *failed, *missing]
    if c.n == 0 and dropped:
        return "no valid pair", f"**no verdict**: {why}"
    if c.n == 0:  # the command once per claim: on its first row
        verdict = f"{NOT_RUN}: run `{claim.command}`" if first else f"{NOT_RUN} (the claim's command is on its first row)"
        if result.unpaired:
            verdict += (f" ({result.unpaired} finished run(s) of these arms lack "
                        f"{', '.join(f'{k}={v}' for k, v in cfg.require.items())}: not pairs)")
        return NOT_RUN, verdict
    effect = c.effect(_digits(metric))
    if metric.success is not None:
        effect += "; " + successes(result.values[c.treatment], result.values[c.baseline], metric).format()
    if c.verdict == DESCRIBED:
        return effect, f"no verdict, described ({c.reason})" + (f"; {why}" if why else "")
    return effect, f"**{c.verdict}** ({c.reason})" + (f"; {why}" if why else "")


def _planned(result: ClaimResult, c: Comparison, cfg: ClaimsConfig) -> str:
    """``n (planned p)`` paired seeds; a recipe scored inside every run is planned at every seed."""
    every_seed = c.tested or cfg.arms[c.treatment].method
    planned = result.claim.seeds if every_seed else min(cfg.describe_seeds, result.claim.seeds)
    return f"{c.n} (planned {planned})"


def _row(result: ClaimResult, c: Comparison, cfg: ClaimsConfig, first: bool) -> list[Any]:
    claim = result.claim
    metric = cfg.metrics[claim.metric]
    what = f"{cfg.arms[c.treatment].title} - {cfg.arms[c.baseline].title}"
    effect, verdict = _verdict(result, c, cfg, first)
    test = paper_effect(result, c)
    head = [f"{claim.id}: {claim.title}", claim.paper] if first else ["", ""]
    return [*head, f"{claim.experiment}, {metric.label}", what, effect, _planned(result, c, cfg), verdict,
            test.format(cfg.alpha, _digits(metric)) if test else ""]


def answer(result: ClaimResult, cfg: ClaimsConfig) -> str:
    """The claim's answer at this scale in one line: the primary verdict in words, and whether
    the paper's effect is excluded."""
    c = result.comparisons[0]
    arms = cfg.arms
    first, second = arms[c.treatment].title, arms[c.baseline].title
    if c.n == 0:
        return ("not answered: no valid pair of runs" if result.runs
                else f"not run yet: `{result.claim.command}`")
    words = {"better": f"{first} better than {second}", "worse": f"{first} worse than {second}",
             "equivalent": f"{first} and {second} equivalent within ±{c.metric.margin:g}",
             "inconclusive": f"no difference shown between {first} and {second}, and no equivalence",
             DESCRIBED: f"not answered yet ({c.reason})"}
    line = words.get(c.verdict, c.verdict)
    tests = [(pair, paper_effect_test(comp.deltas, result.claim.paper_delta))
             for comp in result.comparisons for pair in [(comp.treatment, comp.baseline)]
             if result.claim.paper_delta is not None and pair in result.claim.paper_on and comp.n]
    excluded = [f"{arms[t].title} - {arms[b].title}" for (t, b), e in tests if e.excluded(cfg.alpha)]
    if any(e.n >= MIN_VERDICT_PAIRS for _, e in tests):
        line += ("; the paper's effect is excluded for " + ", ".join(excluded) if excluded
                 else "; the paper's effect is not excluded")
    elif tests:  # below the pairs a verdict needs, as in the comparison's own row
        line += f"; the paper's effect is not tested yet (n < {MIN_VERDICT_PAIRS})"
    found = [f"{arms[s.treatment].title} {s.verdict} than {arms[s.baseline].title}"
             for s in result.comparisons[1:] if s.tested and s.verdict in ("better", "worse")]
    if found:
        line += "; secondary: " + ", ".join(found)
    return line


STEPS_TO = "steps_to_99"  # a derived metric: the first validation step at >= 99 % exact match


def steps_to(run: Run, threshold: float = 0.99, key: str = "val/exact_match") -> float | None:
    """The training steps done at the first validation whose ``key`` reached ``threshold``
    (csv/metrics.csv of the run; validation is in-distribution), or None when it never did or
    nothing was logged. Its resolution is the run's val_check_interval."""
    reached = [step for step, value in validation_curve(run, key).items() if value >= threshold]
    return float(min(reached)) if reached else None


def _arm_runs(result: ClaimResult, arm: str) -> list[Run]:
    """The runs an arm contributed to the claim, by seed, without the seeds it left out."""
    left_out = result.left_out.get(arm, {})
    return sorted((r for r in result.arm_runs.get(arm, []) if r.seed not in left_out), key=lambda r: r.seed)


def _seeds_cell(result: ClaimResult, arm: str, runs: list[Run]) -> str:
    """The seeds an arm's row averages, then the ones it left out and why."""
    cell = ", ".join(str(r.seed) for r in runs) or "none"
    named = [f"{seed} {why}" for seed, why in sorted(result.left_out.get(arm, {}).items())]
    return cell + (f" (left out: {', '.join(named)})" if named else "")


def _spread(values: list[float], digits: int = 2) -> str:
    """``mean ± sd [min, max]`` over seeds (sd with ddof 1; one seed: its value)."""
    if not values:
        return "-"
    arr = np.asarray(values, dtype=float)
    if len(arr) == 1:
        return f"{arr[0]:.{digits}f}"
    return (f"{arr.mean():.{digits}f} ± {arr.std(ddof=1):.{digits}f} "
            f"[{arr.min():.{digits}f}, {arr.max():.{digits}f}]")


def _steps_cell(runs: list[Run]) -> str:
    steps = [steps_to(r) for r in runs]
    reached = sorted(s for s in steps if s is not None)
    if not runs:
        return "-"
    if not reached:
        return f"never (0/{len(runs)})"
    return f"median {np.median(reached):.0f} ({len(reached)}/{len(runs)} reached)"


ARM_COLUMNS = ["claim", "arm", "seeds", "the claim's metric: mean ± sd [min, max]",
               "beside it (mean ± sd [min, max] over the same seeds)"]


def arm_table_rows(result: ClaimResult, cfg: ClaimsConfig) -> list[list[str]]:
    """Per arm of one claim: the seeds, the claim's metric and its "also" metrics (mean ± sd
    [min, max] over seeds), so in-distribution numbers, learning speed and cost sit beside the
    compared metric."""
    rows = []
    claim = result.claim
    for name in claim.arm_names:
        runs = _arm_runs(result, name)
        if not result.arm_runs.get(name):
            continue
        cells = []
        for key in claim.also:
            if key == STEPS_TO:
                cells.append(f"{key}: {_steps_cell(runs)}")
                continue
            key = cfg.arms[name].key(key)
            vals = [float(r.metrics[key]) for r in runs
                    if isinstance((r.metrics or {}).get(key), (int, float))]
            if vals:
                cells.append(f"{key}: {_spread(vals, 3 if abs(np.mean(vals)) < 1 else 2)}")
        metric_digits = 3 if cfg.metrics[claim.metric].margin < 0.1 else 2
        rows.append([claim.id, cfg.arms[name].title, _seeds_cell(result, name, runs),
                     _spread([result.values[name][r.seed] for r in runs], metric_digits), "; ".join(cells)])
    return rows


def arm_table(rows: list[list[str]]) -> Table:
    """Every claim's arms over their seeds (rows of arm_table_rows)."""
    return Table(name="claims_arms", title="Claims: every arm over its seeds", columns=ARM_COLUMNS,
                 rows=rows, notes=[
                     f"{STEPS_TO}: the first validation step (in-distribution, every "
                     "val_check_interval steps) at >= 99 % exact match, from the run's csv/metrics.csv.",
                     "e_move_last: ||E_last - E_0|| / ||E_0|| on 8 held-out blocks (how far TAPE's "
                     "E moved from its RoPE table by the last layer); e_update_attn_mean / "
                     "e_update_mlp_mean: the mean per-layer share each update adds "
                     "(tape/metrics/e_movement.py).",
                     "train_time_s is wall time on a shared machine (two runs at once): a cost "
                     "indication, not a benchmark (results/efficiency.md has the paired timing)."])


CARRIED = "carried over from the previous render: no record of its runs here yet; "


def previous_rows(out_dir: Path, name: str) -> list[dict[str, str]]:
    """The rows of the previous render's tables/<name>.csv ([] when there is none)."""
    try:
        with open(out_dir / "tables" / f"{name}.csv", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def claim_rows(rows: list[dict[str, str]], claim_id: str) -> list[dict[str, str]]:
    """A claim's rows of a claims table: from the row naming it to the next claim's row."""
    out, mine = [], False
    for row in rows:
        if row.get("claim"):
            mine = row["claim"].split(":")[0] == claim_id
        if mine:
            out.append(row)
    return out


def _has_numbers(rows: list[dict[str, str]], title: str) -> bool:
    """Whether a claim's previous rows are worth carrying: the same claim (its title; a claim
    redefined since is not carried) with at least one number (a "not run" row is not)."""
    return bool(rows) and rows[0]["claim"] == title and any(
        row.get("effect Δ [95 % CI]", NOT_RUN) != NOT_RUN for row in rows)


def carried_rows(previous: list[dict[str, str]], columns: list[str], mark: str) -> list[list[str]]:
    """``previous`` rows laid out in ``columns`` (by name; a column they lack is empty), the
    first one's ``mark`` column prefixed with CARRIED once (a carried row keeps its note)."""
    rows = [[row.get(c, "") for c in columns] for row in previous]
    if rows and mark in columns:
        i = columns.index(mark)
        if not rows[0][i].startswith(CARRIED):
            rows[0][i] = CARRIED + rows[0][i]
    return rows


DETAIL_FILE = "claims_detail.md"


@dataclass
class ClaimsSection(Section):
    """The Claims section: README.md gets its headline table (tables[0]) and ``legend``;
    DETAIL_FILE the headline's notes and provenance, the other tables and the figures."""

    legend: list[str] = field(default_factory=list)

    def to_markdown(self) -> str:
        """The README part: the headline table without its notes, the legend, its files."""
        headline = replace(self.tables[0], notes=self.legend, provenance="")
        return "\n".join([f"## {self.title}", "", to_markdown(headline), files_line(headline)])

    def detail_markdown(self) -> str:
        """DETAIL_FILE: the headline table's notes and provenance, every other table, the figures."""
        headline, *rest = self.tables
        parts = ["# Claims in detail", "",
                 "The rest of the Claims section of [README.md](README.md), rendered with it from the "
                 "same runs: the notes of its table (margins, seeds, the paper's effect, each claim's "
                 "note and command), every comparison, every arm over its seeds, and each claim's figures.",
                 "", "## Notes on the Claims table", "", *(f"- {note}" for note in headline.notes),
                 f"- Provenance: {headline.provenance}", ""]
        for table in rest:
            parts += [to_markdown(table, heading_level=2), files_line(table)]
        if self.figures:
            parts += ["## Figures", "", *(figure_markdown(fig) for fig in self.figures)]
        return "\n".join(parts)


def legend(cfg: ClaimsConfig, runs: list[Run], ctx: Context) -> list[str]:
    """The three lines under the README's Claims table."""
    return [
        "Δ = first arm - second arm over paired seeds (one seed: the same data order and initial "
        "weights), with its 95 % t interval; a difference counts when the interval excludes 0 and an "
        f"exact sign-flip test agrees (p < {cfg.alpha:g}; secondary comparisons Holm-corrected); "
        "*equivalent* when the 90 % interval lies inside ± the metric's margin; else *inconclusive*; "
        "an exploratory reading is described, without a verdict word.",
        "The paper's column is **the paper's** statement and numbers, at the paper's scale; every "
        "other column is ours, at the scale in the experiment's name.",
        f"Every comparison, every arm over its seeds, each claim's note, command and figures: "
        f"[{DETAIL_FILE}]({DETAIL_FILE}). Provenance: {provenance_brief(runs, ctx.stamp, ctx.records_link)}.",
    ]


def build(ctx: Context, cfg: ClaimsConfig | None = None) -> ClaimsSection:
    """The Claims section: one row per claim (its primary comparison), then every comparison."""
    cfg = cfg or load_claims()
    results = [evaluate_claim(claim, cfg, ctx.runs) for claim in cfg.claims]
    columns = ["claim", "the paper's statement and number (paper)", "our experiment and metric",
               "comparison (Δ = first - second)", "effect Δ [95 % CI]", "n paired seeds (planned)",
               "verdict", "the paper's effect in our metric (δ_paper), one-sided test"]
    headline_columns = ["claim", "question", "answer at this scale", "primary comparison: Δ [95 % CI]",
                        "n paired seeds (planned)", "the paper's statement and number (paper)"]
    before = {name: previous_rows(ctx.out_dir, name) for name in ("claims", "claims_all", "claims_arms")}
    carried = {r.claim.id for r in results if ctx.carry_over and not r.runs
               and _has_numbers(claim_rows(before["claims_all"], r.claim.id), f"{r.claim.id}: {r.claim.title}")}
    headline, every, arm_rows = [], [], []
    for r in results:
        if r.claim.id in carried:
            headline += carried_rows(claim_rows(before["claims"], r.claim.id)[:1], headline_columns,
                                     "answer at this scale")
            every += carried_rows(claim_rows(before["claims_all"], r.claim.id), columns, "verdict")
            arm_rows += [[row[c] for c in ARM_COLUMNS] for row in before["claims_arms"] if row["claim"] == r.claim.id]
            continue
        headline.append([f"{r.claim.id}: {r.claim.title}", r.claim.question, answer(r, cfg),
                         _verdict(r, r.comparisons[0], cfg, True)[0], _planned(r, r.comparisons[0], cfg), r.claim.paper])
        every += [_row(r, c, cfg, i == 0) for i, c in enumerate(r.comparisons)]
        arm_rows += arm_table_rows(r, cfg)
    notes = [
        "Δ = first arm - second arm over seeds run by both (paired: one seed fixes the data order "
        "and the shared initial weights); 95 % t interval. A difference counts when the interval "
        "excludes 0 and an exact sign-flip test agrees (p < "
        f"{cfg.alpha:g}; secondary comparisons Holm-corrected); *equivalent* only when the 90 % "
        "interval lies inside ± the metric's margin; else *inconclusive*. Margins: "
        + "; ".join(f"{m.label} ±{m.margin:g} ({m.better} is better)" for m in cfg.metrics.values()) + ".",
        "Seeds are planned per claim before its runs (conf/claims.yaml `seeds`): with k Holm-corrected "
        "secondary comparisons a difference can pass only from n >= log2(2k/alpha) pairs (6 for a "
        "single comparison, 7 for 2-3, 8 for 4-6, 9 for 7-12); a comparison with fewer than 6 pairs, "
        f"or registered under `describe` (run at {cfg.describe_seeds} seeds), is described, never given "
        "a verdict. Each claim reads only its planned seeds.",
        "The paper's effect, translated into our metric (conf/claims.yaml `paper_effect`), is tested "
        "one-sided (H0: our Δ is at least the paper's δ in its direction; t-test and sign-flip test, "
        "the larger p): *excluded at this scale* when p < " f"{cfg.alpha:g}. "
        + " ".join(f"{r.claim.id}: {r.claim.paper_translation}" for r in results if r.claim.paper_translation),
        "The paper's column is **the paper's** statement and numbers (tape-spec E), at the paper's "
        "scale; every other column is ours, at the scale in the experiment's name.",
        *(f"{r.claim.id}: {r.claim.note}." for r in results if r.claim.note),
        *(f"{r.claim.id}: positive controls (conf/claims.yaml `controls`): a seed's pair counts only when "
          f"each arm's run of that seed also finished under "
          + " and under ".join(f"`{Controls.label(s)}`" for s in r.claim.controls.settings)
          + " with " + " and ".join(f"{k} >= {v:g}" for k, v in r.claim.controls.valid.items())
          + "; a seed left out names the control that failed or was not run (claims_all's verdict)."
          for r in results if r.claim.controls),
        "All of them: `make reproduce-table` (PROFILE=cpu runs every claim's plan; pipelines/reproduce.py). "
        "Per claim: " + "; ".join(f"{r.claim.id}: `{r.claim.command}`" for r in results) + ".",
    ]
    runs = list({run.path: run for r in results for run in r.runs}.values())  # an arm may serve two claims
    tables = [
        Table(name="claims", title="Claims: the paper's claims, tested at laptop scale",
              columns=headline_columns, rows=headline, notes=notes, provenance=provenance_line(runs, ctx.stamp)),
        Table(name="claims_all", title="Claims: every comparison (primary first, then secondary)",
              columns=columns, rows=every, provenance=provenance_line(runs, ctx.stamp)),
        arm_table(arm_rows),
    ]
    if carried:
        tables[0].notes.append("Carried over from the previous render, unchanged, because no record of "
                               "their runs is in the records rendered here: " + ", ".join(sorted(carried))
                               + " (their figures too).")
    figures = []
    for r in results:
        if r.claim.id in carried:
            for name in (f"claim_{r.claim.id.lower()}.png", f"claim_{r.claim.id.lower()}_flops.png"):
                if (ctx.out_dir / "figures" / name).is_file():
                    figures.append(Figure(Path("figures") / name, f"Claim {r.claim.id} (carried over)"))
            continue
        arms = {cfg.arms[name].title: _arm_runs(r, name) for name in r.arm_runs}
        runs_ = [run for rs in arms.values() for run in rs]
        task = runs_[0].task if runs_ else ""
        train = _train_length(runs_, TRAIN_LENGTH_KEYS[task]) if task in TRAIN_LENGTH_KEYS else None
        controls = {f"{cfg.arms[name].title}, {label} (control)": runs
                    for name, by_setting in r.control_runs.items() for label, runs in by_setting.items()}
        methods = {cfg.arms[name].title: cfg.arms[name].method for name in r.arm_runs if cfg.arms[name].method}
        fig = claim_figure(ctx, r.claim.id, r.claim.title, arms, task, train, r.claim.metric, controls, methods)
        if fig is not None:
            figures.append(fig)
        if task == "pretrain" and (flops := flops_figure(ctx, r.claim.id, r.claim.title, arms)) is not None:
            figures.append(flops)
    return ClaimsSection(title="Claims", tables=tables, figures=figures, legend=legend(cfg, runs, ctx))


TRAIN_LENGTH_KEYS = {"addition": "max_digits", "parity": "max_bits"}  # task -> its longest training size


def _train_length(runs: list[Run], key: str) -> int | None:
    """The longest training size (task.<key>) shared by ``runs``, else None."""
    values = {(r.config().get("task") or {}).get(key) for r in runs}
    values.discard(None)
    return int(values.pop()) if len(values) == 1 else None
