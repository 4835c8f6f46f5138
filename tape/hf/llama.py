"""TAPE inside a pretrained Hugging Face Llama (tape-spec B): ``add_tape(model)``.

Every decoder layer gets a ``pe`` module (TAPE's maps, ``tape.pe.tape.TAPELayer``) and the model
runs its own layer loop, so E flows from layer to layer; all original parameter names stay as
they were. Layer 0's E is the model's own rotary table (``model.model.rotary_emb``: its
rope_theta and linear position interpolation included), and TAPE's maps start at zero, so at
initialisation the logits equal the original model's. Grouped-query models (Llama 3) keep E per
key/value head.

The converted model is a ``TapeLlamaForCausalLM`` with a ``TapeLlamaConfig`` (model_type
``tape_llama``): ``save_pretrained`` writes TAPE's weights and options (``config.tape``), and
both ``TapeLlamaForCausalLM.from_pretrained(dir)`` and ``AutoModelForCausalLM.from_pretrained(dir)``
reload it (importing ``tape.hf`` registers the classes with the Auto factories).
``TapeLlamaForCausalLM.from_pretrained(<plain Llama dir>)`` converts a plain Llama on loading:
TAPE's maps, missing from the checkpoint, start at TAPE's identity init, so the model equals the
Llama. Decoding uses our KV cache (``tape.model.KVCache``), through
``tape.model.generate.greedy_generate``; HF ``generate()`` works with ``use_cache=False`` only
(its cache has no room for E rows) and otherwise fails naming greedy_generate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, LlamaModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from tape.model.cache import KVCache
import tape.pe as pe_registry
from tape.model.config import ConfigError, ModelConfig
from tape.model.decoder import attention_forward, prepare_positions
from tape.pe.base import PositionState
from tape.pe.tape import TAPELayer

DEFAULT_TAPE_OPTIONS: dict[str, Any] = {
    "position_size": None,  # I; None = 4 * num_attention_heads (128 for Llama-2-7B)
    "post_attn": "mix",
    "zero_init": "w1",
    "attn_update": True,
    "mlp_update": True,
    "fused": None,  # None = auto, see tape.pe.tape.TAPEOptions.tape_fused
    "attn_backend": "auto",
}


def tape_config_for(hf_config: Any, options: dict[str, Any]) -> ModelConfig:
    """The ModelConfig that TAPE's layers need, read from a Llama config."""
    unknown = sorted(set(options) - set(DEFAULT_TAPE_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown TAPE option(s) {unknown}; valid: {sorted(DEFAULT_TAPE_OPTIONS)}")
    opts = {**DEFAULT_TAPE_OPTIONS, **options}
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    if head_dim * hf_config.num_attention_heads != hf_config.hidden_size:
        raise ConfigError(
            f"head_dim={head_dim} x num_attention_heads={hf_config.num_attention_heads} != "
            f"hidden_size={hf_config.hidden_size}; add_tape supports Llama layouts where they match"
        )
    cfg = ModelConfig(
        vocab_size=hf_config.vocab_size, n_layers=hf_config.num_hidden_layers,
        d_model=hf_config.hidden_size, n_heads=hf_config.num_attention_heads,
        n_kv_heads=hf_config.num_key_value_heads, d_ff=hf_config.intermediate_size,
        max_seq_len=hf_config.max_position_embeddings, norm_eps=hf_config.rms_norm_eps,
        init_std=getattr(hf_config, "initializer_range", 0.02), attn_backend=opts["attn_backend"],
        pe="tape", pe_options=dict(
            rope_theta=float(hf_config.rope_parameters["rope_theta"]),
            tape_position_size=opts["position_size"], tape_post_attn=opts["post_attn"],
            tape_zero_init=opts["zero_init"], tape_attn_update=opts["attn_update"],
            tape_mlp_update=opts["mlp_update"], tape_fused=opts["fused"]),
    )
    pe_registry.check(cfg)
    return cfg


class TapeLlamaConfig(LlamaConfig):
    """A Llama config plus TAPE's options (``tape``: see ``DEFAULT_TAPE_OPTIONS``)."""

    model_type = "tape_llama"

    def __init__(self, tape: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.tape = tape
        super().__init__(**kwargs)


def _init_tape_layer(pe: TAPELayer, std: float) -> None:
    """TAPE's identity init: its linear maps ~ N(0, std), then the post map and W1 (or W2) at zero."""
    with torch.no_grad():
        for lin in pe.modules():
            if isinstance(lin, nn.Linear):
                nn.init.normal_(lin.weight, std=std)
    pe.init_weights(std)


class TapeDecoderLayer(nn.Module):
    """A Llama decoder layer (HF's LlamaDecoderLayer, converted in place: the same submodules and
    parameter names) plus TAPE's maps ``pe``, run through its own call: a shard unit of FSDP
    gathers its weights only when the layer itself is called. Not a subclass of HF's layer, whose
    gradient-checkpointing hooks (on ``__call__`` in transformers 5.17, on ``forward`` in 5.23)
    would checkpoint again inside TapeLlamaModel's own checkpointing."""

    self_attn: nn.Module
    mlp: nn.Module
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module
    pe: TAPELayer

    def forward(self, x: Tensor, state: PositionState, mask: Tensor | None, cache: KVCache | None,
                idx: int, cfg: ModelConfig) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        """x (B, N, C), state (E in state.rot) -> (x after the layer, E after its update)."""
        attn_out, extra_out = attention_forward(
            self.self_attn, self.input_layernorm(x), self.pe, state, mask, cache, idx,
            heads=(cfg.n_heads, cfg.kv_heads, cfg.head_dim), backend=cfg.attn_backend,
            fuse=cfg.pe_options.get("tape_fused"),
        )
        x = x + attn_out
        state = self.pe.after_attention(state, extra_out)
        m = self.mlp(self.post_attention_layernorm(x))
        state = self.pe.after_mlp(state, m)
        return x + m, state.rot


def _attach_tape_layers(model: LlamaModel, cfg: ModelConfig) -> None:
    """Give every decoder layer its TAPE maps, initialised so that E stays the RoPE table."""
    ref = model.embed_tokens.weight
    for idx, layer in enumerate(model.layers):
        layer.__class__ = TapeDecoderLayer  # same submodules and names, TAPE's forward
        pe = TAPELayer(cfg, pe_registry.options(cfg), updates_e=idx < cfg.n_layers - 1)
        _init_tape_layer(pe, cfg.init_std)
        layer.pe = pe.to(device=ref.device, dtype=ref.dtype)


class TapeLlamaModel(LlamaModel):
    """LlamaModel whose layer loop carries TAPE's E stream. Built by ``add_tape``."""

    tape_cfg: ModelConfig

    def _apply(self, fn: Any, recurse: bool = True) -> "TapeLlamaModel":
        """Casts (``.to(torch.bfloat16)``, ``.half()``) move the rotary frequencies but keep them
        fp32: layer 0's E is built from them, and bf16 frequencies put radians of error at 4k."""
        kept = {name: buf for name, buf in self.rotary_emb.named_buffers(recurse=False) if buf.is_floating_point()}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = getattr(self.rotary_emb, name)
            if torch.finfo(after.dtype).bits < torch.finfo(before.dtype).bits:
                setattr(self.rotary_emb, name, before.to(after.device))
        return self

    def _layer(self, idx: int, x: Tensor, rot: Tensor, state: PositionState, mask, cache):
        state = state if state.rot is rot else state.with_rot(rot)
        return self.layers[idx](x, state, mask, cache, idx, self.tape_cfg)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values: KVCache | None = None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if past_key_values is not None and not isinstance(past_key_values, KVCache):
            raise TypeError(
                "a TAPE Llama keeps E rows in its own cache (tape.model.KVCache), which Hugging "
                "Face's generate() cannot create: decode with "
                "tape.model.generate.greedy_generate(model, input_ids, max_new_tokens) (cached), "
                "or call generate(..., use_cache=False) (recomputes the prefix every token, as "
                "the official passkey script did)"
            )
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # (B, N, C)
        ids_like = x[..., 0].long() if input_ids is None else input_ids
        cfg = self.tape_cfg
        cache = past_key_values if past_key_values is not None else (
            KVCache(cfg.n_layers) if use_cache else None
        )
        position_ids, key_pos, mask = prepare_positions(ids_like, position_ids, attention_mask, cache)
        # (B, N, d), duplicated halves; asked for in float32 (float64 in a float64 model), E's
        # dtype at every layer
        e_dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = self.rotary_emb(x[..., :1].to(e_dtype), position_ids=position_ids)
        half = cos.shape[-1] // 2
        rot = torch.cat([cos[..., :half], sin[..., :half]], dim=-1)[:, None]  # (B, 1, N, d)
        rot = rot.expand(-1, cfg.kv_heads, -1, -1)  # (B, He, N, d): E at layer 0
        state = PositionState(query_pos=position_ids, key_pos=key_pos, rot=rot)
        for idx in range(cfg.n_layers):
            if self.gradient_checkpointing and self.training and cache is None:
                x, rot = checkpoint(self._layer, idx, x, rot, state, mask, None, use_reentrant=False)
            else:
                x, rot = self._layer(idx, x, rot, state, mask, cache)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), past_key_values=cache)


class TapeLlamaForCausalLM(LlamaForCausalLM):
    """A Llama causal LM with TAPE. ``from_pretrained`` on a directory written by
    ``save_pretrained`` of a converted model restores TAPE's weights and options; on a plain
    Llama directory it converts the model, TAPE starting at identity."""

    config_class = TapeLlamaConfig
    _no_split_modules = ["TapeDecoderLayer"]  # device_map="auto" keeps a layer on one device

    def __init__(self, config: Any) -> None:
        if not isinstance(config, TapeLlamaConfig):
            config.__class__ = TapeLlamaConfig  # saved as model_type tape_llama from now on
        super().__init__(config)
        _convert_base(self.model, dict(getattr(config, "tape", None) or {}))
        config.tape = self.model.tape_options
        _uncached_generation(self)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, TAPELayer):  # HF's init must not undo TAPE's zeros
            module.init_weights(self.config.initializer_range)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """As ``PreTrainedModel.from_pretrained``; TAPE maps missing from the checkpoint (a plain
        Llama directory) get TAPE's identity init. Transformers initialises missing weights
        module by module, which draws the zero-initialised maps at random."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = set(info.get("missing_keys", ()))
        for idx, layer in enumerate(model.model.layers):
            if any(key.startswith(f"model.layers.{idx}.pe.") for key in missing):
                _init_tape_layer(layer.pe, model.config.initializer_range)
        _uncached_generation(model)  # a saved plain Llama's generation_config says use_cache
        return (model, info) if want_info else model


def _uncached_generation(model: LlamaForCausalLM) -> None:
    """Hugging Face's ``generate()`` cannot build TAPE's cache (E rows per layer), so it runs
    uncached by default (the prefix recomputed per token, as the official passkey code);
    ``tape.model.generate.greedy_generate`` decodes with the cache."""
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = False


def _convert_base(base: LlamaModel, options: dict[str, Any]) -> None:
    cfg = tape_config_for(base.config, options)
    base.__class__ = TapeLlamaModel
    base.tape_cfg = cfg
    base.tape_options = {**DEFAULT_TAPE_OPTIONS, **options}
    _attach_tape_layers(base, cfg)


def add_tape(model: LlamaForCausalLM, **options: Any) -> TapeLlamaForCausalLM:
    """Put TAPE into a transformers ``LlamaForCausalLM`` (in place; also returned).

    options: position_size, post_attn ('mix' | 'rowsum'), zero_init ('w1' | 'w2'),
    attn_update, mlp_update, fused, attn_backend; see ``DEFAULT_TAPE_OPTIONS``.
    """
    if isinstance(model, TapeLlamaForCausalLM):
        raise ValueError("this model already has TAPE")
    if not isinstance(model, LlamaForCausalLM) or not isinstance(model.model, LlamaModel):
        raise TypeError(
            f"add_tape expects a transformers LlamaForCausalLM, got {type(model).__name__}; "
            "models with the same layout (Llama 2/3, grouped-query) load as LlamaForCausalLM"
        )
    _convert_base(model.model, options)
    model.__class__ = TapeLlamaForCausalLM
    model.config.__class__ = TapeLlamaConfig  # saved as model_type tape_llama: AutoModel reloads TAPE
    model.config.tape = model.model.tape_options
    model.config.architectures = ["TapeLlamaForCausalLM"]
    _uncached_generation(model)
    return model


def switch_off_maps(model: TapeLlamaForCausalLM) -> int:
    """Zero every TAPE layer's post-attention map and its MLP's first factor W1 (in place): both
    E updates vanish, E stays the rotary table in every layer, and the model computes the plain
    Llama with its other (trained) weights. Returns the number of layers that update E."""
    if not isinstance(getattr(model, "model", None), TapeLlamaModel):
        raise TypeError(f"switch_off_maps expects a model with TAPE (add_tape), got {type(model).__name__}")
    updating = 0
    with torch.no_grad():
        for pe in (m for m in model.modules() if isinstance(m, TAPELayer)):
            if pe.post_attn is not None:
                pe.post_attn.weight.zero_()
            if pe.x_proj is not None:
                pe.w1.weight.zero_()  # the MLP adds M·E, M = W2 diag(gate) W1 per token
            updating += pe.post_attn is not None or pe.x_proj is not None
    return updating


def register_auto_classes() -> None:
    """Let ``AutoConfig`` / ``AutoModelForCausalLM.from_pretrained`` load saved TAPE models."""
    AutoConfig.register(TapeLlamaConfig.model_type, TapeLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(TapeLlamaConfig, TapeLlamaForCausalLM, exist_ok=True)
