"""The errors an entry point reports as one message (Hydra prints it with no traceback)."""

from __future__ import annotations

from hydra.errors import CompactHydraException


class PipelineConfigError(CompactHydraException, ValueError):
    """A config value cannot work; the message names the key (as on the command line) and the fix.

    Hydra prints a CompactHydraException as its message alone, once, with no traceback
    (HYDRA_FULL_ERROR=1 shows the traceback)."""


class RunNotThereYet(PipelineConfigError):
    """A setting asks for another run that has not finished (``task.pretrained_run=last``):
    a sweep's other jobs still start, and this job reports it at its turn."""


class JobFailed(CompactHydraException):
    """A multirun job failed; its own error was logged where it happened (printed once)."""


def evaluation_only(task: str) -> None:
    """What pipelines.train says to an evaluation task (passkey, perplexity)."""
    raise PipelineConfigError(
        f"task={task} is an evaluation task: train with another task, then run "
        f"python -m pipelines.evaluate run_dir=<run dir> task={task}"
    )
