"""Checks of the command line that run before Hydra writes anything (choices, keys, directories)."""

from __future__ import annotations

import difflib
import itertools
import math
import tempfile
from pathlib import Path
from typing import Any, Callable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from pipelines.errors import PipelineConfigError, RunNotThereYet
from pipelines.hydra_conf import CONF_DIR, compose_or_none
from pipelines.run_dirs import RUN_CLAIM, is_rank_zero


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """Every option of a config group, nested ones included (experiment: addition/cpu, ...)."""
    root = conf_dir / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def unknown_choice(argv: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """A message for the first ``group=option`` on the command line that names no config file,
    listing the group's options (Hydra does not list nested ones such as experiment=addition/*)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or "(" in value or not (conf_dir / key).is_dir() or key == "hydra":
            continue
        options = group_options(key, conf_dir)
        for choice in value.split(","):
            if choice not in options and choice != "null":
                return (f"{key}={choice}: no such {key} config; choose one of: "
                        + ", ".join(options))
    return None


def check_writable(path: str | Path, key: str, value: str | Path | None = None) -> None:
    """Create ``path`` (a folder) if needed and prove it writable, or fail naming ``key`` (set
    to ``value``, by default ``path``)."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as err:
        where = "" if value is None else f" ({folder})"
        raise PipelineConfigError(
            f"{key}={value or path}: not a writable folder{where}: {err.strerror or err}; point "
            f"{key} at a folder you can write, e.g. {key}=$HOME/tape-runs"
        ) from None


def check_run_dir_new(run_dir: Path, key: str = "hydra.run.dir") -> None:
    """A run directory must be new: an existing, non-empty one belongs to another run."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        why = f"{RUN_CLAIM} exists" if (run_dir / RUN_CLAIM).exists() else "it is not empty"
        raise PipelineConfigError(
            f"{key}={run_dir} already belongs to another run ({why}); runs never share a "
            f"directory, and nothing was written to it. Leave {key} at its default or point it "
            "at a new directory."
        )


HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc"}
"""Hydra's command-line flags that take the next argument as their value."""
HYDRA_PRINT_FLAGS = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--version",
                     "--shell-completion", "-sc"}
"""Hydra's flags that print something and run no task (nothing to check before them)."""


def hydra_overrides(argv: list[str]) -> list[str]:
    """The config overrides of ``argv``: Hydra's flags (``--cfg job``, ``-cn name``, ``-m``) and
    their values removed."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in HYDRA_VALUE_FLAGS  # "--cfg=job" carries its value
        else:
            out.append(arg)
    return out


def only_prints(argv: list[str]) -> bool:
    """Hydra prints (the config, help, its version) and runs no task."""
    return any(arg.split("=")[0] in HYDRA_PRINT_FLAGS for arg in argv)


def _job(parsed: list, values: dict[int, str]) -> list[str]:
    """One job's overrides, in the order given: sweep ``i`` at ``values[i]``, the rest as written."""
    return [f"{o.get_key_element()}={values[i]}" if i in values else o.input_line for i, o in enumerate(parsed)]


def _first_of_each_sweep(argv: list[str]) -> list[str]:
    """The overrides of ``argv`` with every sweep (a,b / range(...)) cut to its first value."""
    parsed = OverridesParser.create().parse_overrides(argv)
    return _job(parsed, {i: next(iter(o.sweep_string_iterator())) for i, o in enumerate(parsed)
                         if o.is_sweep_override()})


MOST_SWEEP_JOBS_CHECKED = 64
"""A larger sweep has each of its values checked once (beside the first of the others)."""


def sweep_jobs(overrides: list[str], most: int = MOST_SWEEP_JOBS_CHECKED) -> list[tuple[str, list[str]]]:
    """(label, overrides) of each job of a sweep, as Hydra's basic sweeper forms them (the
    product of the swept values, the overrides in the order given; the label names the job's
    swept values). Above ``most`` jobs, one job per swept value instead, the other sweeps at
    their first value."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    swept = {i: list(o.sweep_string_iterator()) for i, o in enumerate(parsed) if o.is_sweep_override()}
    if math.prod(len(values) for values in swept.values()) <= most:
        combos = list(itertools.product(*swept.values()))
    else:
        firsts = [values[0] for values in swept.values()]
        combos = [tuple(firsts[:n] + [v] + firsts[n + 1:]) for n, values in enumerate(swept.values())
                  for v in values]
    jobs = []
    for combo in dict.fromkeys(combos):
        values = dict(zip(swept, combo))
        label = " ".join(f"{parsed[i].get_key_element()}={v}" for i, v in values.items())
        jobs.append((label, _job(parsed, values)))
    return jobs


def sweep_problem(config_name: str, overrides: list[str],
                  check_job: Callable[[DictConfig], None]) -> str | None:
    """What ``check_job`` (the entry's checks that need no run directory) says of each job of
    a sweep, before any job runs (a bad value among many trained the ones before it first);
    None when every job passes. A job Hydra cannot compose, or a check that fails otherwise,
    is left for that job to report."""
    try:
        jobs = sweep_jobs(overrides)
    except Exception:  # noqa: BLE001 - a sweep the parser cannot expand here: Hydra reports it
        return None
    if not jobs:  # one job too: a refused -m leaves no multirun folder
        return None
    failures: dict[str, list[str]] = {}
    for label, job in jobs:
        cfg = compose_or_none(config_name, job, hydra=True)
        if cfg is None:
            continue
        try:
            check_job(cfg)
        except RunNotThereYet:  # e.g. one PE's pretraining failed: the other PEs' jobs still run
            continue
        except PipelineConfigError as err:
            failures.setdefault(str(err), []).append(label)
        except Exception:  # noqa: BLE001 - not a settings error: the job meets it, and reports it
            continue
    if not failures:
        return None
    lines = [f"{len(sum(failures.values(), []))} of the sweep's {len(jobs)} jobs would fail their "
             "checks, so none was started; fix or drop these values:"]
    for error, labels in failures.items():
        shown = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
        lines.append(f"  {shown}: {error}")
    return "\n".join(lines)


def preflight(config_name: str, argv: list[str],
              check_job: Callable[[DictConfig], None] | None = None) -> None:
    """Checks that must pass before Hydra writes anything (it creates the run directory and
    starts its log before the task runs): ``paths.runs_dir`` is writable and ``hydra.run.dir``
    is new; in a sweep, ``check_job`` passes on every job. Composes the config as Hydra will; a
    config Hydra cannot compose is left for Hydra to report. DDP's extra processes rerun the
    command inside rank 0's directory: not checked."""
    if not is_rank_zero() or only_prints(argv):
        return
    multirun = bool({"-m", "--multirun"} & set(argv))
    overrides = hydra_overrides(argv)
    if (problem := contradiction_problem(config_name, overrides)) is not None:
        raise PipelineConfigError(problem)
    cfg = compose_or_none(config_name, _first_of_each_sweep(overrides), hydra=True)
    if cfg is None:  # Hydra reports a config it cannot compose, with context; a typo is ours
        if (problem := unknown_key_problem(config_name, overrides)) is not None:
            raise PipelineConfigError(problem)
        return
    if multirun and check_job is not None and (problem := sweep_problem(config_name, overrides, check_job)):
        raise PipelineConfigError(problem)  # before any folder is made
    runs_dir = OmegaConf.select(cfg, "paths.runs_dir")
    run_dir = None if multirun else OmegaConf.select(cfg, "hydra.run.dir")
    run_dir = Path(str(run_dir)) if run_dir else None
    inside = bool(runs_dir and run_dir and run_dir.resolve().is_relative_to(Path(str(runs_dir)).resolve()))
    if runs_dir and (run_dir is None or inside):  # an evaluation writes inside its run, not here
        check_writable(runs_dir, "paths.runs_dir")
    if run_dir:
        check_run_dir_new(run_dir)
        if not inside:
            check_writable(run_dir.parent, "hydra.run.dir", run_dir)  # a run outside paths.runs_dir


def _dotted_keys(node: Any, prefix: str = "") -> list[str]:
    """Every key of a config as a dotted path (``trainer.max_steps``), leaves and branches."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            out += [path, *_dotted_keys(value, path + ".")]
    return out


def unknown_key_problem(config_name: str, overrides: list[str]) -> str | None:
    """"unknown key trainer.max_step; did you mean trainer.max_steps?" for the overrides that
    set a key the config does not have (Hydra's own message points at +key, the wrong way for
    a typo); None when every key exists or the config cannot be composed at all."""
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    first = _first_of_each_sweep(overrides)
    settings = [o for o in first if "=" in o and not o.startswith(("+", "~")) and o.split("=", 1)[0] not in groups]
    cfg = compose_or_none(config_name, [o for o in first if o not in settings], hydra=True)
    if cfg is None:  # a bad group choice: Hydra's message lists the options
        return None
    known = _dotted_keys(OmegaConf.to_container(cfg, resolve=False))
    problems = []
    for key in (o.split("=", 1)[0] for o in settings):
        if key not in known and OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:  # ??? values are known
            near = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
            hint = f"did you mean {' or '.join(near)}?" if near else "no key of that name is near it"
            problems.append(f"unknown key {key}; {hint} (to add a new key on purpose: +{key}=...)")
    return "; ".join(problems) or None


_ABSENT = object()


def contradiction_problem(config_name: str, overrides: list[str]) -> str | None:
    """A key given twice (``pe=rope pe=tape`` silently kept the last), or a ``task=`` choice
    other than the task of the chosen ``experiment=`` preset (its runs would be filed under
    the preset's name); None when the choices agree."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    for key in dict.fromkeys(k for k in keys if keys.count(k) > 1):
        values = [o.split("=", 1)[1] for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+~") == key]
        return f"{key} is given {len(values)} times ({', '.join(values)}); give it once"
    given = dict(o.split("=", 1) for o in overrides if "=" in o)
    if "experiment" not in given or "task" not in given or "," in given["experiment"] + given["task"]:
        return None
    preset = compose_or_none(config_name, [f"experiment={given['experiment']}"])
    chosen = compose_or_none(config_name, [f"task={given['task']}"])
    if preset is None or chosen is None:  # an unknown preset or task: Hydra lists the options
        return None
    if preset.task.name != chosen.task.name:
        return (f"experiment={given['experiment']} trains task {preset.task.name}, but task={given['task']} "
                f"asks for {chosen.task.name}: drop task= (or choose a {chosen.task.name} preset, "
                f"experiment={chosen.task.name}/<scale>)")
    return None
