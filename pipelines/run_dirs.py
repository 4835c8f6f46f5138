"""Claiming a run directory (command.txt, config.yaml, .hydra/), its live-run lock, and cleanup."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import REPO_ROOT
from pipelines.logs import job_log_name, start_log_file

RUN_CLAIM = "command.txt"  # created exclusively: the run directory belongs to this run only


def is_rank_zero() -> bool:
    """True in the launching process; False in the extra processes DDP starts (they set RANK or
    LOCAL_RANK) and must not claim directories or write results."""
    return all(int(os.environ.get(k, 0)) == 0 for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def drop_unclaimed(run_dir: Path, stop: Path) -> None:
    """Remove the empty directories made for a run that failed before claiming one (its own and
    the empty folders above it below ``stop``: a training run's <experiment>/<pe>/<seed>, an
    evaluation's eval/), so no debris is left or counted as a run; a claimed or non-empty
    directory, and ``stop`` itself, are never touched."""
    stop = stop.resolve()
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


def job_command(entry: str) -> str:
    """The command that reruns exactly this job (for a multirun job: its own overrides only)."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # composed without @hydra.main (tests, notebooks)
        overrides = sys.argv[1:]
    return shlex.join(["python", "-m", entry, *overrides])


def claim_run_dir(run_dir: Path, cfg: DictConfig, entry: str) -> None:
    """Make ``run_dir`` this run's own: create command.txt exclusively (fail if another run has
    it), then save the resolved config, Hydra's record (.hydra/) and start the log file. Nothing
    that was there is ever overwritten."""
    from tape.bench.machine import machine_summary
    from tape.vcs import commit_label

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(run_dir / RUN_CLAIM, "x") as f:
            f.write(job_command(entry) + "\n")
            f.write(f"# launched as: {shlex.join([sys.executable, *sys.argv])}\n")
            f.write(f"# cwd: {os.getcwd()}\n# commit: {commit_label(REPO_ROOT)}\n# time: {time.ctime()}\n")
            f.write(f"# machine: {machine_summary()}\n")
            f.write(f"# threads: {torch_threads()}\n")  # CPU results depend on it (docs/reproduction.md)
            f.write(f"# versions: {stack_versions()}\n")  # so does compiled code (tape/model/compiling.py)
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


def stack_versions() -> str:
    """Python and the libraries a run's numbers depend on: ``python 3.11.9, torch 2.13.0, ...``."""
    from importlib.metadata import PackageNotFoundError, version

    found = [f"python {sys.version.split()[0]}"]
    for name in ("torch", "triton", "lightning", "transformers", "numpy"):
        loaded = getattr(sys.modules.get(name), "__version__", None)  # torch's names its build: +cu130
        try:
            found.append(f"{name} {loaded or version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def torch_threads() -> int:
    """torch's intra-op CPU threads in this process (OMP_NUM_THREADS or torch's default)."""
    import torch

    return torch.get_num_threads()


def record_hydra(run_dir: Path, cfg: DictConfig) -> None:
    """What Hydra would have written at start (conf/hydra/default.yaml turns that off so that
    nothing is written before the claim): .hydra/{config,hydra,overrides}.yaml and the job's
    log file <job name>.log. No-op outside @hydra.main or when Hydra wrote them itself."""
    try:
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
