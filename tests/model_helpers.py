"""Tiny models for the library tests: sharp attention and non-zero PE weights, so that
positions really change the outputs and a broken property shows up as a large difference."""

from __future__ import annotations

import torch

from tape.model import DecoderLM, ModelConfig

ALL_PES = ["alibi", "fire", "nope", "prope", "randpe", "rope", "t5", "tape", "xpos"]
SHIFT_INVARIANT_PES = ["alibi", "nope", "prope", "rope", "t5", "tape", "xpos"]


def tiny_config(pe: str, **overrides) -> ModelConfig:
    values = dict(vocab_size=37, n_layers=2, d_model=32, n_heads=4, max_seq_len=32, pe=pe)
    values.update(overrides)
    return ModelConfig(**values)


def randomize(model: DecoderLM, seed: int = 0, qk_std: float = 0.35, pe_std: float = 0.1) -> DecoderLM:
    """Sharpen attention (large q/k weights) and give every PE parameter a non-zero value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=gen) * qk_std)
            elif ".pe." in name and p.dim() > 0:
                p.copy_(torch.randn(p.shape, generator=gen) * pe_std)
    return model


def tiny_model(pe: str, dtype: torch.dtype = torch.float32, seed: int = 0, random_pe: bool = True, **overrides) -> DecoderLM:
    torch.manual_seed(seed)
    model = DecoderLM(tiny_config(pe, **overrides))
    if random_pe:
        randomize(model, seed)
    return model.to(dtype).eval()
