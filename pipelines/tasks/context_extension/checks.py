"""The context-extension run's config checks: every impossible setting, named as on the
command line, before Lightning or transformers load (a typo reports in seconds)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipelines.config_checks import is_number, require_bool, require_int
from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import CONF_DIR
from pipelines.precision import training_precision
from pipelines.tasks.context_extension.data import check_inputs
from tape.hf_names import DTYPES, RECIPES
from tape.schedule import optim_problems
from tape.typecheck import type_problems

MIXED = ("16-mixed", "bf16-mixed")


def plain(node: Any) -> Any:
    """A config node as plain Python values (resolved); anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def recipe_spec(cfg: DictConfig, name: str) -> tuple[str, dict[str, Any]]:
    """(base recipe, keyword options) of the named recipe ``recipes.<name>``; the base recipe is
    its ``recipe`` key (default: the name itself), e.g. tape_mix -> tape with the mix post map."""
    options = dict(plain(cfg.recipes[name]))
    return str(options.pop("recipe", name)), options


def multiple_choice_task_config(cfg: DictConfig) -> DictConfig | None:
    """task=multiple_choice's settings from the ``eval`` section; None when it names no data."""
    e = cfg.eval
    if not e.get("multiple_choice_dir"):
        return None
    values = {"data_dir": str(e.multiple_choice_dir), "tokenizer": "context extension",
              "benchmarks": list(e.multiple_choice_benchmarks), "max_items": e.get("multiple_choice_max_items")}
    return OmegaConf.merge(OmegaConf.load(CONF_DIR / "task" / "multiple_choice.yaml"), values)


def _check_multiple_choice(cfg: DictConfig) -> None:
    """eval.multiple_choice_dir's files and eval.multiple_choice_max_items are usable (before any training)."""
    from pipelines.tasks import multiple_choice

    mc_cfg = multiple_choice_task_config(cfg)
    if mc_cfg is not None:
        try:
            multiple_choice.check(mc_cfg)
        except PipelineConfigError as err:
            message = str(err)
            for ours, theirs in (("data_dir", "dir"), ("benchmarks", "benchmarks"), ("max_items", "max_items")):
                message = message.replace(f"task.{ours}", f"eval.multiple_choice_{theirs}")
            raise PipelineConfigError(message) from None


def _check_maps_off(cfg: DictConfig) -> None:
    """eval.maps_off names extended TAPE models of this run."""
    names = cfg.eval.get("maps_off") or []
    if not (OmegaConf.is_list(names) or isinstance(names, list)):
        raise PipelineConfigError(f"eval.maps_off={names!r}: a list of recipe names, e.g. 'eval.maps_off=[tape]'")
    for name in names:
        if name not in cfg.extend.recipes:
            raise PipelineConfigError(f"eval.maps_off lists {name}, which extend.recipes does not train "
                                      f"({list(cfg.extend.recipes)}); add it there or remove it here")
        if recipe_spec(cfg, name)[0] != "tape":
            raise PipelineConfigError(f"eval.maps_off lists {name}, whose recipe is not tape: only TAPE "
                                      f"recipes have maps to switch off")


def _check_precision(cfg: DictConfig) -> None:
    precision = str(cfg.trainer.precision)
    if precision.endswith("-true") and not precision.startswith(("32", "64")):
        raise PipelineConfigError(
            f"trainer.precision={precision} would train the weights in low precision (Adam steps of "
            "lr 2e-5 vanish below half a bf16 ulp); use trainer.precision=bf16-mixed (autocast, fp32 "
            "weights and optimizer state) and model.frozen_dtype=float16 (a fp16 checkpoint's own dtype) or "
            "bfloat16 to store frozen weights small")
    training_precision(cfg)  # e.g. 64-true: trainable weights are fp32
    frozen = cfg.model.frozen_dtype
    if frozen not in DTYPES:
        raise PipelineConfigError(f"model.frozen_dtype={frozen}: choose one of {list(DTYPES)}")
    if frozen != "float32" and precision not in MIXED:
        raise PipelineConfigError(
            f"model.frozen_dtype={frozen} stores frozen weights in low precision, which only autocast "
            f"can multiply with fp32 activations: set trainer.precision=bf16-mixed (got {precision}) "
            "or model.frozen_dtype=float32")
    strategy = cfg.trainer.get("strategy")
    target = str(strategy.get("_target_", "")) if isinstance(strategy, DictConfig) else str(strategy or "")
    if frozen != "float32" and "fsdp" in target.lower():
        raise PipelineConfigError(
            f"trainer=fsdp shards units of one dtype: model.frozen_dtype={frozen} mixes {frozen} frozen and "
            "fp32 trainable weights in a unit; set model.frozen_dtype=float32 with trainer=fsdp")
    if cfg.eval.dtype not in DTYPES:
        raise PipelineConfigError(f"eval.dtype={cfg.eval.dtype}: choose one of {list(DTYPES)}")


# The integer keys of the training sections (base.*, extend.*) and the least each may be;
# passkey_rows is bounded by batch_size in validate().
SECTION_INTS = {
    "base": {"steps": 1, "batch_size": 1, "grad_accum": 1, "passkey_rows": 0, "passkey_min_tokens": 1,
             "warmup_steps": 0, "log_every": 1, "checkpoint_every": 1},
    "extend": {"context": 1, "steps": 1, "batch_size": 1, "grad_accum": 1, "passkey_rows": 0,
               "warmup_steps": 0, "log_every": 1, "checkpoint_every": 1},
}
OPTIM_KEYS = ("lr", "betas", "weight_decay", "warmup_steps", "schedule", "min_lr_ratio")  # as optim.*


def check_section(cfg: DictConfig, section: str) -> None:
    """The value types and ranges of ``base.*`` or ``extend.*`` (``extend.steps=abc``,
    ``base.schedule=cosin``), named as on the command line before anything trains."""
    s = cfg[section]
    require_int(s, *SECTION_INTS[section], prefix=f"{section}.")
    for key, least in SECTION_INTS[section].items():
        if s[key] < least:
            raise PipelineConfigError(f"{section}.{key}={s[key]} must be >= {least}")
    values = OmegaConf.to_container(s, resolve=True)
    optim = {k: values[k] for k in OPTIM_KEYS if k in values}
    betas = optim.get("betas", [0.9, 0.95])
    if not (isinstance(betas, list) and len(betas) == 2 and all(is_number(b) for b in betas)):
        raise PipelineConfigError(f"{section}.betas={betas!r} must be two numbers in [0, 1), e.g. "
                                  f"{section}.betas=[0.9,0.95]")
    problems = type_problems(optim_problems, optim) or optim_problems(**optim)
    if problems:  # e.g. base.schedule=cosin, named before a stage trains
        raise PipelineConfigError("; ".join(f"{section}.{p}" for p in problems))
    for key in ("passkey_weight", "grad_clip"):
        value = values.get(key)
        if key == "grad_clip" and value is None:
            continue  # no clipping
        if not (is_number(value) and value >= 0):  # nan too
            raise PipelineConfigError(f"{section}.{key}={value!r} must be a number >= 0"
                                      + (" (or null: no clipping)" if key == "grad_clip" else ""))
    if section == "extend":
        if not isinstance(values.get("gradient_checkpointing"), bool):
            raise PipelineConfigError(f"extend.gradient_checkpointing={values.get('gradient_checkpointing')!r} "
                                      "must be true or false")
        recipes = values.get("recipes")
        if not isinstance(recipes, list) or not all(isinstance(r, str) for r in recipes):
            raise PipelineConfigError(f"extend.recipes={recipes!r} must be a list of names under recipes.*, "
                                      f"e.g. extend.recipes=[tape,lora]")


def validate(cfg: DictConfig) -> None:
    """Every impossible setting, before anything loads or trains."""
    require_int(cfg, "model.context")
    for section in ("base", "extend"):
        check_section(cfg, section)
    C, T = int(cfg.model.context), int(cfg.extend.context)
    if T <= C:
        raise PipelineConfigError(f"extend.context={T} must exceed model.context={C}")
    for name in cfg.extend.recipes:
        if name not in cfg.recipes:
            raise PipelineConfigError(f"extend.recipes lists {name} but recipes.{name} (its base recipe and "
                                      f"options) is missing; defined: {list(cfg.recipes)}")
        recipe, options = recipe_spec(cfg, name)
        if recipe not in RECIPES:
            raise PipelineConfigError(f"recipes.{name}.recipe={recipe!r}: unknown recipe; choose from {list(RECIPES)}")
        if recipe == "longlora" and T % (2 * int(options.get("s2attn_groups", 4))):
            groups = int(options.get("s2attn_groups", 4))
            raise PipelineConfigError(
                f"extend.context={T} must split into recipes.{name}.s2attn_groups={groups} groups of "
                f"even size (a multiple of {2 * groups}) for LongLoRA's shifted sparse attention")
    _check_maps_off(cfg)
    for section in ("base", "extend"):
        s = cfg[section]
        if not 0 <= s.passkey_rows <= s.batch_size:
            raise PipelineConfigError(f"{section}.passkey_rows={s.passkey_rows} must be in [0, {section}.batch_size]")
    if cfg.base.passkey_rows and not cfg.model.pretrained_path and cfg.base.passkey_min_tokens > C:
        raise PipelineConfigError(f"base.passkey_min_tokens={cfg.base.passkey_min_tokens} must be <= "
                                  f"model.context={C} (base passkey prompts span base.passkey_min_tokens .. "
                                  "model.context tokens)")
    _check_precision(cfg)
    require_bool(cfg, "eval.passkey_kv_cache")
    _check_multiple_choice(cfg)
    if cfg.get("ckpt_path"):
        raise PipelineConfigError(
            f"ckpt_path={cfg.ckpt_path}: context extension resumes by itself; rerun the same command "
            "(a killed stage continues from its last checkpoint, finished stages are reused)")
    for n in cfg.eval.perplexity_lengths:
        if isinstance(n, bool) or not isinstance(n, int):
            raise PipelineConfigError(f"eval.perplexity_lengths: {n!r} is not an integer (tokens)")
        if n < 2:
            raise PipelineConfigError(f"eval.perplexity_lengths: {n} < 2 tokens")
    check_inputs(cfg)
