"""ModelConfig: every size and positional-encoding choice of a DecoderLM, validated up front."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Collection, Literal

from tape.errors import ConfigError
from tape.typecheck import type_problems


@dataclass
class ModelConfig:
    """Llama-style decoder sizes plus the positional encoding's name and options.

    ModelConfig checks the sizes; the encoding checks its name and options when the model is
    built (``tape.pe.check(cfg)`` checks them without building).
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
    """Training context length. Used by RandPE's range and xPos's centre."""
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    pe: str = "rope"
    """Positional encoding, a name from ``tape.pe.names()``."""
    attn_backend: Literal["auto", "flash", "triton", "flex", "sdpa", "eager"] = "auto"
    """auto: TAPE's Triton [V | E] kernel or flash-attn on CUDA when installed and the call allows
    it, else PyTorch SDPA (fallback order: tape/model/attention.py)."""
    gradient_checkpointing: bool = False
    """Recompute each block in the backward pass instead of storing its activations (training
    only; same loss and gradients, less memory: the paper fine-tuned SCROLLS at 8k this way)."""

    pe_options: dict[str, Any] = field(default_factory=dict)
    """The encoding's options, the keys of ``conf/pe/<pe>.yaml`` (``rope_theta``, ``tape_post_attn``,
    ...); each encoding declares and checks its own (``tape.pe.options(cfg)``)."""

    # --- Abacus-style digit index embeddings (McLeish et al. 2024; tape/model/abacus.py) ---
    abacus: bool = False
    """Add a learned embedding of each digit's index inside its number (1 = the first digit
    written, the units digit in the reversed addition data) to its token embedding."""
    abacus_max_offset: int = 10
    """Training shifts each example's digit indices by a random k in [0, this]; 0 at evaluation."""
    abacus_max_index: int = 32
    """Rows of the index table: the largest index a digit may get (run length + offset)."""
    abacus_digit_ids: list[int] | None = None
    """Token ids that are digits (the task's vocabulary says which; required with ``abacus``)."""

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
    def digit_token_ids(self) -> list[int]:
        """The token ids Abacus treats as digits."""
        return list(self.abacus_digit_ids or [])

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ConfigError listing every problem, each naming the field and the fix."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        problems = type_problems(type(self), fields)  # model.abacus=no was taken as true
        if problems:
            raise ConfigError("invalid ModelConfig:\n  - " + "\n  - ".join(problems))
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len"):
            if int(getattr(self, name)) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be a positive integer")
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
        if self.attn_backend not in ("auto", "flash", "triton", "flex", "sdpa", "eager"):
            problems.append(
                f"attn_backend={self.attn_backend!r}; choose 'auto', 'flash', 'triton', 'flex', 'sdpa' or 'eager'"
            )
        if not isinstance(self.pe_options, dict):
            problems.append(f"pe_options={self.pe_options!r} must be a mapping of option -> value")
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
        if not digits:
            problems.append("abacus_digit_ids is empty but abacus=true: set it to the token ids of the "
                            "digits (a task with digits fills model.abacus_digit_ids from its vocabulary)")
        elif bad:
            problems.append(f"abacus_digit_ids={self.abacus_digit_ids} must be token ids in "
                            f"[0, vocab_size={self.vocab_size}); out of range: {bad}")
        return problems

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            hint = ("; a checkpoint or config with PE options beside the sizes (the old flat "
                    "layout) loads with ModelConfig.from_dict(tape.pe.legacy_options(values))"
                    if "pe_options" not in values else "")
            raise ConfigError(
                f"unknown ModelConfig field(s) {unknown}; valid fields: {sorted(known)}{hint}"
            )
        return cls(**{**values, "pe_options": dict(values.get("pe_options") or {})})

    @classmethod
    def from_groups(cls, model: dict[str, Any], pe: dict[str, Any],
                    other_options: Collection[str] = ()) -> "ModelConfig":
        """From a run config's ``model`` (sizes) and ``pe`` (``name`` + options) groups. A PE
        option left None defers to the same key set under ``model`` (a preset may set e.g.
        model.randpe_max_position for whichever PE is chosen); ``model`` keys that are options of
        other encodings (``other_options``, from ``tape.pe.option_names()``) are ignored."""
        pe = dict(pe)
        name = pe.pop("name")
        fields = {f.name for f in dataclasses.fields(cls)}
        options = {k: (model[k] if v is None and k in model else v) for k, v in pe.items()}
        sizes = {k: v for k, v in model.items() if k in fields or (k not in pe and k not in other_options)}
        return cls.from_dict({**sizes, "pe": name, "pe_options": options})

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
