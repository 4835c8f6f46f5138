"""p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional
Encodings useful?"): RoPE with its lowest frequencies removed. The highest-frequency fraction
``prope_fraction`` of the d/2 channel pairs rotates exactly as in RoPE, at RoPE's own
frequencies; the other pairs are not rotated (angle 0), so they carry content only. Not Hugging
Face's ``partial_rotary_factor``, which respaces the kept frequencies over the whole spectrum.
p = 1 is RoPE; p = 0 is NoPE.
"""

from __future__ import annotations

from tape.pe import register
from tape.pe.rope import RoPE


@register("prope")
class PRoPE(RoPE):
    """RoPE rotating only the highest-frequency fraction ``prope_fraction`` of its pairs.
    Options: ``prope_fraction``, ``rope_theta``, ``rope_scaling``."""

    def rotating_fraction(self) -> float:
        return self.cfg.prope_fraction
