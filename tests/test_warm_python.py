"""tests/warm_python.py runs ``python -m`` commands as a fresh interpreter would: the working
directory's modules first, the caller's environment, the exit status, the output, a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from warm_python import run_module

PROBE = """
import os, sys
import pipelines
print(sys.argv[1:], os.getcwd(), os.environ.get("PROBE_VALUE"), pipelines.__file__, "torch" in sys.modules)
if sys.argv[1:] == ["fail"]:
    raise ValueError("the probe failed")
if sys.argv[1:] == ["exit"]:
    sys.exit("a message and status 1")
if sys.argv[1:] == ["sleep"]:
    import time
    time.sleep(60)
"""


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    """A folder with probe.py and its own pipelines/ package, which must shadow the project's."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "__init__.py").write_text("")
    return tmp_path


def test_a_command_sees_its_arguments_directory_environment_and_its_own_modules(probe_dir: Path) -> None:
    done = run_module("probe", ["a", "b"], probe_dir, {**os.environ, "PROBE_VALUE": "42"})
    assert done.returncode == 0, done.stderr
    cwd, value, package, torch_loaded = done.stdout.split()[-4:]
    assert done.stdout.startswith("['a', 'b'] ") and cwd == str(probe_dir) and value == "42"
    assert package == str(probe_dir / "pipelines" / "__init__.py")  # the folder's, not the project's
    if os.environ.get("TAPE_TESTS_FRESH") != "1":
        assert torch_loaded == "True"  # preloaded: what the warm start saves


def test_failures_exit_as_the_interpreter_exits(probe_dir: Path) -> None:
    failed = run_module("probe", ["fail"], probe_dir)
    assert failed.returncode == 1 and "Traceback" in failed.stderr and "ValueError: the probe failed" in failed.stderr
    exited = run_module("probe", ["exit"], probe_dir)
    assert exited.returncode == 1 and exited.stderr.strip() == "a message and status 1"
    fresh = subprocess.run([sys.executable, "-m", "probe", "exit"], cwd=probe_dir, capture_output=True, text=True)
    assert (fresh.returncode, fresh.stderr) == (exited.returncode, exited.stderr)


def test_a_command_past_its_timeout_is_killed(probe_dir: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("probe", ["sleep"], probe_dir, timeout=2)


def test_a_setting_the_libraries_read_at_import_runs_fresh(probe_dir: Path) -> None:
    done = run_module("probe", [], probe_dir, {**os.environ, "OMP_NUM_THREADS": "7"})
    assert done.returncode == 0 and done.stdout.split()[-1] == "False"  # a fresh interpreter
