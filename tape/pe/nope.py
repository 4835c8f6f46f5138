"""NoPE: no positional signal at all; the causal mask alone breaks permutation symmetry."""

from __future__ import annotations

from tape.pe import register
from tape.pe.base import PositionalEncoding


@register("nope")
class NoPE(PositionalEncoding):
    """No parameters, no options."""

    display = "NoPE"
    reads_positions = False
