"""How every entry point runs: its ``__main__`` (run_entry) and the wrapper of its task."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pipelines.errors import JobFailed, PipelineConfigError
from pipelines.logs import stop_log_files
from pipelines.preflight import preflight, unknown_choice
from pipelines.run_dirs import RUN_CLAIM, drop_unclaimed, is_rank_zero, unlock_run_dir
from pipelines.summaries import multirun_summary, run_summary
from pipelines.wandb_log import close_loggers

log = logging.getLogger("pipelines")
F = TypeVar("F", bound=Callable[..., Any])


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # composed without @hydra.main (tests, notebooks)
        return False


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
                    drop_unclaimed(run_dir, _kept_above(cfg))
                where = str(run_dir) if claimed else "none (the run failed its checks before claiming a directory)"
                JOBS.append({"entry": fn.__name__, "cfg": cfg, "run_dir": where, "failed": failed,
                             "error": error.splitlines()[0] if error else "",
                             "metrics": out if isinstance(out, dict) else {}})
                if not failed:
                    print(run_summary(JOBS[-1]), flush=True)
                print(f"run dir: {where}" + (" (failed)" if failed else ""), flush=True)
            stop_log_files()

    return wrapped  # type: ignore[return-value]


def _kept_above(cfg: DictConfig) -> Path:
    """The folder a failed run's cleanup stops at: the evaluated run for an evaluation (its
    ``<run_dir>/eval/``), else the parent of ``paths.runs_dir``."""
    if OmegaConf.select(cfg, "run_dir") is not None:
        return Path(cfg.run_dir)
    return Path(cfg.paths.runs_dir).parent


def multirun_flag_first(argv: list[str]) -> list[str]:
    """``argv`` with ``-m`` / ``--multirun`` moved to the front: after an override, Hydra's
    argument parser ended the overrides there and refused the rest with its usage text."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return flags + [a for a in argv if a not in flags]


def run_entry(main: Callable[[], Any], argv: list[str], config_name: str = "config",
              check_job: Callable[[DictConfig], None] | None = None) -> None:
    """``__main__`` of an entry point: reject unknown config choices, the failures Hydra would
    meet while creating the run directory, and (``check_job``) any job of a sweep whose settings
    fail, at once (preflight); run Hydra's ``main``, and end a multirun with its summary
    (printed even when a job failed)."""
    if message := unknown_choice(argv):
        sys.exit(message)
    argv = sys.argv[1:] = multirun_flag_first(argv)  # Hydra's parser took `a=1 -m b=2` as usage
    try:
        preflight(config_name, argv, check_job)
    except PipelineConfigError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(str(err))
    try:
        main()
    finally:
        if len(JOBS) > 1 or {"-m", "--multirun"} & set(argv):
            print(multirun_summary(JOBS), flush=True)
