"""The interface every positional encoding implements, and the state that flows through layers.

A PE has two parts:
- a model-level ``PositionalEncoding`` that turns position ids into a ``PositionState`` once per
  forward call (RoPE tables, xPos scales, TAPE's initial E), and
- one ``LayerPE`` module per decoder layer that owns the PE's per-layer parameters (FIRE's MLP,
  T5's bucket table, TAPE's maps) and hooks into attention and the block.

The decoder calls the same hooks for every PE; most are identity, so the decoder has no
PE-specific branches.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from tape.model.cache import KVCache
    from tape.model.config import ModelConfig


@dataclass
class PositionState:
    """What the layers need to know about positions in one forward call.

    Rotary PEs keep ``rot``: per token the d/2 rotation pairs as [cos | sin] along the last
    axis, so its width equals the head dim. For RoPE it is a fixed table; for TAPE it is the
    contextual E stream that every layer updates.
    """

    query_pos: Tensor  # (B, N) int64 positions of the tokens in this call
    key_pos: Tensor  # (B, T) int64 positions of every key (cached + current), T >= N
    rot: Tensor | None = None  # (B, He or 1, N, d): [cos_0..cos_{d/2-1} | sin_0..sin_{d/2-1}]
    q_scale: Tensor | None = None  # (B, 1, N, d/2) xPos scale for queries; keys use 1/q_scale
    pending: Tensor | None = None  # (B, H, N, d) this layer's A·E, applied with its E update after the MLP (TAPE)

    def with_rot(self, rot: Tensor) -> "PositionState":
        return replace(self, rot=rot)


class LayerPE(nn.Module):
    """Per-layer part of a PE. The default is a no-op at every hook (NoPE)."""

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> "LayerPE":
        """Casts of the model (``.to(torch.bfloat16)``, ``.half()``) move the PE's own float
        buffers (ALiBi's slopes) but keep their precision: positions and what scales them stay
        float32 or better."""
        kept = {name: buf for name, buf in self.named_buffers(recurse=False) if buf.is_floating_point()}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = getattr(self, name)
            if torch.finfo(after.dtype).bits < torch.finfo(before.dtype).bits:
                setattr(self, name, before.to(after.device))
        return self

    def before_attention(
        self, state: PositionState, x: Tensor, cache: "KVCache | None", layer_idx: int
    ) -> PositionState:
        """Update the state from the layer's attention input x (B, N, C), the normed hidden
        state, before q/k/v (FoX's forget gates). A PE that keeps per-key rows for its bias
        across calls stores them in ``cache.pe_rows[layer_idx]`` (None: no cache)."""
        return state

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        """q: (B, H, N, d), k: (B, Hkv, N, d) for the current tokens -> rotated q, k."""
        return q, k

    def rotation(self, state: PositionState) -> Tensor | None:
        """A rotation ``attend`` applies to q and k itself (``rope.rotate_grouped``), (B, Hkv, N, d)
        as [cos | sin]: then the decoder skips ``rotate`` on calls without a cache and q and k
        reach ``attention`` and ``score_bias`` unrotated (TAPE defines neither). None: ``rotate``."""
        return None

    def attn_bias(self, state: PositionState) -> Tensor | None:
        """Additive attention logits, (B or 1, H, N, T) float32, or None."""
        return None

    def score_bias(self, q: Tensor, k: Tensor, state: PositionState, mask: Tensor | None) -> Tensor | None:
        """Additive logits that depend on the scores (CoPE), (B, H, N, T) float32, or None.
        Called after the cache update: q (B, H, N, d), k (B, Hkv, T, d) every key, and mask the
        attention mask (B or 1, 1, N, T) bool (True = may attend), None for plain causal."""
        return None

    def attention(self, q: Tensor, k: Tensor, v: Tensor, state: PositionState,
                  mask: Tensor | None) -> Tensor | None:
        """The attention output (B, H, N, d) when this PE computes the whole attention itself for
        this call (PaTH's fused kernel), else None. Called without a cache only: q (B, H, N, d),
        k and v (B, Hkv, N, d), mask as for ``score_bias``."""
        return None

    def alibi_slopes(self) -> Tensor | None:
        """(H,) float32 slopes when the bias is ALiBi (lets flash-attn apply it in-kernel)."""
        return None

    def extra_values(self, state: PositionState) -> Tensor | None:
        """Extra value rows for the current tokens, (B, Hkv, N, de), aggregated with the same
        attention weights as V (TAPE's E). None for every other PE."""
        return None

    def after_attention(self, state: PositionState, extra_out: Tensor | None) -> PositionState:
        """Take A·extra, (B, H, N, de) per query head, into the state (TAPE keeps it in
        ``pending`` and applies it with its update in ``after_mlp``)."""
        return state

    def after_mlp(self, state: PositionState, mlp_out: Tensor) -> PositionState:
        """Update the state from the layer's MLP output m, (B, N, C)."""
        return state

    def init_weights(self, std: float) -> None:
        """Initialise this PE's own parameters (after the model's N(0, std) pass)."""


@dataclass
class PEOptions:
    """An encoding's options: a dataclass whose fields are the keys of ``conf/pe/<name>.yaml``
    (besides ``name``) and of ``ModelConfig.pe_options``. This base has none (NoPE, ALiBi)."""

    def problems(self, cfg: "ModelConfig") -> list[str]:
        """What is wrong with these values for ``cfg``, each naming the option and the fix."""
        return []

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class RotaryOptions(PEOptions):
    """Options every RoPE-derived encoding shares."""

    rope_theta: float = 10000.0
    rope_scaling: float = 1.0
    """Linear position interpolation: positions are divided by this factor (1 = none)."""
    rope_yarn_factor: float = 1.0
    """YaRN's context extension factor s (1 = off): frequencies and table magnitude as
    ``tape.pe.rope.yarn_frequencies`` / ``yarn_magnitude``."""
    rope_yarn_original_length: int | None = None
    """The length (tokens) the model trains at, over which YaRN counts each frequency's turns;
    required when rope_yarn_factor > 1."""

    def yarn(self) -> Yarn | None:
        """The YaRN setting, or None when off."""
        if self.rope_yarn_factor == 1.0:
            return None
        assert self.rope_yarn_original_length is not None  # problems() refused it
        return Yarn(self.rope_yarn_factor, self.rope_yarn_original_length)

    def problems(self, cfg: "ModelConfig") -> list[str]:
        out = []
        if self.rope_theta <= 0:
            out.append(f"rope_theta={self.rope_theta} must be > 0 (the rotary base; the paper's 10000)")
        if self.rope_scaling <= 0:
            out.append(f"rope_scaling={self.rope_scaling} must be > 0 (1 = no interpolation)")
        if self.rope_yarn_factor < 1:
            out.append(f"rope_yarn_factor={self.rope_yarn_factor} must be >= 1 (1 = no YaRN; 2 = twice "
                       "the training length)")
        elif self.rope_yarn_factor > 1:
            if self.rope_scaling != 1:
                out.append(f"rope_yarn_factor={self.rope_yarn_factor} and rope_scaling={self.rope_scaling}: "
                           "YaRN replaces linear interpolation; set rope_scaling=1")
            if self.rope_yarn_original_length is None:
                out.append(f"rope_yarn_factor={self.rope_yarn_factor} needs rope_yarn_original_length: the "
                           "training length in tokens (e.g. pe.rope_yarn_original_length=1024)")
        if self.rope_yarn_original_length is not None and self.rope_yarn_original_length <= 0:
            out.append(f"rope_yarn_original_length={self.rope_yarn_original_length} must be a positive "
                       "number of tokens")
        return out


class Yarn(NamedTuple):
    """YaRN (Peng et al. 2023): each frequency is interpolated by ``factor``, kept, or ramped
    between, by how often it turns within ``original_length`` tokens (more than ``beta_fast``
    turns: kept; fewer than ``beta_slow``: interpolated)."""

    factor: float
    original_length: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


class PositionLimit(NamedTuple):
    """The positions an absolute-position PE trained on, [0, limit), and the option that sets it."""

    limit: int
    option: str
    default: str  # how the default limit is derived, for messages


class PositionalEncoding(nn.Module):
    """Model-level part of a PE: position ids -> PositionState, and a factory for layer parts.

    A subclass declares its ``Options`` dataclass, its ``display`` name and its properties; the
    registry, the tests, the benchmark and the report read them from here.
    """

    name: ClassVar[str] = ""
    display: ClassVar[str] = ""
    """The paper's spelling of the name, for tables ("" = the name)."""
    variants: ClassVar[dict[str, dict[str, str]]] = {}
    """Display names of option values that make another published method: option -> value -> name."""
    Options: ClassVar[type[PEOptions]] = PEOptions
    rotary: ClassVar[bool] = False
    """True when the PE rotates channel pairs (needs an even head dim)."""
    relative: ClassVar[bool] = True
    """True when logits depend only on position differences (shift-invariant)."""
    materialises_bias: ClassVar[bool] = False
    """True when attention needs a (B, H, N, T) float32 bias tensor (memory grows as N²)."""
    reads_positions: ClassVar[bool] = True
    """False when the PE never reads position ids (NoPE; CoPE and FoX count from content)."""

    def __init__(self, cfg: "ModelConfig", opts: PEOptions | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.opts: Any = opts if opts is not None else self.Options(**cfg.pe_options)

    @classmethod
    def position_limit(cls, cfg: "ModelConfig", opts: Any) -> PositionLimit | None:
        """For a PE that only knows the absolute positions it trained on, their range; None when
        any position works (every relative PE)."""
        return None

    def make_state(self, query_pos: Tensor, key_pos: Tensor, dtype: torch.dtype) -> PositionState:
        """query_pos: (B, N) int64, key_pos: (B, T) int64 -> the layer-0 PositionState."""
        return PositionState(query_pos=query_pos, key_pos=key_pos)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return LayerPE()


def without_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast switched off on ``device`` (a no-op where autocast does not exist, e.g. meta):
    for the float32 parts of an encoding inside a bf16 forward."""
    if device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def angle_dtype(device: torch.device) -> torch.dtype:
    """Positions and angles are computed in float64 (float32 where the device has no float64)
    and cast to the activation dtype only at the end: bf16 cannot even count past 256."""
    return torch.float32 if device.type == "mps" else torch.float64


def inverse_frequencies(head_dim: int, theta: float, device: torch.device) -> Tensor:
    """theta^(-2b/d) for b = 0..d/2-1, in high precision. Shape (d/2,)."""
    dt = angle_dtype(device)
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=dt) / head_dim
    return theta ** (-exponents)
