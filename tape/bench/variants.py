"""The benchmarked variants: every PE once, TAPE twice (fused [V|E] call and two equal-width calls)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import tape.pe as pe_registry
from tape.model.config import ModelConfig


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a PE and, for TAPE, how A·V and A·E are computed."""

    label: str  # "tape_fused", "tape_unfused", "rope", ...
    pe: str
    fused: bool = True

    def config(self, base: ModelConfig) -> ModelConfig:
        """``base`` with this variant's PE and fusion switched in."""
        return base.replace(pe=self.pe, tape_fused=self.fused)


# The paper's Table 3/4 columns first, then the other encodings in registry order.
_HEAD = ("tape", "rope", "fire", "t5")


def make_variants(pes: Sequence[str]) -> list[Variant]:
    """Variants for the PE names given (order: TAPE fused/unfused, RoPE, FIRE, T5, the rest)."""
    unknown = sorted(set(pes) - set(pe_registry.names()))
    if unknown:
        raise ValueError(f"unknown PE(s) {unknown}; choose from {pe_registry.names()}")
    ordered = [p for p in _HEAD if p in pes] + sorted(p for p in set(pes) if p not in _HEAD)
    out: list[Variant] = []
    for pe in ordered:
        if pe == "tape":
            out += [Variant("tape_fused", "tape", True), Variant("tape_unfused", "tape", False)]
        else:
            out.append(Variant(pe, pe))
    return out
