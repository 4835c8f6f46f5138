"""``python -m <module> <args>`` for the command-line tests, forked from a warm interpreter.

A fresh interpreter spends ~10 s importing torch, Lightning and what Lightning imports (torchmetrics
loads transformers and scipy.signal) before a two-second smoke run starts. Here each command runs
in a process forked by multiprocessing's forkserver, which imported those third-party libraries
once per test worker; the command itself runs as ``python -m`` runs it: its own process, working
directory, environment, ``sys.argv`` and ``sys.path`` (the working directory first, then
PYTHONPATH), ``__main__``, exit code and captured output. Nothing of this project is preloaded, so
its modules (and their per-process state, like the run id) load fresh in every command.

Tests whose subject is the fresh interpreter itself (what a command imports before its checks)
call ``subprocess`` directly. ``TAPE_TESTS_FRESH=1`` runs every command fresh as well.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from multiprocessing import forkserver
from pathlib import Path
from typing import Mapping, Sequence

PRELOAD = ["torch", "torch._dynamo", "lightning.pytorch", "hydra", "omegaconf", "scipy.stats",
           "matplotlib.figure", "matplotlib.backends.backend_agg"]
"""Third-party only: a preloaded module of this project would be shared by every command."""

READ_AT_IMPORT = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                  "CUDA_VISIBLE_DEVICES", "TORCH_LOGS")
"""Environment variables the preloaded libraries read as they load: a command that sets one
differently from the forkserver's environment runs fresh."""

_context = None
_server_env: dict[str, str] = {}


def run_module(module: str, args: Sequence[str], cwd: str | Path, env: Mapping[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m module *args`` in ``cwd`` with ``env`` (default: this process's), its stdout
    and stderr captured as text; raises subprocess.TimeoutExpired after ``timeout`` seconds."""
    env = dict(os.environ if env is None else env)
    command = [sys.executable, "-m", module, *args]
    server_env = _server_env if _context is not None else os.environ  # the forkserver starts with os.environ
    if os.environ.get("TAPE_TESTS_FRESH") == "1" or any(env.get(k) != server_env.get(k) for k in READ_AT_IMPORT):
        # fresh: asked for, or a setting the preloaded libraries read when they loaded
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="warm-python-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        process = _forkserver().Process(target=_run, args=(module, list(args), str(cwd), env, str(out), str(err)))
        process.start()
        process.join(timeout)
        timed_out = process.exitcode is None
        if timed_out:  # the command and whatever it started (a DDP rank)
            os.killpg(process.pid, signal.SIGKILL)
            process.join()
        stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(command, process.exitcode, stdout, stderr)


def _forkserver():
    """This worker's forkserver context, its libraries imported once when it first starts."""
    global _context, _server_env
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()  # now, with this environment
        _server_env = dict(os.environ)
    return _context


def _run(module: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: become ``python -m module *args`` and exit as it would."""
    os.setpgrp()
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(handle, fd)
        os.close(handle)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    installed = [p for p in sys.path if p and p.startswith((sys.prefix, sys.base_prefix))]
    sys.path[:] = [cwd, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p], *installed]
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # multiprocessing skips them; the interpreter runs them at exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
