"""p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional
Encodings useful?"): RoPE with its lowest frequencies removed. The highest-frequency fraction
``prope_fraction`` of the d/2 channel pairs rotates exactly as in RoPE, at RoPE's own
frequencies; the other pairs are not rotated (angle 0), so they carry content only. Not Hugging
Face's ``partial_rotary_factor``, which respaces the kept frequencies over the whole spectrum.
p = 1 is RoPE; p = 0 is NoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tape.pe import register
from tape.pe.base import RotaryOptions
from tape.pe.rope import RoPE

if TYPE_CHECKING:
    from tape.model.config import ModelConfig


@dataclass
class PRoPEOptions(RotaryOptions):
    prope_fraction: float = 0.75
    """Share of RoPE's frequency pairs that rotate, the highest ones (1 = RoPE, 0 = NoPE)."""

    def problems(self, cfg: ModelConfig) -> list[str]:
        problems = super().problems(cfg)
        if not 0.0 <= self.prope_fraction <= 1.0:
            problems.append(f"prope_fraction={self.prope_fraction} must be in [0, 1] (1 = RoPE, 0 = NoPE)")
        return problems


@register("prope")
class PRoPE(RoPE):
    """RoPE rotating only the highest-frequency fraction ``prope_fraction`` of its pairs.
    Options: ``prope_fraction``, ``rope_theta``, ``rope_scaling``."""

    display = "p-RoPE"
    Options = PRoPEOptions

    def rotating_fraction(self) -> float:
        return self.opts.prope_fraction
