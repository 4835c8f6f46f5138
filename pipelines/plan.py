"""The reproduction plan: conf/reproduce/<profile>.yaml read into the steps pipelines.reproduce
runs. A profile names the claims of conf/claims.yaml it runs (each arm at the seeds its claim's
plan gives it, and the minutes a run of each claim experiment takes), table steps (experiment,
encodings, ``after``: run at ``--seeds``), a profile whose steps follow (``then``), or another
profile it changes (``extends``). docs/reproduction.md lists the keys.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from tape.data.scrolls import ScrollsDataError, local_files
from tape.report.claim_registry import Claim, ClaimsConfig, load_claims
from tape.report.paper import SCROLLS_ORDER

PLAN_DIR = Path(__file__).resolve().parents[1] / "conf" / "reproduce"
KEYS: dict[str, frozenset[str]] = {  # what a profile, its claims and minutes, and a step may say
    "profile": frozenset({"description", "extends", "claims", "minutes", "scale", "print_only", "heading",
                          "steps", "then"}),
    "claims": frozenset({"profiles", "unlisted"}),
    "minutes": frozenset({"measured", "note", "runs", "alone"}),
    "step": frozenset({"experiment", "entry", "encodings", "single", "overrides", "datasets", "after", "alone"}),
}
SWITCHES: dict[str, frozenset[str]] = {  # true or false, per kind of mapping (minutes.alone is not one)
    "profile": frozenset({"print_only"}), "claims": frozenset({"unlisted"}), "step": frozenset({"single", "alone"})}
TEXTS = {"scale": "cpu", "extends": "tables", "then": "tables", "experiment": "addition/{scale}",
         "entry": "pipelines.benchmark", "after": "pretrain"}  # a string each, e.g. these
LISTS = {"encodings": "[rope, tape]", "overrides": "[trainer.max_steps=2]", "profiles": "[gpu]"}  # of strings
DATASETS = ("local", "all")  # a step's `datasets`: those with data under --scrolls-data, or all


@dataclass
class Step:
    """One experiment of the reproduction: which runs it needs and how to launch them."""

    name: str
    entry: str  # python -m <entry>
    experiment: str  # the experiment_name its runs record ("addition/cpu"); "" = not run-based
    pes: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)
    overrides: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()  # SCROLLS: one experiment per dataset (scrolls/<scale>/<dataset>)
    unavailable: str = ""  # why the step cannot run here ("" = it can)
    done_file: Path | None = None  # for steps that write a file instead of a run directory
    wave: int = 0  # --jobs: a wave starts when every earlier wave has finished
    alone: bool = False  # --jobs: run with every core and nothing beside it (timings; context extension)
    single: bool = False  # one plain run per seed, no PE sweep (context extension: pe is llama)
    match: Mapping[str, Any] = field(default_factory=dict)  # a claim arm: config values its runs have
    tier: int = 0  # --jobs: inside a wave, lower tiers first; claim arms run seed by seed
    minutes: float = 0.0  # a run's expected wall time here (0: unknown)
    feeds: bool = False  # a later step starts from its runs' checkpoints (SCROLLS from pretraining)

    def experiments(self) -> list[str]:
        return [f"{self.experiment}/{d}" for d in self.datasets] if self.datasets else [self.experiment]


@dataclass(frozen=True)
class Profile:
    """One conf/reproduce/<name>.yaml, with the profile it extends merged in."""

    name: str
    description: str = ""
    claims: Mapping[str, Any] | None = None  # {profiles, unlisted}; None: runs no claim
    minutes: Mapping[str, float] = field(default_factory=dict)  # claim experiment -> a run's minutes
    alone: Mapping[str, float] = field(default_factory=dict)  # claim experiment run by itself -> a run's minutes
    minutes_note: str = ""  # said beside --dry-run's estimate
    scale: str = "cpu"  # {scale} in the steps' experiments; the benchmark's scale
    print_only: bool = False  # print the commands, run nothing
    heading: str = ""  # printed above those commands
    steps: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    then: str = ""  # a profile whose steps run after these

    def runs_claim(self, claim: Claim) -> bool:
        """Whether the profile runs ``claim``: its ``profiles`` name one of ours, or it names
        none and the profile takes such claims (``unlisted``)."""
        if self.claims is None:
            return False
        if claim.profiles:
            return bool(set(claim.profiles) & set(self.claims.get("profiles") or ()))
        return bool(self.claims.get("unlisted", False))


def profiles() -> tuple[str, ...]:
    """The profiles: one conf/reproduce/<name>.yaml each."""
    return tuple(sorted(p.stem for p in PLAN_DIR.glob("*.yaml")))


def load_profile(name: str) -> Profile:
    """conf/reproduce/<name>.yaml, checked: an unknown key, a value of the wrong kind, an unknown
    ``after`` step, ``datasets`` value or profile named is a ValueError that says what to write instead."""
    raw = _read(name, ())
    path = PLAN_DIR / f"{name}.yaml"
    names = list(raw.get("steps") or {})
    for i, (step, body) in enumerate((raw.get("steps") or {}).items()):
        if body.get("after") is not None and body["after"] not in names[:i]:
            raise ValueError(f"{path}: steps.{step}.after: {body['after']!r} is not a step before it "
                             f"({', '.join(names[:i]) or 'none'})")
        if body.get("datasets") is not None and body["datasets"] not in DATASETS:
            raise ValueError(f"{path}: steps.{step}.datasets: {body['datasets']!r}; write one of {DATASETS}")
        if "experiment" not in body and body.get("entry") != "pipelines.benchmark":
            raise ValueError(f"{path}: steps.{step}: give its experiment (e.g. addition/{{scale}})")
    if raw.get("then"):
        try:
            _read(raw["then"], (name,))  # exists and reads
        except ValueError as err:
            raise ValueError(f"{path}: then: {err}") from None
    minutes = raw.get("minutes") or {}
    return Profile(name=name, description=" ".join(str(raw.get("description", "")).split()),
                   claims=raw.get("claims"),
                   minutes={k: float(v) for k, v in (minutes.get("runs") or {}).items()},
                   alone={k: float(v) for k, v in (minutes.get("alone") or {}).items()},
                   minutes_note=minutes.get("note") or "", scale=raw.get("scale", "cpu"),
                   print_only=bool(raw.get("print_only", False)), heading=raw.get("heading", ""),
                   steps=raw.get("steps") or {}, then=raw.get("then") or "")


def _read(name: str, seen: tuple[str, ...]) -> dict[str, Any]:
    """The profile's YAML, checked, over the profile it ``extends`` (mappings merge key by key)."""
    path = PLAN_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(_no_profile(name))
    if name in seen:
        raise ValueError(f"{path}: extends or follows itself ({' -> '.join((*seen, name))})")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not YAML: {err}") from None
    _check_keys(raw, "profile", path, "")
    _check_values(raw, "profile", path, "")
    for section in ("claims", "minutes"):
        if raw.get(section) is not None:
            _check_keys(raw[section], section, path, f"{section}.")
            _check_values(raw[section], section, path, f"{section}.")
    if not isinstance(raw.get("steps") or {}, dict):
        raise ValueError(f"{path}: steps must be a mapping of step names to steps (docs/reproduction.md)")
    for step, body in (raw.get("steps") or {}).items():
        _check_keys(body, "step", path, f"steps.{step}.")
        _check_values(body, "step", path, f"steps.{step}.")
    for part in ("runs", "alone"):
        _check_minutes((raw.get("minutes") or {}).get(part), path, part)
    base = raw.pop("extends", None)
    if base and not (PLAN_DIR / f"{base}.yaml").is_file():
        raise ValueError(f"{path}: extends: {_no_profile(base)}")
    return _merge(_read(base, (*seen, name)), raw) if base else raw


def _no_profile(name: str) -> str:
    """The error for a profile with no conf/reproduce/<name>.yaml, naming those there are."""
    return f"profile {name!r}: there is no {PLAN_DIR / f'{name}.yaml'}; the profiles are {', '.join(profiles())}"


def _check_keys(mapping: Any, kind: str, path: Path, where: str) -> None:
    if not isinstance(mapping, dict):
        raise ValueError(f"{path}: {where.rstrip('.') or 'the file'} must be a mapping of keys")
    for key in mapping:
        if key not in KEYS[kind]:
            close = difflib.get_close_matches(str(key), KEYS[kind], n=1)
            fix = f"did you mean {close[0]!r}? " if close else ""
            label = {"profile": "a profile", "step": "a step"}.get(kind, f"`{kind}`")
            raise ValueError(f"{path}: unknown key {where}{key!r}: {fix}{label} takes "
                             f"{', '.join(sorted(KEYS[kind]))} (docs/reproduction.md)")


def _check_values(mapping: Mapping[str, Any], kind: str, path: Path, where: str) -> None:
    """Each value of the kind its key takes in a ``kind`` mapping (KEYS): true or false, a string, a
    list of strings; None: not given."""
    for key, value in mapping.items():
        at = f"{path}: {where}{key}"
        if value is None:
            continue
        if key in SWITCHES.get(kind, ()) and not isinstance(value, bool):
            raise ValueError(f"{at}: {value!r} must be true or false: write {key}: true or {key}: false")
        if key in TEXTS and not isinstance(value, str):
            raise ValueError(f"{at}: {value!r} must be a string, e.g. {key}: {TEXTS[key]}")
        if key in LISTS and isinstance(value, str):
            raise ValueError(f"{at} must be a list, not {value!r}: write {key}: [{value}]")
        if key in LISTS and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{at} must be a list of strings, not {value!r}: e.g. {key}: {LISTS[key]}")


def _check_minutes(runs: Any, path: Path, part: str = "runs") -> None:
    """``minutes.<part>`` (runs, alone): a mapping of claim experiments to a run's minutes, a number >= 0."""
    if runs is None:
        return
    if not isinstance(runs, dict):
        raise ValueError(f"{path}: minutes.{part} must be a mapping of claim experiments to a run's minutes, "
                         f"e.g. {{flipflop/cpu: 8.6}}")
    for experiment, value in runs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{path}: minutes.{part}.{experiment}: {value!r} is not a number of minutes; "
                             f"write e.g. {experiment}: 8.6")


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


# ---------------------------------------------------------------------------- the steps
def plan(profile: str, seeds: Sequence[int] = (0,), runs_dir: Path = Path("runs"),
         scrolls_data: Path | None = Path("data/scrolls"), claims: ClaimsConfig | None = None,
         only: Sequence[str] = ()) -> list[Step]:
    """Every experiment of ``profile`` in the order it runs: its claims' arms, its table steps,
    then the steps of its ``then`` profile; ``only`` keeps the claims with those ids (C1, C3, ...)
    and drops the table steps; an id the profile does not run is a ValueError."""
    everything = claims or load_claims()
    prof = load_profile(profile)
    steps = _steps(prof, select_claims(everything, only), tuple(seeds), runs_dir, scrolls_data, tables=not only)
    ran = claims_run(prof, everything)
    if prof.claims is not None and not ran:  # e.g. claims.profiles: [gpus], a tag no claim has
        used = sorted({t for c in everything.claims for t in c.profiles})
        raise ValueError(f"profile {profile} runs no claim: its claims.profiles "
                         f"{list(prof.claims.get('profiles') or [])} name no claim's `profiles` in conf/claims.yaml "
                         f"(they use {', '.join(used)}); set unlisted: true for the claims without one")
    if missing := [i for i in only if i not in ran]:
        raise ValueError(f"--claims {' '.join(missing)}: not run by profile {profile} "
                         f"({'its claims: ' + ', '.join(ran) if ran else 'it runs no claim'})")
    return steps


def claims_run(prof: Profile, cfg: ClaimsConfig) -> list[str]:
    """The ids of the claims of ``cfg`` that ``prof`` runs, its ``then`` profiles' included."""
    chain = [prof]
    while chain[-1].then and chain[-1].then not in [p.name for p in chain]:
        chain.append(load_profile(chain[-1].then))
    return [c.id for c in cfg.claims if any(p.runs_claim(c) for p in chain)]


def _steps(prof: Profile, cfg: ClaimsConfig, seeds: tuple[int, ...], runs_dir: Path,
           scrolls_data: Path | None, chain: tuple[str, ...] = (), tables: bool = True) -> list[Step]:
    if prof.name in chain:
        raise ValueError(f"profile {prof.name}: `then` leads back to it ({' -> '.join((*chain, prof.name))})")
    steps = claim_steps(replace(cfg, claims=tuple(c for c in cfg.claims if prof.runs_claim(c))),
                        prof.minutes, prof.alone) if prof.claims is not None else []
    more = [table_steps(prof, seeds, runs_dir, scrolls_data)] if tables else []
    if prof.then:
        more.append(_steps(load_profile(prof.then), cfg, seeds, runs_dir, scrolls_data, (*chain, prof.name),
                           tables))
    for part in more:  # each part after everything before it
        offset = max((s.wave for s in steps), default=-1) + 1
        steps += [replace(s, wave=s.wave + offset) for s in part]
    return steps


def select_claims(cfg: ClaimsConfig, only: Sequence[str]) -> ClaimsConfig:
    """``cfg`` with only the claims named in ``only`` (all when empty); an unknown id is an error."""
    if not only:
        return cfg
    ids = [c.id for c in cfg.claims]
    unknown = [i for i in only if i not in ids]
    if unknown:
        raise ValueError(f"--claims {' '.join(unknown)}: unknown; conf/claims.yaml has {' '.join(ids)}")
    return replace(cfg, claims=tuple(c for c in cfg.claims if c.id in only))


def claim_steps(cfg: ClaimsConfig, minutes: Mapping[str, float] | None = None,
                alone: Mapping[str, float] | None = None) -> list[Step]:
    """One step per (experiment, arm) of the claims: the arm's PE and config values as overrides,
    the seeds each claim's plan gives the arm (conf/claims.yaml ``seeds``, ``first_seed``; an arm
    only described runs ``describe_seeds``), tier 0 for an arm of a primary comparison, else 1,
    and ``minutes`` a run of its experiment takes. An arm two claims share (pretrain/cpu TAPE: C2
    and C4) runs once, at the union of seeds. Each positive control of a claim (``controls``)
    is a step of its own per arm, ``<claim>-<arm>-control-<values>``, at the arm's seeds and tier:
    a seed's pair counts only once its controls have run. Arms that are methods of one run
    (``Arm.method``) share one step, ``<claim>-recipes``, of plain runs (``single``: no ``pe=``).
    An experiment in ``alone`` (a run that uses every core well) runs by itself under --jobs, and
    a run then takes its minutes there."""
    minutes, alone = minutes or {}, alone or {}
    steps: dict[tuple[str, ...], Step] = {}
    for claim in cfg.claims:
        for name in claim.arm_names:
            arm = cfg.arms[name]
            tier = 0 if name in claim.primary else 1
            seeds = claim.arm_seeds(name, cfg.describe_seeds)
            # arms scored inside one run (methods: context extension's recipes) share its step
            own = (name, (claim.experiment, name)) if not arm.method else (
                "recipes", (claim.experiment, arm.pe, repr(sorted(claim.values(arm).items()))))
            runs: list[tuple[str, tuple[str, ...], Mapping[str, Any]]] = [(*own, {})]
            for control in claim.controls.settings if claim.controls else ():
                label = "-".join(f"{k.rsplit('.', 1)[-1]}={_override(v)}" for k, v in control.items())
                runs.append((f"{name}-control-{label}", (claim.experiment, name, repr(sorted(control.items()))),
                             control))
            for label, key, control in runs:
                if key in steps:
                    old = steps[key]
                    ids, arm_name = old.name.split("-", 1)
                    ids = ids if claim.id in ids.split("+") else f"{ids}+{claim.id}"  # a claim's second recipe
                    steps[key] = replace(old, name=f"{ids}-{arm_name}", tier=min(old.tier, tier),
                                         seeds=tuple(sorted({*old.seeds, *seeds})))
                    continue
                values = claim.values(arm, control)  # the arm's own values win (compute-matched arms)
                steps[key] = Step(
                    name=f"{claim.id}-{label}", entry="pipelines.train", experiment=claim.experiment,
                    pes=(arm.pe,), seeds=seeds,
                    overrides=tuple(f"{k}={_override(v)}" for k, v in values.items()),
                    match={**cfg.require, **values}, tier=tier, single=bool(arm.method),
                    alone=claim.experiment in alone,
                    minutes=alone.get(claim.experiment, minutes.get(claim.experiment, 0.0)))
    return list(steps.values())


def _override(value: Any) -> str:
    """A config value as Hydra reads it back (True -> true, None -> null, ["a", "b"] -> [a,b])."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def table_steps(prof: Profile, seeds: Sequence[int], runs_dir: Path, scrolls_data: Path | None) -> list[Step]:
    """The profile's ``steps`` at ``seeds``, each ``after`` step one wave later than the step it
    waits for. The benchmark writes under ``runs_dir/benchmark/<scale>`` like every other run (so
    a checkout's committed results/ never counts as done on a new machine)."""
    out: list[Step] = []
    waves: dict[str, int] = {}
    for name, s in prof.steps.items():
        waves[name] = waves[s["after"]] + 1 if s.get("after") else 0
        step = Step(name, s.get("entry", "pipelines.train"), s.get("experiment", "").format(scale=prof.scale),
                    tuple(s.get("encodings") or ()), tuple(seeds), tuple(s.get("overrides") or ()),
                    wave=waves[name], alone=bool(s.get("alone", False)), single=bool(s.get("single", False)))
        if s.get("datasets") == "all":  # the hub may be reachable (a cluster): every dataset
            step = replace(step, datasets=SCROLLS_ORDER)
        elif s.get("datasets") == "local":
            datasets, note = scrolls_datasets(scrolls_data)
            step = replace(step, datasets=datasets, unavailable=note, overrides=(
                *step.overrides, *((f"task.data_dir={scrolls_data}",) if datasets else ())))
        if step.entry == "pipelines.benchmark":
            out_dir = bench_dir(runs_dir, prof.scale)
            step = replace(step, experiment="", seeds=(0,), overrides=(*step.overrides, f"output_dir={out_dir}"),
                           done_file=out_dir / "efficiency.json")
        out.append(step)
    needed = {s["after"] for name, s in prof.steps.items() if s.get("after")
              and not next(o for o in out if o.name == name).unavailable}
    return [replace(s, feeds=True) if s.name in needed else s for s in out]


def scrolls_datasets(data_dir: Path | None) -> tuple[tuple[str, ...], str]:
    """The SCROLLS datasets with local train/validation JSONL under ``data_dir``, and a note."""
    if data_dir is None:
        return (), "not run: data unavailable (no --scrolls-data folder given)"
    present = []
    for name in SCROLLS_ORDER:
        try:
            local_files(name, data_dir, ("train", "validation"))
            present.append(name)
        except ScrollsDataError:
            pass
    note = "" if present else f"not run: data unavailable (no <dataset>/train.jsonl under {data_dir})"
    return tuple(present), note


def bench_dir(runs_dir: Path, scale: str) -> Path:
    """Where the reproduction's benchmark writes efficiency.md / .json."""
    return runs_dir / "benchmark" / scale
