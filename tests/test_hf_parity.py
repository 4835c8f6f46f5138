"""Oracle test: our RoPE decoder equals transformers' LlamaForCausalLM with the same weights
(tiny random configs, no download), including grouped-query attention, linear
position interpolation and YaRN."""

import pytest
import torch

from tape.model import DecoderLM, ModelConfig


def _to_hf(model: DecoderLM):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, opts = model.cfg, model.pe.opts
    rope = {"rope_type": "default", "rope_theta": opts.rope_theta}
    if opts.rope_scaling != 1.0:
        rope = {"rope_type": "linear", "rope_theta": opts.rope_theta, "factor": opts.rope_scaling}
    if opts.rope_yarn_factor != 1.0:
        rope = {"rope_type": "yarn", "rope_theta": opts.rope_theta, "factor": opts.rope_yarn_factor,
                "original_max_position_embeddings": opts.rope_yarn_original_length}
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads, rms_norm_eps=cfg.norm_eps, rope_parameters=rope,
        max_position_embeddings=cfg.max_seq_len, tie_word_embeddings=False,
    )
    hf_cfg._attn_implementation = "eager"
    hf = LlamaForCausalLM(hf_cfg).eval()
    mapping = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
               "lm_head.weight": "lm_head.weight"}
    for i in range(cfg.n_layers):
        for ours, theirs in [("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")]:
            mapping[f"model.layers.{i}.{theirs}.weight"] = f"layers.{i}.{ours}.weight"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mapping[f"model.layers.{i}.self_attn.{proj}.weight"] = f"layers.{i}.attn.{proj}.weight"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            mapping[f"model.layers.{i}.mlp.{proj}.weight"] = f"layers.{i}.mlp.{proj}.weight"
    ours = model.state_dict()
    hf.load_state_dict({k: ours[v] for k, v in mapping.items()}, strict=True)
    return hf


YARN = dict(rope_yarn_factor=4.0, rope_yarn_original_length=256, rope_theta=500.0)


@pytest.mark.parametrize("overrides", [dict(), dict(n_kv_heads=2, pe_options=dict(rope_scaling=2.0, rope_theta=500.0)),
                                       dict(pe_options=YARN), dict(n_heads=2, pe_options={**YARN, "rope_theta": 10000.0})],
                         ids=["mha", "gqa-pi", "yarn", "yarn-d32"])
def test_rope_decoder_equals_hf_llama(overrides):
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(vocab_size=50, n_layers=2, d_model=64, n_heads=4, d_ff=96, pe="rope"), **overrides})
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(15)  # sharp attention, so positions matter
    hf = _to_hf(model)
    ids = torch.randint(0, 50, (2, 40))
    with torch.no_grad():
        ours, theirs = model(ids).logits, hf(ids).logits
    assert (ours - theirs).abs().max() < 1e-5
