"""``ckpt_path``: which checkpoint a run resumes, and whether this config may resume it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipelines.checkpoints import read_checkpoint_step
from pipelines.errors import PipelineConfigError
from pipelines.run_dirs import live_owner
from tape.report.settings import describe, differences


# Keys a resumed run may change: where outputs go and how they are logged (plus ckpt_path
# itself). The seed is not among them: a resumed run must replay the same data order.
RESUME_MAY_DIFFER = ("paths", "hydra", "logger", "callbacks", "ckpt_path", "evaluate", "eval_precision",
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


def check_resumable(cfg: DictConfig, ckpt: Path, key: str = "ckpt_path") -> None:
    """A checkpoint can be resumed by this config: its run has not finished, its saved config
    differs from this one only in RESUME_MAY_DIFFER, and it is short of trainer.max_steps."""
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


def check_not_live(run_dir: Path) -> None:
    """Refuse to resume from a run that is still training (its last.ckpt is still changing)."""
    if (pid := live_owner(run_dir)) is not None:
        raise PipelineConfigError(
            f"ckpt_path: {run_dir} is still training (PID {pid}); resuming it now would train beside "
            "it under the same W&B id. Wait for it to end (or stop it), then resume"
        )
