"""Paired initialisation: seed s gives every PE the same initial shared weights.

The weights a RoPE model draws from ``torch.manual_seed(seed)`` are copied into the model of any
PE (embeddings, attention, MLP, norms, head: every parameter whose name and shape match); only
the PE's own parameters (TAPE's E maps, FIRE's MLP, T5's bias table) keep their own seeded
initialisation. TAPE zeroes W1 and its post-attention map, so TAPE and RoPE with one seed are
the same function at step 0, and a RoPE model is bit-for-bit the reference itself. Runs with
the same seed therefore differ in the PE alone: they are a pair (DESIGN.md "Evidence").
"""

from __future__ import annotations

import torch

import tape.pe as pe_registry
from tape.model.config import ConfigError, ModelConfig
from tape.model.decoder import DecoderLM

REFERENCE_PE = "rope"
FALLBACK_PE = "nope"  # when the sizes cannot hold a rotary PE (odd head dim): no PE weights at all


def reference_model(cfg: ModelConfig, seed: int) -> DecoderLM:
    """The RoPE (else NoPE) model of ``cfg``'s sizes drawn from ``seed``; the global torch RNG
    is left as it was."""
    shared = pe_registry.get(REFERENCE_PE).Options.names()  # e.g. TAPE's rope_theta
    try:
        ref_cfg = cfg.replace(pe=REFERENCE_PE, pe_options={k: v for k, v in cfg.pe_options.items() if k in shared})
        pe_registry.check(ref_cfg)
    except ConfigError:
        ref_cfg = cfg.replace(pe=FALLBACK_PE, pe_options={})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DecoderLM(ref_cfg)


@torch.no_grad()
def pair_initial_weights(model: DecoderLM, seed: int) -> list[str]:
    """Overwrite ``model``'s shared parameters with the reference model's for ``seed``; returns
    the names of the parameters that were copied (the rest are the PE's own)."""
    reference = dict(reference_model(model.cfg, seed).named_parameters())
    copied = []
    for name, param in model.named_parameters():
        ref = reference.get(name)
        if ref is not None and ref.shape == param.shape:
            param.copy_(ref)
            copied.append(name)
    return copied
