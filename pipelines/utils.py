"""Shared plumbing of the entry points: run directories, loggers, callbacks, checkpoints, errors.

Hydra and W&B are handled here and in the entry points only; ``tape/`` never imports them.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import os
import re
import secrets
import shlex
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

# Nothing here imports torch, Lightning or transformers at module level: every entry point
# imports this module before checking its arguments, and a typo must be reported in a second or
# two, not after 15 s of imports. Heavy imports happen inside the functions that need them.
if TYPE_CHECKING:
    from tape.model import ModelConfig

log = logging.getLogger("pipelines")
F = TypeVar("F", bound=Callable[..., Any])

# One id per process: with the second-resolution time it names the run directory. Two runs
# started in the same second get different ids; jobs of one multirun add their job number.
RUN_ID = secrets.token_hex(3)
if not OmegaConf.has_resolver("run_id"):
    OmegaConf.register_new_resolver("run_id", lambda: RUN_ID)
# The launch directory. Not ${hydra:runtime.cwd}: the multirun sweep dir is resolved before
# Hydra's runtime config exists.
if not OmegaConf.has_resolver("cwd"):
    OmegaConf.register_new_resolver("cwd", os.getcwd)

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
RUN_CLAIM = "command.txt"  # created exclusively: the run directory belongs to this run only


class PipelineConfigError(CompactHydraException, ValueError):
    """A config value cannot work; the message names the key (as on the command line) and the fix.

    Hydra prints a CompactHydraException as its message alone, once, with no traceback
    (HYDRA_FULL_ERROR=1 shows the traceback)."""


class JobFailed(CompactHydraException):
    """A multirun job failed; its own error was logged where it happened (printed once)."""


# ---------------------------------------------------------------------------- command line
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


# ---------------------------------------------------------------------------- processes
def is_rank_zero() -> bool:
    """True in the launching process; False in the extra processes DDP starts (they set RANK or
    LOCAL_RANK) and must not claim directories or write results."""
    return all(int(os.environ.get(k, 0)) == 0 for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def close_loggers(failed: bool = False) -> None:
    """Finish an open W&B run so the next job of a sweep starts clean (no-op without W&B)."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1 if failed else 0)


def _multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # composed without @hydra.main (tests, notebooks)
        return False


def _drop_unclaimed(run_dir: Path, runs_dir: Path | None = None) -> None:
    """Remove the empty directories made for a run that failed before claiming one (its own and
    the empty <experiment>/<pe>/<seed> folders above it, up to ``runs_dir``), so no debris is
    left or counted as a run; a claimed or non-empty directory is never touched."""
    stop = runs_dir.resolve().parent if runs_dir is not None else run_dir.parent
    here = run_dir.resolve()
    try:
        if here.is_dir() and not any(here.iterdir()):
            here.rmdir()
            here = here.parent
            while here != stop and stop in here.parents and here.is_dir() and not any(here.iterdir()):
                here.rmdir()
                here = here.parent
    except OSError:
        pass


# Outcomes of the jobs this process ran (the basic launcher runs a multirun's jobs here), for the
# summary printed when the command ends.
JOBS: list[dict[str, Any]] = []


def task_wrapper(fn: F) -> F:
    """Run an entry task; whatever happens, close the loggers and print the run directory, so
    one failed sweep job leaves the others alone and its outputs are easy to find. Ends with a
    one-screen summary of the run. A config error is raised unlogged (Hydra prints it once, with
    no traceback); in a multirun each failed job logs its one-line error and the sweep goes on."""

    @functools.wraps(fn)
    def wrapped(cfg: DictConfig, *args: Any, **kwargs: Any) -> Any:
        failed, out, error = True, None, ""
        run_dir = Path(cfg.paths.output_dir)
        try:
            out = fn(cfg, *args, **kwargs)
            failed = False
            return out
        except PipelineConfigError as err:
            error = str(err)
            if _multirun():  # printed here, once; the sweep goes on and ends with a summary
                log.error("%s", err)
                raise JobFailed("this job failed: its error is printed above, the multirun "
                                "summary follows") from err
            raise
        except Exception as err:
            error = f"{type(err).__name__}: {err}"
            log.exception("%s failed", fn.__name__)
            raise
        finally:
            close_loggers(failed)
            unlock_run_dir(run_dir)
            if is_rank_zero():
                claimed = (run_dir / RUN_CLAIM).is_file()
                if failed and not claimed:
                    _drop_unclaimed(run_dir, Path(cfg.paths.runs_dir))
                where = str(run_dir) if claimed else "none (the run failed its checks before claiming a directory)"
                JOBS.append({"entry": fn.__name__, "cfg": cfg, "run_dir": where, "failed": failed,
                             "error": error.splitlines()[0] if error else "",
                             "metrics": out if isinstance(out, dict) else {}})
                if not failed:
                    print(run_summary(JOBS[-1]), flush=True)
                print(f"run dir: {where}" + (" (failed)" if failed else ""), flush=True)
            stop_log_files()

    return wrapped  # type: ignore[return-value]


# ---------------------------------------------------------------------------- summaries
HEADLINE = re.compile(r"(accuracy|^ppl_|^passkey_|score|^f1$|^exact_match|^rouge|^val_loss$)")


def headline(metrics: dict[str, Any]) -> dict[str, float]:
    """The task's headline numbers: accuracies (addition), perplexities (pretraining, context
    extension), passkey accuracies, scores (SCROLLS), and the final validation loss."""
    return {k: float(v) for k, v in metrics.items()
            if HEADLINE.search(k) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _fmt(metrics: dict[str, float], limit: int = 8) -> str:
    items = [f"{k} {v:.4g}" for k, v in list(metrics.items())[:limit]]
    more = len(metrics) - limit
    return ", ".join(items) + (f" (+{more} more in metrics.json)" if more > 0 else "")


def run_summary(job: dict[str, Any]) -> str:
    """One screen: what ran, where, its headline metrics and how long it took."""
    cfg, m = job["cfg"], job["metrics"]
    what = " ".join(f"{k}={v}" for k, v in (
        ("experiment", cfg.get("experiment_name")), ("pe", (cfg.get("pe") or {}).get("name")),
        ("seed", cfg.get("seed"))) if v is not None)
    lines = [f"---- {job['entry']} done: {what}",
             f"  metrics: {_fmt(headline(m)) or 'none'}"]
    timing = [f"{k} {float(m[k]):.1f}" for k in ("steps", "train_time_s", "wall_time_s") if k in m]
    if timing:
        lines.append(f"  {', '.join(timing)}")
    if m.get("resumed_from"):
        lines.append(f"  resumed from {m['resumed_from']}")
    return "\n".join(lines)


def multirun_summary(jobs: list[dict[str, Any]]) -> str:
    """One line per job of a multirun: ok / FAILED, its overrides' effect, run dir and headline."""
    lines = [f"==== multirun: {sum(not j['failed'] for j in jobs)} of {len(jobs)} jobs finished"]
    for i, j in enumerate(jobs):
        cfg = j["cfg"]
        what = f"{cfg.get('experiment_name')} pe={(cfg.get('pe') or {}).get('name')} seed={cfg.get('seed')}"
        tail = "(its error is printed above)" if j["failed"] else _fmt(headline(j["metrics"]), limit=3)
        lines.append(f"  [{i}] {'FAILED' if j['failed'] else 'ok':6} {what}: {tail}")
        lines.append(f"       {j['run_dir']}")
    return "\n".join(lines)


def run_entry(main: Callable[[], Any], argv: list[str], config_name: str = "config") -> None:
    """``__main__`` of an entry point: reject unknown config choices and the failures Hydra
    would meet while creating the run directory (preflight) at once, run Hydra's ``main``, and
    end a multirun with its summary (printed even when a job failed)."""
    if message := unknown_choice(argv):
        sys.exit(message)
    try:
        preflight(config_name, argv)
    except PipelineConfigError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(str(err))
    try:
        main()
    finally:
        if len(JOBS) > 1 or {"-m", "--multirun"} & set(argv):
            print(multirun_summary(JOBS), flush=True)


class _Drop(logging.Filter):
    """Drops log records whose message contains one of ``phrases``."""

    def __init__(self, *phrases: str) -> None:
        super().__init__()
        self.phrases = phrases

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(p in record.getMessage() for p in self.phrases)


def quiet_known_noise() -> None:
    """Silence what every run printed that says nothing about the run: Lightning's litlogger
    advertisement, a pytree deprecation inside Lightning, and Lightning's second console
    handler (each of its lines printed twice once Hydra's logging is set up). Imports Lightning."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    import lightning  # noqa: F401 - sets up the loggers adjusted below

    if logging.getLogger().handlers:  # Hydra's (or pytest's) handlers print and record everything
        own = logging.getLogger("lightning")
        for handler in [h for h in own.handlers if type(h) is logging.StreamHandler]:
            own.removeHandler(handler)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _Drop) for f in rank_zero.filters):
        rank_zero.addFilter(_Drop("litlogger", "Trainer already configured with model summary"))


def drop_wandb_anonymous(loggers: list[Any]) -> None:
    """Lightning's WandbLogger always passes ``anonymous=None`` to wandb.init, which makes W&B
    warn that the setting has no effect; leave the argument out instead."""
    for lg in loggers:
        init = getattr(lg, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)


# ---------------------------------------------------------------------------- preflight
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


def _first_of_each_sweep(argv: list[str]) -> list[str]:
    """The overrides of ``argv`` with every sweep (a,b / range(...)) cut to its first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for override in OverridesParser.create().parse_overrides(argv):
        if override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()))
            out.append(f"{override.get_key_element()}={first}")
        else:
            out.append(override.input_line)
    return out


def preflight(config_name: str, argv: list[str]) -> None:
    """Checks that must pass before Hydra writes anything (it creates the run directory and
    starts its log before the task runs): ``paths.runs_dir`` is writable and ``hydra.run.dir``
    is new. Composes the config as Hydra will; a config Hydra cannot compose is left for Hydra
    to report. DDP's extra processes rerun the command inside rank 0's directory: not checked."""
    if not is_rank_zero():
        return
    multirun = bool({"-m", "--multirun"} & set(argv))
    overrides = [a for a in argv if not a.startswith("-")]
    if (problem := contradiction_problem(config_name, overrides)) is not None:
        raise PipelineConfigError(problem)
    cfg = compose_or_none(config_name, _first_of_each_sweep(overrides), hydra=True)
    if cfg is None:  # Hydra reports a config it cannot compose, with context; a typo is ours
        if (problem := unknown_key_problem(config_name, overrides)) is not None:
            raise PipelineConfigError(problem)
        return
    runs_dir = OmegaConf.select(cfg, "paths.runs_dir")
    run_dir = None if multirun else OmegaConf.select(cfg, "hydra.run.dir")
    if runs_dir:
        check_writable(runs_dir, "paths.runs_dir")
    if run_dir:
        run_dir = Path(str(run_dir))
        check_run_dir_new(run_dir)
        if not (runs_dir and run_dir.resolve().is_relative_to(Path(str(runs_dir)).resolve())):
            check_writable(run_dir.parent, "hydra.run.dir", run_dir)  # a run outside paths.runs_dir


def compose_or_none(config_name: str, overrides: list[str], hydra: bool = False) -> DictConfig | None:
    """conf/<config_name> composed with ``overrides`` (with the hydra node when ``hydra``), or
    None when Hydra cannot compose it (Hydra then reports why itself)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra)
    except Exception:  # noqa: BLE001 - any composition failure: left to Hydra's own message
        return None
    finally:
        GlobalHydra.instance().clear()


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
    import difflib

    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    first = _first_of_each_sweep(overrides)
    settings = [o for o in first if "=" in o and not o.startswith(("+", "~")) and o.split("=", 1)[0] not in groups]
    cfg = compose_or_none(config_name, [o for o in first if o not in settings], hydra=True)
    if cfg is None:  # a bad group choice: Hydra's message lists the options
        return None
    known = _dotted_keys(OmegaConf.to_container(cfg, resolve=False))
    problems = []
    for key in (o.split("=", 1)[0] for o in settings):
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
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


# ---------------------------------------------------------------------------- run directories
def job_command(entry: str) -> str:
    """The command that reruns exactly this job (for a multirun job: its own overrides only)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # composed without @hydra.main (tests, notebooks)
        overrides = sys.argv[1:]
    return shlex.join(["python", "-m", entry, *overrides])


def claim_run_dir(run_dir: Path, cfg: DictConfig, entry: str) -> None:
    """Make ``run_dir`` this run's own: create command.txt exclusively (fail if another run has
    it), then save the resolved config, Hydra's record (.hydra/) and start the log file. Nothing
    that was there is ever overwritten."""
    from tape.bench.machine import commit_label, machine_summary

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(run_dir / RUN_CLAIM, "x") as f:
            f.write(job_command(entry) + "\n")
            f.write(f"# launched as: {shlex.join([sys.executable, *sys.argv])}\n")
            f.write(f"# cwd: {os.getcwd()}\n# commit: {commit_label(REPO_ROOT)}\n# time: {time.ctime()}\n")
            f.write(f"# machine: {machine_summary()}\n")
            f.write(f"# threads: {torch_threads()}\n")  # CPU results depend on it (docs/reproduction.md)
    except FileExistsError:
        raise PipelineConfigError(
            f"hydra.run.dir={run_dir} already belongs to another run ({RUN_CLAIM} exists); runs "
            "never share a directory. Leave hydra.run.dir at its default or point it at a new "
            "directory."
        ) from None
    with open(run_dir / "config.yaml", "x") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    lock_run_dir(run_dir)  # released when the task ends (task_wrapper); stale after a crash
    record_hydra(run_dir, cfg)


def torch_threads() -> int:
    """torch's intra-op CPU threads in this process (OMP_NUM_THREADS or torch's default)."""
    import torch

    return torch.get_num_threads()


def record_hydra(run_dir: Path, cfg: DictConfig) -> None:
    """What Hydra would have written at start (conf/hydra/default.yaml turns that off so that
    nothing is written before the claim): .hydra/{config,hydra,overrides}.yaml and the job's
    log file <job name>.log. No-op outside @hydra.main or when Hydra wrote them itself."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
    except ValueError:
        return
    if hydra_cfg.output_subdir is None:
        out = run_dir / ".hydra"
        out.mkdir(exist_ok=True)
        for name, node in (("config.yaml", cfg), ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
                           ("overrides.yaml", hydra_cfg.overrides.task)):
            with open(out / name, "x") as f:
                f.write(OmegaConf.to_yaml(node))
    start_log_file(run_dir / job_log_name())


_LOG_FILES: list[logging.Handler] = []


def start_log_file(path: Path) -> None:
    """Log to ``path`` until the task ends, as Hydra's file handler would (unless one is active)."""
    root = logging.getLogger()
    if any(isinstance(h, logging.FileHandler) for h in root.handlers):
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root.addHandler(handler)
    _LOG_FILES.append(handler)


def stop_log_files() -> None:
    """Close the log files start_log_file opened (each multirun job has its own)."""
    while _LOG_FILES:
        handler = _LOG_FILES.pop()
        logging.getLogger().removeHandler(handler)
        handler.close()


def job_log_name() -> str:
    """<job name>.log: train.log, or train_ddp_process_<rank>.log in DDP's extra processes."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return f"{HydraConfig.get().job.name}.log"
    except ValueError:
        return "run.log"


def write_json_once(path: Path, values: dict[str, Any]) -> None:
    """Write JSON to a new file; an existing file is an error, never overwritten."""
    with open(path, "x") as f:
        json.dump(values, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------- models
def model_config(cfg: DictConfig) -> ModelConfig:
    """ModelConfig from the ``model`` (sizes) and ``pe`` (encoding + options) groups. Problems
    are reported with the command-line keys (``model.d_model``, ``pe.randpe_max_position``)."""
    import tape.pe as pe_registry
    from tape.model import ConfigError, ModelConfig

    pe = OmegaConf.to_container(cfg.pe, resolve=True)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    try:
        mc = ModelConfig.from_groups(model, pe, pe_registry.option_names())
        pe_registry.check(mc)
        return mc
    except ConfigError as err:
        keys = ", ".join(f"pe.{k}" for k in pe if k != "name") or "none"
        raise PipelineConfigError(
            f"model=... / pe={cfg.pe.name} give an impossible model. Fields are set as "
            f"model.<field> (PE options as pe.<field>; this PE has: {keys}).\n{err}"
        ) from None


def check_position_range(mc: ModelConfig, eval_len: int, eval_key: str) -> None:
    """Fail when evaluation needs positions that an absolute-position PE never trained on."""
    import tape.pe as pe_registry

    bound = pe_registry.position_limit(mc)
    if bound is not None and eval_len > bound.limit:
        raise PipelineConfigError(
            f"pe={mc.pe} trains on positions in [0, {bound.limit}) (pe.{bound.option}, default "
            f"{bound.default}) but evaluation ({eval_key}) needs {eval_len} positions; "
            f"set pe.{bound.option}>={eval_len} or shorten the evaluation"
        )


def check_model_positions(model: Any, eval_len: int, eval_key: str) -> None:
    """:func:`check_position_range` for a built model: our DecoderLM carries its config
    (``model.cfg``); other models (Hugging Face) have no trained position range to check."""
    from tape.model import ModelConfig

    mc = getattr(model, "cfg", None)
    if isinstance(mc, ModelConfig):
        check_position_range(mc, eval_len, eval_key)


def evaluation_only(task: str) -> None:
    """What pipelines.train says to an evaluation task (passkey, perplexity)."""
    raise PipelineConfigError(
        f"task={task} is an evaluation task: train with another task, then run "
        f"python -m pipelines.evaluate run_dir=<run dir> task={task}"
    )


def require_int(cfg: DictConfig, *keys: str) -> None:
    """Each dotted key holds an integer (``seed=abc`` is named here, not by a traceback)."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PipelineConfigError(f"{key}={value!r} must be an integer")


def check_optim(cfg: DictConfig) -> None:
    """optim.* values AdamW or the schedule would refuse, named before any directory exists."""
    if cfg.get("optim") is None:
        return
    from tape.schedule import optim_problems

    values = OmegaConf.to_container(cfg.optim, resolve=True)
    try:
        problems = optim_problems(**values)
    except TypeError as err:  # a missing or misspelt key
        raise PipelineConfigError(f"optim: {err}") from None
    if problems:
        raise PipelineConfigError("; ".join(f"optim.{p}" for p in problems))


def check_trainer(cfg: DictConfig) -> None:
    """The last step must be validated (so last.ckpt and metrics hold the final model), and
    checkpoints must fall on optimizer steps (so a resumed run replays exactly)."""
    check_optim(cfg)
    require_int(cfg, "seed", "trainer.max_steps", "trainer.val_check_interval",
                "trainer.accumulate_grad_batches")
    t = cfg.trainer
    steps, every, accum = int(t.max_steps), int(t.val_check_interval), int(t.accumulate_grad_batches)
    if steps < 1 or every < 1 or accum < 1:
        raise PipelineConfigError(
            "trainer.max_steps, trainer.val_check_interval and trainer.accumulate_grad_batches "
            f"must be >= 1 (got {steps}, {every}, {accum})"
        )
    if every % accum or (steps * accum) % every:
        raise PipelineConfigError(
            f"trainer.val_check_interval={every} (in batches) must be a multiple of "
            f"trainer.accumulate_grad_batches={accum} and divide trainer.max_steps * "
            f"accumulate_grad_batches={steps * accum}; change trainer.val_check_interval"
        )


# ---------------------------------------------------------------------------- instantiation
def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a group like ``logger`` or ``callbacks`` (null entries skipped)."""
    from hydra.utils import instantiate

    if not group:
        return []
    return [instantiate(node) for node in group.values() if node and "_target_" in node]


def check_accelerator(trainer: DictConfig) -> None:
    """``trainer.accelerator`` / ``trainer.devices`` name hardware this machine has."""
    import torch

    acc, devices = str(trainer.get("accelerator", "cpu")), trainer.get("devices", 1)
    if acc in ("gpu", "cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise PipelineConfigError(
                f"trainer.accelerator={acc} but this machine has no usable CUDA GPU "
                "(torch.cuda.is_available() is False); use trainer=cpu, or run where there is a GPU"
            )
        wanted = list(devices) if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices) else []
        if any(int(i) >= n for i in wanted) or (isinstance(devices, int) and devices > n):
            raise PipelineConfigError(
                f"trainer.devices={devices}: this machine has {n} GPU(s) (indices 0..{n - 1}); "
                "pick with trainer.devices=[i] or CUDA_VISIBLE_DEVICES"
            )
    elif acc == "mps" and not (torch.backends.mps.is_available()):
        raise PipelineConfigError("trainer.accelerator=mps but MPS is not available; use trainer=cpu")


# Keys a resumed run may change: where outputs go and how they are logged (plus ckpt_path
# itself). The seed is not among them: a resumed run must replay the same data order.
RESUME_MAY_DIFFER = ("paths", "hydra", "logger", "callbacks", "ckpt_path", "evaluate",
                     "trainer.default_root_dir", "trainer.enable_progress_bar",
                     "trainer.enable_model_summary", "trainer.log_every_n_steps")


def _newest_run_checkpoint(cfg: DictConfig, run_dir: Path) -> Path:
    """checkpoints/last.ckpt of the newest earlier run of this experiment, PE and seed."""
    pattern = f"{cfg.experiment_name}/{cfg.pe.name}/{cfg.seed}/*/checkpoints/last.ckpt"
    found = [p for p in Path(cfg.paths.runs_dir).glob(pattern)
             if p.resolve().parents[1] != run_dir.resolve()]
    if not found:
        raise PipelineConfigError(
            f"ckpt_path=last: no {Path(cfg.paths.runs_dir) / pattern} to resume; train first "
            "or pass ckpt_path=<run dir or .ckpt file>"
        )
    return max(found, key=lambda p: (p.parents[1].name, p.stat().st_mtime))


def read_checkpoint_step(path: Path, key: str = "ckpt_path") -> int:
    """The global step of a Lightning checkpoint; fails naming ``key`` when the file is not one
    (truncated, corrupt, or some other file), instead of torch's unpickling advice."""
    return int(load_checkpoint(path, key)["global_step"])


def load_checkpoint(path: Path, key: str = "ckpt_path") -> dict[str, Any]:
    """A Lightning checkpoint (memory-mapped, on the CPU); a file that is not one fails with one
    message naming ``key``."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # noqa: BLE001 - any failure to read means "not a checkpoint"
        raise PipelineConfigError(  # torch's own error: HYDRA_FULL_ERROR=1
            f"{key}={path} is not a readable Lightning checkpoint (damaged, truncated or not "
            f"written by torch.save; {type(err).__name__}); pass another checkpoint or run "
            f"directory, or drop {key} to start afresh"
        ) from err
    if not isinstance(state, dict) or not {"state_dict", "global_step"} <= set(state):
        raise PipelineConfigError(
            f"{key}={path} is not a Lightning checkpoint (no state_dict / global_step); pass a "
            "checkpoints/*.ckpt file written by pipelines.train"
        )
    return state


def check_resumable(cfg: DictConfig, ckpt: Path, key: str = "ckpt_path") -> None:
    """A checkpoint can be resumed by this config: its run has not finished, its saved config
    differs from this one only in RESUME_MAY_DIFFER, and it is short of trainer.max_steps."""
    from tape.report.settings import describe, differences

    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    value = cfg.get("ckpt_path")
    if run is not None and (run / "metrics.json").is_file():
        raise PipelineConfigError(
            f"{key}={value}: {run} finished (metrics.json); there is nothing to resume. Drop "
            f"{key} to train a new run (a finished run is never continued or rewritten), or pass "
            f"{key}=<the directory of an unfinished run>"
        )
    if run is not None and (run / "config.yaml").is_file():
        saved = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=False)
        now = OmegaConf.to_container(cfg, resolve=True)
        diff = differences(now, saved, RESUME_MAY_DIFFER)
        if diff:
            was = {k: _get(saved, k) for k in diff}
            raise PipelineConfigError(
                f"{key}={value}: {ckpt} was trained with a different config; this run sets "
                f"{describe(diff)} where it had {describe(was)}. Resume with the same settings "
                f"(only {', '.join(RESUME_MAY_DIFFER[:4])} ... may change) or drop {key}"
            )
    step = read_checkpoint_step(ckpt, key)
    if step >= int(cfg.trainer.max_steps):
        raise PipelineConfigError(
            f"{key}={value}: {ckpt} is at step {step}, and trainer.max_steps={cfg.trainer.max_steps}; "
            "nothing is left to train"
        )


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def resolve_ckpt_path(cfg: DictConfig, run_dir: Path) -> Path | None:
    """``ckpt_path``: null = fresh start; ``last`` = checkpoints/last.ckpt of the newest earlier
    run of this experiment, PE and seed; a run directory; or a .ckpt file. The checkpoint is
    checked (check_resumable) before anything is written."""
    value = cfg.get("ckpt_path")
    if value in (None, ""):
        return None
    if value == "last":
        path = _newest_run_checkpoint(cfg, run_dir)
    else:
        path = Path(value)
        if path.is_dir():
            path = path / "checkpoints" / "last.ckpt"
        if not path.is_file():
            raise PipelineConfigError(
                f"ckpt_path={value}: {path} does not exist; pass last, a run directory or a .ckpt file"
            )
    check_not_live(path.parents[1] if path.parent.name == "checkpoints" else path.parent)
    check_resumable(cfg, path)
    return path


RUN_LOCK = "run.lock"  # "<pid> <host>" while the process that claimed the run directory lives


def lock_run_dir(run_dir: Path) -> None:
    """Mark ``run_dir`` as live (this process's PID and host) until ``unlock_run_dir``."""
    (run_dir / RUN_LOCK).write_text(f"{os.getpid()} {socket.gethostname()}\n")


def unlock_run_dir(run_dir: Path) -> None:
    lock = run_dir / RUN_LOCK
    try:
        if lock.read_text().split()[0] == str(os.getpid()):
            lock.unlink()
    except (OSError, IndexError):
        pass


def live_owner(run_dir: Path) -> int | None:
    """The PID of the live process training in ``run_dir`` on this host; None when none is (no
    lock, or a stale one left by a crash: its process is gone)."""
    try:
        pid_text, host = (run_dir / RUN_LOCK).read_text().split()[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if host != socket.gethostname() or pid == os.getpid():
        return None  # another machine's run cannot be checked from here; this process is us
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def check_not_live(run_dir: Path) -> None:
    """Refuse to resume from a run that is still training (its last.ckpt is still changing)."""
    if (pid := live_owner(run_dir)) is not None:
        raise PipelineConfigError(
            f"ckpt_path: {run_dir} is still training (PID {pid}); resuming it now would train beside "
            "it under the same W&B id. Wait for it to end (or stop it), then resume"
        )


def write_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str], path: Path) -> None:
    """A new CSV file (never overwritten) with ``fields`` as columns: a task's tidy results."""
    with open(path, "x", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
