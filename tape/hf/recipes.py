"""Parameter-efficient context extension recipes (tape-spec B.3), one function call each.

Each applies linear position interpolation by target/original context, as in the paper, and
trains embeddings and norms besides its own parameters ("LoRA+" in LongLoRA's terms):
- ``tape``: TAPE's maps (+ embeddings and norms). ``train_post_attn=False`` freezes the
  post-attention map at zero, which is what the official code did (its name filter missed it).
- ``lora``: LoRA r=8, alpha=16, dropout 0 on q, k, v, o (via peft).
- ``longlora``: the LoRA recipe plus shifted sparse attention in training.
- ``theta``: rope_theta = 1e6 plus the LoRA recipe.
- ``embed_norm``: embeddings and norms alone, the part every recipe shares (a control: what
  TAPE's maps or LoRA's adapters add to it).
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from tape.hf_names import RECIPES

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def set_position_interpolation(model: nn.Module, factor: float, theta: float | None = None) -> None:
    """Linear position interpolation (positions / factor) and optionally a new rope_theta,
    rebuilding the model's rotary table. A base that interpolates linearly already composes
    (factors multiply); another scaling (llama3, yarn, dynamic) is refused, not replaced."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = model.config
    params = dict(config.rope_parameters)
    params["rope_theta"] = float(theta if theta is not None else params["rope_theta"])
    rope_type = params.get("rope_type", "default")
    if factor != 1.0:
        if rope_type not in ("default", "linear"):
            raise ValueError(
                f"the base model scales RoPE with rope_type={rope_type!r}; the context-extension "
                f"recipes interpolate positions linearly (tape-spec B.3) and would replace that "
                f"scaling: use a base with rope_type 'default' or 'linear' (Llama 2), or a "
                f"target context within the base's, which needs no interpolation")
        base_factor = float(params.get("factor", 1.0)) if rope_type == "linear" else 1.0
        params.update(rope_type="linear", factor=base_factor * float(factor))
    config.rope_parameters = params
    base = model.model
    device = base.embed_tokens.weight.device
    base.rotary_emb = LlamaRotaryEmbedding(config=config).to(device)


def _unfreeze_embeddings_and_norms(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        if "embed" in name or "norm" in name:
            p.requires_grad_(True)


def apply_recipe(
    model: nn.Module,
    recipe: str,
    target_context: int,
    original_context: int | None = None,
    *,
    train_post_attn: bool = True,
    lora_r: int = 8,
    lora_alpha: int = 16,
    theta: float = 1e6,
    s2attn_groups: int = 4,
    tape_options: dict[str, Any] | None = None,
) -> nn.Module:
    """Prepare a ``LlamaForCausalLM`` for context extension with one recipe; returns the model
    to train (a peft ``PeftModel`` for the LoRA recipes). The factor is
    ceil(target / original), original defaulting to config.max_position_embeddings."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {list(RECIPES)}")
    original = original_context or model.config.max_position_embeddings
    factor = float(math.ceil(target_context / original)) if target_context > original else 1.0
    set_position_interpolation(model, factor, theta if recipe == "theta" else None)
    model.config.max_position_embeddings = max(target_context, original)

    if recipe == "tape":
        from tape.hf.llama import add_tape

        model = add_tape(model, **(tape_options or {}))
        for name, p in model.named_parameters():
            trainable = ".pe." in name and (train_post_attn or ".post_attn." not in name)
            p.requires_grad_(trainable)
        _unfreeze_embeddings_and_norms(model)
        return model

    if recipe == "embed_norm":
        model.requires_grad_(False)
        _unfreeze_embeddings_and_norms(model)
        return model

    from peft import LoraConfig, get_peft_model

    if recipe == "longlora":
        from tape.hf.s2attn import register_s2attn

        model.config.s2attn_groups = s2attn_groups
        model.set_attn_implementation(register_s2attn())
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0,
                      target_modules=LORA_TARGETS, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    _unfreeze_embeddings_and_norms(model)
    return model


def trainable_parameters(model: nn.Module) -> dict[str, int]:
    """Name -> number of elements, for every parameter that will be trained."""
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
