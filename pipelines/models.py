"""The ModelConfig of a config's ``model`` and ``pe`` groups, and the positions it trained on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from pipelines.errors import PipelineConfigError

if TYPE_CHECKING:
    from tape.model import ModelConfig


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


HPARAM_KEYS = {"lr": "optim.lr", "betas": "optim.betas", "eps": "optim.eps",
               "weight_decay": "optim.weight_decay", "warmup_steps": "optim.warmup_steps",
               "schedule": "optim.schedule", "min_lr_ratio": "optim.min_lr_ratio",
               "total_steps": "trainer.max_steps", "seed": "seed"}
"""CausalLMModule's arguments besides the model, and the config keys that set them."""


def module_hparams(cfg: DictConfig) -> dict[str, Any]:
    """The arguments ``pipelines.train`` builds its CausalLMModule with (what a checkpoint's
    hyper_parameters record), without how it runs (compile)."""
    o = cfg.optim
    return dict(model=model_config(cfg).to_dict(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                weight_decay=o.weight_decay, warmup_steps=o.warmup_steps, schedule=o.schedule,
                min_lr_ratio=o.min_lr_ratio, total_steps=cfg.trainer.max_steps, seed=cfg.seed)


def check_model_vocab(mc: ModelConfig, need: int, vocabulary: str) -> None:
    """Fail when model.vocab_size cannot hold the task's ``need`` tokens (its ``vocabulary``)."""
    if mc.vocab_size < need:
        raise PipelineConfigError(f"model.vocab_size={mc.vocab_size} is smaller than the {vocabulary} "
                                  f"({need}); leave it at ${{task.vocab_size}}")


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
