"""ModelConfig: every size and positional-encoding choice of a DecoderLM, validated up front."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal


ADDITION_DIGIT_IDS = tuple(range(4, 14))  # '0'..'9' in tape/data/addition.py's VOCAB


class ConfigError(ValueError):
    """A ModelConfig field has a value that cannot work; the message names the field and the fix."""


@dataclass
class ModelConfig:
    """Llama-style decoder sizes plus the positional encoding and its options.

    Fields prefixed with a PE name (``tape_``, ``fire_``, ...) only matter for that PE.
    """

    vocab_size: int = 32000
    n_layers: int = 12
    d_model: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means n_heads (multi-head attention)."""
    d_ff: int | None = None
    """SwiGLU hidden width; None means 4 * d_model (the paper's 155M model uses 3072 = 4 * 768)."""
    max_seq_len: int = 1024
    """Training context length. Used by RandPE's range, xPos's centre and FIRE's initial L."""
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    pe: str = "rope"
    """Positional encoding, a name from ``tape.pe.names()``."""
    attn_backend: Literal["auto", "flash", "triton", "sdpa", "eager"] = "auto"
    """auto: TAPE's Triton [V | E] kernel or flash-attn on CUDA when installed and the call allows
    it, else PyTorch SDPA (fallback order: tape/model/attention.py)."""
    gradient_checkpointing: bool = False
    """Recompute each block in the backward pass instead of storing its activations (training
    only; same loss and gradients, less memory: the paper fine-tuned SCROLLS at 8k this way)."""

    # --- rotary family (rope, randpe, xpos, tape) ---
    rope_theta: float = 10000.0
    rope_scaling: float = 1.0
    """Linear position interpolation: positions are divided by this factor (1 = none)."""

    # --- p-RoPE (Barbero et al. 2025) ---
    prope_fraction: float = 0.75
    """Share of RoPE's frequency pairs that rotate, the highest ones (1 = RoPE, 0 = NoPE)."""

    # --- RandPE (Ruoss et al. 2023) ---
    randpe_max_position: int | None = None
    """Training positions are a sorted random subset of [0, this); None means 2 * max_seq_len."""

    # --- xPos (Sun et al. 2022) ---
    xpos_scale_base: float = 2048.0

    # --- FIRE (Li et al. 2023) ---
    fire_mlp_width: int = 32
    fire_init_c: float = 0.1
    fire_init_L: float = 512.0

    # --- T5 relative bias ---
    t5_num_buckets: int = 64
    t5_max_distance: int = 128

    # --- TAPE ---
    tape_position_size: int | None = None
    """Width I of the PE-MLP over heads (W1: H -> I, W2: I -> H); None means 4 * n_heads."""
    tape_post_attn: Literal["mix", "rowsum"] = "mix"
    """Map over heads after A·E. mix: a true head-mixing matrix (the paper's description).
    rowsum: per-head scalar = row sum of an H x H matrix (what the official code computes)."""
    tape_zero_init: Literal["w1", "w2"] = "w1"
    """Which PE-MLP matrix starts at zero (w1: the official code, w2: the paper's PEFT text).
    Either way TAPE at initialisation equals RoPE."""
    tape_attn_update: bool = True
    """Update E with the attention weights (A·E). Off = the 'FF only' ablation."""
    tape_mlp_update: bool = True
    """Update E with the token-gated PE-MLP. Off = the 'attention only' ablation."""
    tape_fused: bool | Literal["two_calls", "concat", "padded"] | None = None
    """How A·V and A·E are computed. True: one QKᵀ (the Triton kernel on CUDA; one SDPA call with
    [V | E] as values otherwise). False or two_calls: two calls of equal width. concat / padded:
    one SDPA call with [V | E], q and k as they are / zero-padded to its width. None (auto): the
    fastest exact path per device and length (tape/model/attention.py). All are exact."""

    # --- Abacus-style digit index embeddings (McLeish et al. 2024; tape/model/abacus.py) ---
    abacus: bool = False
    """Add a learned embedding of each digit's index inside its number (1 = the first digit
    written, the units digit in the reversed addition data) to its token embedding."""
    abacus_max_offset: int = 10
    """Training shifts each example's digit indices by a random k in [0, this]; 0 at evaluation."""
    abacus_max_index: int = 32
    """Rows of the index table: the largest index a digit may get (run length + offset)."""
    abacus_digit_ids: list[int] | None = None
    """Token ids that are digits; None means the addition vocabulary's '0'..'9' (ids 4..13)."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form metadata carried with checkpoints (ignored by the model)."""

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def tape_width(self) -> int:
        return self.tape_position_size or 4 * self.n_heads

    @property
    def digit_token_ids(self) -> list[int]:
        """The token ids Abacus treats as digits."""
        return list(self.abacus_digit_ids) if self.abacus_digit_ids is not None else list(ADDITION_DIGIT_IDS)

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ConfigError listing every problem, each naming the field and the fix."""
        from tape import pe as pe_registry  # local import: the registry imports this module

        problems: list[str] = []
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len"):
            if int(getattr(self, name)) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be a positive integer")
        if self.pe not in pe_registry.names():
            problems.append(
                f"pe={self.pe!r} is not a registered positional encoding; "
                f"choose one of {pe_registry.names()}"
            )
        if self.n_heads > 0 and self.d_model % self.n_heads:
            problems.append(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "pick d_model as a multiple of n_heads"
            )
        if self.n_kv_heads is not None and (
            self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads
        ):
            problems.append(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}; "
                "set n_kv_heads to a divisor of n_heads (or None for multi-head attention)"
            )
        if (
            self.pe in pe_registry.names()
            and pe_registry.get(self.pe).rotary
            and self.n_heads > 0
            and self.d_model % self.n_heads == 0
            and self.head_dim % 2
        ):
            problems.append(
                f"head dim d_model/n_heads={self.head_dim} is odd but pe={self.pe!r} rotates "
                "pairs of channels; choose d_model and n_heads so that the head dim is even"
            )
        if self.rope_scaling <= 0:
            problems.append(f"rope_scaling={self.rope_scaling} must be > 0 (1 = no interpolation)")
        if not 0.0 <= self.prope_fraction <= 1.0:
            problems.append(f"prope_fraction={self.prope_fraction} must be in [0, 1] (1 = RoPE, 0 = NoPE)")
        if self.tape_post_attn not in ("mix", "rowsum"):
            problems.append(f"tape_post_attn={self.tape_post_attn!r}; choose 'mix' or 'rowsum'")
        if self.tape_zero_init not in ("w1", "w2"):
            problems.append(f"tape_zero_init={self.tape_zero_init!r}; choose 'w1' or 'w2'")
        if self.attn_backend not in ("auto", "flash", "triton", "sdpa", "eager"):
            problems.append(
                f"attn_backend={self.attn_backend!r}; choose 'auto', 'flash', 'triton', 'sdpa' or 'eager'"
            )
        if self.tape_fused not in (True, False, None, "two_calls", "concat", "padded"):
            problems.append(
                f"tape_fused={self.tape_fused!r}; choose true, false, null (auto), 'two_calls', "
                "'concat' or 'padded'"
            )
        if self.tape_position_size is not None and self.tape_position_size <= 0:
            problems.append(f"tape_position_size={self.tape_position_size} must be positive")
        if self.randpe_max_position is not None and self.randpe_max_position < self.max_seq_len:
            problems.append(
                f"randpe_max_position={self.randpe_max_position} is below "
                f"max_seq_len={self.max_seq_len}; RandPE samples positions from a larger range"
            )
        problems += self._abacus_problems()
        if problems:
            raise ConfigError("invalid ModelConfig:\n  - " + "\n  - ".join(problems))

    def _abacus_problems(self) -> list[str]:
        if not self.abacus:
            return []
        problems = []
        if self.abacus_max_index < 1:
            problems.append(f"abacus_max_index={self.abacus_max_index} must be >= 1 (the index "
                            "table needs a row for the first digit)")
        if self.abacus_max_offset < 0:
            problems.append(f"abacus_max_offset={self.abacus_max_offset} must be >= 0 (0 = no "
                            "random offset in training)")
        elif self.abacus_max_offset >= self.abacus_max_index:
            problems.append(
                f"abacus_max_offset={self.abacus_max_offset} leaves no room in "
                f"abacus_max_index={self.abacus_max_index}: a one-digit number already needs index "
                f"{self.abacus_max_offset + 1}; raise abacus_max_index or lower abacus_max_offset"
            )
        digits = self.digit_token_ids
        bad = [i for i in digits if not 0 <= int(i) < self.vocab_size]
        if not digits or bad:
            problems.append(
                f"abacus_digit_ids={self.abacus_digit_ids} must be a non-empty list of token ids "
                f"in [0, vocab_size={self.vocab_size}); out of range: {bad}"
                + (" (the default is the addition vocabulary's digits 4..13)" if self.abacus_digit_ids is None else "")
            )
        return problems

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown ModelConfig field(s) {unknown}; valid fields: {sorted(known)}"
            )
        return cls(**values)

    @classmethod
    def from_groups(cls, model: dict[str, Any], pe: dict[str, Any]) -> "ModelConfig":
        """From a run config's ``model`` (sizes) and ``pe`` (``name`` + options) groups. A PE
        option left None defers to the same field set under ``model`` (a preset may set e.g.
        model.randpe_max_position for whichever PE is chosen)."""
        pe = dict(pe)
        name = pe.pop("name")
        return cls.from_dict({**model, **{k: v for k, v in pe.items() if v is not None or k not in model},
                              "pe": name})

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
