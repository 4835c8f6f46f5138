"""The run's log file (as Hydra's file handler would write it) and quieting known console noise."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from hydra.core.hydra_config import HydraConfig


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
        return f"{HydraConfig.get().job.name}.log"
    except ValueError:
        return "run.log"


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
