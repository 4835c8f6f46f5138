"""What a claim is: conf/claims.yaml read and checked (``load_claims``) into its arms, claims and
plan (``Arm``, ``Claim``, ``ClaimsConfig``), and which runs an arm's config values select
(``has_values``). tape/report/claims.py judges and renders them; pipelines/plan.py runs them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from tape.paper import paper_number
from tape.report.paired import MetricSpec, needed_pairs
from tape.report.paper import display
from tape.report.runs import Run
from tape.report.settings import ADDED_OPTIONS

CLAIMS_FILE = Path(__file__).resolve().parents[2] / "conf" / "claims.yaml"


METHOD = "{method}"  # in a metric's keys: the arm's method (a recipe scored inside each run)


@dataclass(frozen=True)
class Arm:
    """A PE plus the resolved-config values (dotted keys) its runs must have; an arm with a
    ``method`` is one recipe of runs that score several (context extension: tape, lora, ...),
    read from the metric keys that name ``{method}``, so its seeds pair with the other recipes'
    of the same runs."""

    name: str
    pe: str
    match: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    method: str = ""

    @property
    def title(self) -> str:
        return self.label or display(self.method or self.pe)

    def matches(self, run: Run, require: Mapping[str, Any]) -> bool:
        return run.pe == self.pe and has_values(run.pe, run.config(), {**require, **self.match})

    def key(self, key: str) -> str:
        """A metrics.json key as this arm reads it (``ppl_books_512_{method}`` -> ``..._tape``)."""
        return key.replace(METHOD, self.method)

    def metric(self, spec: MetricSpec) -> MetricSpec:
        """``spec`` reading this arm's keys."""
        return replace(spec, of=tuple(self.key(k) for k in spec.of or (spec.key,))) if self.method else spec


Pair = tuple[str, str]


@dataclass(frozen=True)
class Controls:
    """A claim's positive controls: per control, the config values that replace the arm's
    (``settings``); a seed counts for an arm only when, for every control, the run of the same
    experiment, PE and seed with those values finished and reached every threshold of ``valid``."""

    settings: tuple[Mapping[str, Any], ...]
    valid: Mapping[str, float]

    @staticmethod
    def label(setting: Mapping[str, Any]) -> str:
        """``task.scratchpad=interleaved`` (several keys: comma-separated)."""
        return ", ".join(f"{k}={v}" for k, v in setting.items())


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, the experiment that tests it and its plan: the paired seeds of
    the tested comparisons (primary, then the Holm family of secondary ones), fixed before the
    runs, and the comparisons only described (fewer seeds, no verdict)."""

    id: str
    title: str
    paper: str
    experiment: str
    metric: str
    primary: Pair
    secondary: tuple[Pair, ...]
    command: str
    seeds: int = 6  # planned pairs of every tested arm: seeds first_seed .. first_seed + seeds - 1
    first_seed: int = 0
    describe: tuple[Pair, ...] = ()  # comparisons described at ClaimsConfig.describe_seeds
    question: str = ""  # what the claim asks, in one line (the headline table's first column)
    paper_delta: float | None = None  # the paper's effect in our metric (treatment - baseline)
    paper_on: tuple[Pair, ...] = ()  # the comparisons the paper's effect is tested on
    paper_translation: str = ""  # how the paper's number becomes paper_delta
    paper_numbers: Mapping[str, Any] = field(default_factory=dict)  # conf/paper_numbers.yaml key -> value
    note: str = ""
    also: tuple[str, ...] = ()  # metrics shown per arm beside the claim's (claims.yaml "also")
    valid: Mapping[str, float] = field(default_factory=dict)  # metric -> the least a valid seed has
    profiles: tuple[str, ...] = ()  # the reproduction profiles that run it (empty: every one)
    settings: Mapping[str, Any] = field(default_factory=dict)  # config values every arm's runs have
    exploratory: bool = False  # read after seeing results: described, never judged
    controls: Controls | None = None  # positive controls every arm's seed must pass to count

    @property
    def arm_names(self) -> list[str]:
        """Every arm of the claim's comparisons, primary first, each once."""
        return list(dict.fromkeys(a for pair in (self.primary, *self.secondary, *self.describe) for a in pair))

    @property
    def tested_arms(self) -> list[str]:
        """The arms of the primary and secondary comparisons (run at ``seeds`` seeds)."""
        return list(dict.fromkeys(a for pair in (self.primary, *self.secondary) for a in pair))

    @property
    def planned_seeds(self) -> tuple[int, ...]:
        """The seeds the claim reads (runs of other seeds are left out of it)."""
        return tuple(range(self.first_seed, self.first_seed + self.seeds))

    def values(self, arm: Arm, control: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The config values the runs of ``arm`` have in this claim (the arm's own ``match``
        wins over ``settings``), or those of its run under ``control`` (the control's win)."""
        return {**self.settings, **arm.match, **(control or {})}

    def arm_seeds(self, arm: str, describe_seeds: int) -> tuple[int, ...]:
        """The seeds the plan runs for ``arm``: all planned seeds when tested, else the first
        ``describe_seeds`` of them."""
        return self.planned_seeds if arm in self.tested_arms else self.planned_seeds[:describe_seeds]


@dataclass(frozen=True)
class ClaimsConfig:
    alpha: float
    metrics: Mapping[str, MetricSpec]
    arms: Mapping[str, Arm]
    claims: tuple[Claim, ...]
    require: Mapping[str, Any] = field(default_factory=dict)
    describe_seeds: int = 2  # paired seeds of the arms only described


_MISSING = object()


def lookup(config: Mapping[str, Any], dotted: str, default: Any = _MISSING) -> Any:
    """``config['a']['b']`` for ``'a.b'``; ``default`` (a sentinel that equals nothing) when absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def has_values(pe: str, config: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """Whether a run of ``pe`` with resolved ``config`` has every dotted value of ``values`` and,
    for the options ``ADDED_OPTIONS`` lists that ``values`` does not name, their former value."""
    added = ADDED_OPTIONS.get(pe, {})
    return all(lookup(config, key, added.get(key, _MISSING)) == value
               for key, value in {**added, **values}.items())


def load_claims(path: str | Path = CLAIMS_FILE) -> ClaimsConfig:
    """Read and check conf/claims.yaml; a bad entry names its key."""
    raw = yaml.safe_load(Path(path).read_text())
    metrics = {k: MetricSpec(key=k, margin=float(v["margin"]), better=v["better"],
                             label=v.get("label", k), success=v.get("success"),
                             of=tuple(v.get("of") or ()), transform=v.get("transform", ""))
               for k, v in raw["metrics"].items()}
    alpha = float(raw.get("alpha", 0.05))
    arms = {k: Arm(name=k, pe=v["pe"], match=dict(v.get("match") or {}), label=v.get("label", ""),
                   method=v.get("method", "")) for k, v in raw["arms"].items()}
    claims = []
    for c in raw["claims"]:
        pairs = [tuple(c["primary"]), *(tuple(p) for p in c.get("secondary") or [])]
        described = [tuple(p) for p in c.get("describe") or []]
        for pair in (*pairs, *described):
            unknown = [a for a in pair if a not in arms]
            if len(pair) != 2 or unknown:
                raise ValueError(f"{path}: claim {c['id']}: comparison {list(pair)} must name two arms "
                                 f"of 'arms' ({sorted(arms)}); unknown: {unknown}")
        seeds, k = int(c.get("seeds", 6)), len(pairs) - 1
        needed = max(needed_pairs(1, alpha), needed_pairs(k, alpha) if k else 0)
        if seeds < needed:
            raise ValueError(f"{path}: claim {c['id']}: seeds: {seeds} cannot reach alpha {alpha:g} "
                             f"for its primary comparison and {k} Holm-corrected secondary one(s): "
                             f"set seeds: {needed} or more, or move comparisons to 'describe'")
        paper = c.get("paper_effect") or {}
        paper_on = tuple(tuple(p) for p in paper.get("comparisons") or [c["primary"]]) if paper else ()
        if any(p not in pairs for p in paper_on):
            raise ValueError(f"{path}: claim {c['id']}: paper_effect.comparisons {[list(p) for p in paper_on]} "
                             f"must be tested comparisons (primary or secondary)")
        if paper and c.get("exploratory"):
            raise ValueError(f"{path}: claim {c['id']}: an exploratory claim is described, never judged, so "
                             f"its paper_effect cannot be tested: remove paper_effect, or register the "
                             f"reading as its own claim on fresh seeds and give it paper_effect there")
        if c["metric"] not in metrics:
            raise ValueError(f"{path}: claim {c['id']}: metric {c['metric']!r} is not under 'metrics' "
                             f"({sorted(metrics)})")
        _check_methods(c, metrics[c["metric"]], [arms[a] for pair in (*pairs, *described) for a in pair], path)
        try:  # the paper's numbers the claim quotes, by their key in conf/paper_numbers.yaml
            quoted = {key: paper_number(key) for key in c.get("paper_numbers") or []}
        except KeyError as err:
            raise ValueError(f"{path}: claim {c['id']}: paper_numbers: {err.args[0]}; name a key of "
                             f"conf/paper_numbers.yaml") from None
        claims.append(Claim(id=c["id"], title=c["title"], paper=" ".join(c["paper"].split()),
                            experiment=c["experiment"], metric=c["metric"], primary=pairs[0],
                            secondary=tuple(pairs[1:]), command=" ".join(c["command"].split()),
                            seeds=seeds, first_seed=int(c.get("first_seed", 0)),
                            describe=tuple(described), question=" ".join(c.get("question", "").split()),
                            paper_delta=float(paper["delta"]) if paper else None, paper_on=paper_on,
                            paper_translation=" ".join(paper.get("translation", "").split()),
                            paper_numbers=quoted,
                            note=c.get("note", ""), also=tuple(c.get("also") or ()),
                            valid={k: float(v) for k, v in (c.get("valid") or {}).items()},
                            profiles=tuple(c.get("profiles") or ()),
                            settings=dict(c.get("settings") or {}),
                            exploratory=bool(c.get("exploratory", False)),
                            controls=_controls(c, arms, path)))
    return ClaimsConfig(alpha=alpha, metrics=metrics, arms=arms, claims=tuple(claims),
                        require=dict(raw.get("require") or {}),
                        describe_seeds=int(raw.get("describe_seeds", 2)))


def _check_methods(c: Mapping[str, Any], metric: MetricSpec, arms: list[Arm], path: str | Path) -> None:
    """A claim's arms are all methods of one kind of run, whose metric names ``{method}``, or
    none is: else two arms would read the same number, or a key no run has."""
    keys = (metric.key, *metric.of, *(c.get("also") or ()), *(c.get("valid") or ()))
    methods = {a.name: a.method for a in arms}
    if any(methods.values()) and c.get("controls"):
        raise ValueError(f"{path}: claim {c['id']}: its arms are recipes of one run, which has no control "
                         f"run of its own: remove `controls`, or give arms of their own runs")
    if any(methods.values()) and not all(methods.values()):
        raise ValueError(f"{path}: claim {c['id']}: arms {sorted(methods)} mix recipes scored inside one run "
                         f"(method: {sorted(n for n, m in methods.items() if m)}) with arms of their own "
                         f"runs: give every arm a method, or none")
    if any(methods.values()) and METHOD not in "".join(metric.of or (metric.key,)):
        raise ValueError(f"{path}: claim {c['id']}: its arms are methods, so metric {metric.key!r} must read "
                         f"keys that name {METHOD} (metrics.{metric.key}.of), e.g. ppl_books_512_{METHOD}")
    if not any(methods.values()) and any(METHOD in k for k in keys):
        raise ValueError(f"{path}: claim {c['id']}: a key names {METHOD} but no arm has a method "
                         f"(arms.<name>.method)")


def _controls(c: Mapping[str, Any], arms: Mapping[str, Arm], path: str | Path) -> Controls | None:
    """A claim's ``controls``, checked: a list of settings, each changing at least one value
    that the claim's ``settings`` or every arm's ``match`` pins, and the thresholds ``valid``."""
    raw = c.get("controls")
    if raw is None:
        return None
    where = f"{path}: claim {c['id']}: controls"
    example = "controls: {settings: [{task.scratchpad: interleaved}], valid: {exact_match_id: 90.0}}"
    if not isinstance(raw, dict) or set(raw) != {"settings", "valid"}:
        got = sorted(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{where}: give exactly the keys settings and valid (got {got}), e.g. {example}")
    settings, valid = raw["settings"], raw["valid"]
    if not isinstance(settings, list) or not settings or not all(isinstance(s, dict) and s for s in settings):
        raise ValueError(f"{where}.settings: give a non-empty list with one mapping of dotted config "
                         f"keys to values per control, e.g. {example}")
    if (not isinstance(valid, dict) or not valid
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in valid.values())):
        raise ValueError(f"{where}.valid: give a mapping of metrics.json keys to the least value a "
                         f"control run must reach, e.g. {example}")
    pairs = [c["primary"], *(c.get("secondary") or []), *(c.get("describe") or [])]
    for i, setting in enumerate(settings):
        for name in dict.fromkeys(a for pair in pairs for a in pair):
            own = {**(c.get("settings") or {}), **arms[name].match}
            unpinned = [k for k in setting if k not in own]
            if unpinned:
                raise ValueError(f"{where}.settings[{i}]: {', '.join(unpinned)} is not pinned for arm "
                                 f"{name!r}, so its own runs could be taken for the control's: give the "
                                 f"claim's value in its `settings` (e.g. {unpinned[0]}: <the claim's value>)")
            if all(own[k] == v for k, v in setting.items()):
                raise ValueError(f"{where}.settings[{i}]: {Controls.label(setting)} is what arm {name!r} "
                                 f"runs already: a control must change at least one of its values")
    return Controls(settings=tuple(dict(s) for s in settings), valid={k: float(v) for k, v in valid.items()})
