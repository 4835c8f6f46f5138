"""``ckpt_path``: which checkpoint a run resumes, and whether this config may resume it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipelines.checkpoints import load_checkpoint
from pipelines.errors import PipelineConfigError
from pipelines.models import HPARAM_KEYS, module_hparams
from pipelines.run_dirs import live_owner
from tape.report.settings import describe, differences, flatten


# Keys a resumed run may change: where outputs go and how they are logged (plus ckpt_path
# itself). The seed is not among them: a resumed run must replay the same data order.
RESUME_MAY_DIFFER = ("paths", "hydra", "logger", "callbacks", "ckpt_path", "evaluate", "eval_precision",
                     "trainer.default_root_dir", "trainer.enable_progress_bar",
                     "trainer.enable_model_summary", "trainer.log_every_n_steps")


def _newest_run_checkpoint(cfg: DictConfig, run_dir: Path) -> Path:
    """checkpoints/last.ckpt of the newest earlier unfinished run of this experiment, PE and seed
    whose config this one may resume (an arm's settings beyond them, e.g. model.abacus, match);
    without one, the newest such run's, which ``check_resumable`` then refuses with its reason."""
    pattern = f"{cfg.experiment_name}/{cfg.pe.name}/{cfg.seed}/*/checkpoints/last.ckpt"
    found = [p for p in Path(cfg.paths.runs_dir).glob(pattern)
             if p.resolve().parents[1] != run_dir.resolve()]
    if not found:
        raise PipelineConfigError(
            f"ckpt_path=last: no {Path(cfg.paths.runs_dir) / pattern} to resume; train first "
            "or pass ckpt_path=<run dir or .ckpt file>"
        )
    found.sort(key=lambda p: (p.parents[1].name, p.stat().st_mtime), reverse=True)
    unfinished = [p for p in found if not (p.parents[1] / "metrics.json").is_file()]
    for path in unfinished:
        if not _config_differences(cfg, path.parents[1]):
            return path
    return (unfinished or found)[0]


def _config_differences(cfg: DictConfig, run: Path) -> dict[str, tuple[Any, Any]]:
    """{key: (this config's value, the run's)} where this config differs from the run's
    config.yaml (none without one), besides RESUME_MAY_DIFFER and the keys set from them
    (task.data_dir from paths.data_dir)."""
    if not (run / "config.yaml").is_file():
        return {}
    return _differences_from(cfg, OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=False))


def _differences_from(cfg: DictConfig, saved: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (this config's value, the saved config's)}, besides RESUME_MAY_DIFFER and the keys
    set from them."""
    now = OmegaConf.to_container(cfg, resolve=True)
    diff = differences(now, saved, (*RESUME_MAY_DIFFER, *_derived_keys(cfg)))
    return {k: (v, _get(saved, k)) for k, v in diff.items()}


def _derived_keys(cfg: DictConfig) -> list[str]:
    """Keys whose value interpolates a key that may differ on resume (paths.*, hydra, cwd),
    directly or through another such key."""
    raw = flatten(OmegaConf.to_container(cfg, resolve=False))
    sources = [*(f"${{{k}" for k in RESUME_MAY_DIFFER), "${hydra:", "${cwd:"]
    derived: list[str] = []
    while True:
        more = [k for k, v in raw.items() if k not in derived and isinstance(v, str)
                and any(s in v for s in sources)]
        if not more:
            return derived
        derived += more
        sources += [f"${{{k}}}" for k in more]


def _hparam_differences(cfg: DictConfig, hparams: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{config key: (this run's value, the checkpoint's)} where the module this config builds
    differs from the one the checkpoint's hyper_parameters record."""
    from pipelines.run_source import checkpoint_model
    from tape.model import ModelConfig

    now = module_hparams(cfg)
    saved = {k: v for k, v in hparams.items() if k in now}
    if "model" in saved:
        saved["model"] = ModelConfig.from_dict(checkpoint_model(saved["model"])).to_dict()
    a, b = (flatten({k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}) for d in (now, saved))
    if not (a.get("model.abacus") or b.get("model.abacus")):  # older checkpoints: digit ids null
        a = {k: v for k, v in a.items() if not k.startswith("model.abacus_")}
    return {HPARAM_KEYS.get(k, k): (a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]}


def check_resumable(cfg: DictConfig, ckpt: Path, key: str = "ckpt_path") -> None:
    """A checkpoint can be resumed by this config: its run has not finished, its saved config
    (for a checkpoint outside a run, the config it carries, or in older ones its
    hyper_parameters) differs from this one only in RESUME_MAY_DIFFER, and it is short of
    trainer.max_steps."""
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    value = cfg.get("ckpt_path")
    if run is not None and (run / "metrics.json").is_file():
        raise PipelineConfigError(
            f"{key}={value}: {run} finished (metrics.json); there is nothing to resume. Drop "
            f"{key} to train a new run (a finished run is never continued or rewritten), or pass "
            f"{key}=<the directory of an unfinished run>"
        )
    state = load_checkpoint(ckpt, key)
    if run is not None and (run / "config.yaml").is_file():
        pairs = _config_differences(cfg, run)
    elif (saved := saved_config(state)) is not None:  # moved out of its run: the config it carries
        pairs = _differences_from(cfg, saved)
    else:  # moved out of its run and older: what it recorded of the module
        pairs = _hparam_differences(cfg, state.get("hyper_parameters") or {})
    if pairs:
        diff, was = {k: a for k, (a, _) in pairs.items()}, {k: b for k, (_, b) in pairs.items()}
        raise PipelineConfigError(
            f"{key}={value}: {ckpt} was trained with a different config; this run sets "
            f"{describe(diff)} where it had {describe(was)}. Resume with the same settings "
            f"(only {', '.join(RESUME_MAY_DIFFER[:4])} ... may change), pass {key}=<the run "
            f"directory that has them>, or drop {key}"
        )
    step = int(state["global_step"])
    if step >= int(cfg.trainer.max_steps):
        raise PipelineConfigError(
            f"{key}={value}: {ckpt} is at step {step}, and trainer.max_steps={cfg.trainer.max_steps}; "
            "nothing is left to train"
        )


def saved_config(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved config of the run that wrote ``checkpoint``, kept by its
    ``pipelines.run_history.RunHistory`` callback (None in checkpoints from before it kept one)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if key.split("{")[0] == "RunHistory" and isinstance(state, dict) and state.get("config"):
            return state["config"]
    return None


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
