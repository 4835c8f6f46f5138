"""The benchmarked variants: every PE once, TAPE once per way of computing A·V and A·E."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

import tape.pe as pe_registry
from tape.kernels import triton_available
from tape.model.config import ModelConfig

# label -> (tape_fused, attn_backend or None for the run's backend, what it is)
TAPE_MODES: dict[str, tuple[bool | str | None, str | None, str]] = {
    "fused": (True, None, "one QKᵀ: the Triton kernel on CUDA; on CPU one SDPA call, as auto"),
    "unfused": (False, None, "two equal-width attention calls (the paper's 'w/o fusion')"),
    "concat": ("concat", None, "one SDPA call with [V | E] as values"),
    "padded": ("padded", None, "one SDPA call, q and k zero-padded to [V | E]'s width"),
    "triton": (True, "triton", "the Triton [V | E] kernel (CUDA only)"),
    "flex": (True, "flex", "one QKᵀ through compiled FlexAttention, value [V | E] (CUDA only)"),
}
DEFAULT_TAPE_MODES = ("fused", "unfused", "concat", "padded", "triton", "flex")
CUDA_ONLY_MODES = ("triton", "flex")  # the Triton kernel; FlexAttention has no CPU backward


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a PE and, for TAPE, how A·V and A·E are computed."""

    label: str  # "tape_fused", "tape_unfused", "rope", ...
    pe: str
    fused: bool | str | None = True
    backend: str | None = None  # None: the run's attention backend
    needs_cuda: bool = False

    def config(self, base: ModelConfig) -> ModelConfig:
        """``base`` with this variant's PE, fusion and (if set) backend switched in."""
        cfg = base.replace(pe=self.pe, pe_options={"tape_fused": self.fused} if self.pe == "tape" else {})
        return cfg if self.backend is None else cfg.replace(attn_backend=self.backend)


# The paper's Table 3/4 columns first, then the other encodings in registry order.
_HEAD = ("tape", "rope", "fire", "t5")


def make_variants(pes: Sequence[str], tape_modes: Sequence[str] = DEFAULT_TAPE_MODES) -> list[Variant]:
    """Variants for the PE names given (order: TAPE's modes, RoPE, FIRE, T5, the rest)."""
    unknown = sorted(set(pes) - set(pe_registry.names()))
    if unknown:
        raise ValueError(f"unknown PE(s) {unknown}; choose from {pe_registry.names()}")
    bad = sorted(set(tape_modes) - set(TAPE_MODES))
    if bad:
        raise ValueError(f"unknown tape_modes {bad}; choose from {list(TAPE_MODES)}")
    ordered = [p for p in _HEAD if p in pes] + sorted(p for p in set(pes) if p not in _HEAD)
    out: list[Variant] = []
    for pe in ordered:
        if pe == "tape":
            for mode in tape_modes:
                fused, backend, _ = TAPE_MODES[mode]
                out.append(Variant(f"tape_{mode}", "tape", fused, backend, needs_cuda=mode in CUDA_ONLY_MODES))
        else:
            out.append(Variant(pe, pe))
    return out


def not_run_reason(v: Variant, device: torch.device) -> str | None:
    """Why a variant cannot run here (printed in its row), or None. Never faked."""
    if v.needs_cuda and device.type != "cuda":
        return "not run: no GPU"
    if v.backend == "triton" and not triton_available():
        return "not run: triton not installed"
    return None


def counted_on(v: Variant, cfg: ModelConfig, device: torch.device) -> ModelConfig:
    """The config counted for a run on ``device``: on CUDA tape_fused is one QKᵀ (the Triton
    kernel, or one SDPA call with [V | E]); elsewhere it is what runs there."""
    return counted_config(v, cfg, one_qk=device.type == "cuda")


def counted_config(v: Variant, cfg: ModelConfig, one_qk: bool = False) -> ModelConfig:
    """The config whose matrix products are counted on the meta device. The Triton kernel and
    FlexAttention cannot run there; their arithmetic is one [V | E] call's (one QKᵀ, A·V and
    A·E). ``one_qk``: count TAPE fused that way too (Table 3, a device-free count of the fused
    method)."""
    if v.backend in ("triton", "flex") or (one_qk and v.label == "tape_fused"):
        return cfg.replace(attn_backend="sdpa", pe_options={**cfg.pe_options, "tape_fused": "concat"})
    return cfg
