"""Tiny models for the library tests: sharp attention and non-zero PE weights, so that
positions really change the outputs and a broken property shows up as a large difference."""

from __future__ import annotations

import functools

import torch

import tape.pe
from tape.model import DecoderLM, ModelConfig

ALL_PES = tape.pe.names()


@functools.cache
def triton_interpreter_problem() -> str:
    """Why the Triton kernel cannot run on CPU tensors here ("" when it can): triton missing, or
    its interpreter failing (as triton 3.6's did with numpy >= 2.4 before our launches squeezed
    loop bounds)."""
    from tape.kernels import triton_available

    if not triton_available():
        return "needs triton (in requirements.txt)"
    import numpy as np
    import triton

    from tape.kernels.triton_attention import attention_forward

    try:
        attention_forward(*[torch.zeros(1, 1, 1, 16) for _ in range(4)], block=16)
    except Exception as err:  # noqa: BLE001 - any failure of the interpreter itself
        return (f"the Triton interpreter fails here (triton {triton.__version__}, numpy {np.__version__}: "
                f"{type(err).__name__}: {err})")
    return ""
SHIFT_INVARIANT_PES = [name for name in ALL_PES if tape.pe.get(name).relative]


def config(**values) -> ModelConfig:
    """ModelConfig whose PE options may be given beside the sizes (``tape_post_attn="rowsum"``);
    options of other encodings are dropped, so one set of overrides serves a RoPE and a TAPE."""
    flat = {k: values.pop(k) for k in list(values) if k in tape.pe.option_names()}
    pe = values.get("pe", "rope")
    own = set(tape.pe.get(pe).Options.names()) if pe in tape.pe.names() else set(flat)
    pe_options = {**values.pop("pe_options", {}), **{k: v for k, v in flat.items() if k in own}}
    return ModelConfig(**values, pe_options=pe_options)


def tiny_config(pe: str, **overrides) -> ModelConfig:
    values = dict(vocab_size=37, n_layers=2, d_model=32, n_heads=4, max_seq_len=32, pe=pe)
    values.update(overrides)
    return config(**values)


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


def phase_rotate(e: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """Multiply every z_b = c_b + i s_b by exp(i phase_b)."""
    c, s = e.chunk(2, dim=-1)
    cp, sp = phase.cos(), phase.sin()
    return torch.cat([c * cp - s * sp, c * sp + s * cp], dim=-1)
