"""Alias of ``python -m pipelines.train`` for context extension, kept for older commands:
``python -m pipelines.extend [overrides]`` runs ``pipelines.train`` with the same overrides,
``experiment=context_extension/cpu`` unless an experiment is given."""

from __future__ import annotations

import runpy
import sys


def argv_with_experiment(argv: list[str]) -> list[str]:
    """The command-line overrides, with the cpu preset added when no experiment is chosen."""
    if any(a.lstrip("+~").startswith("experiment=") for a in argv):
        return argv
    return ["experiment=context_extension/cpu", *argv]  # first: a Hydra flag (--cfg job) may end the line


if __name__ == "__main__":
    sys.argv[1:] = argv_with_experiment(sys.argv[1:])
    # pipelines.train as the main module: its Hydra entry finds conf/ as it does when run itself
    runpy.run_module("pipelines.train", run_name="__main__", alter_sys=True)
