"""Table 8 (tape-spec E.6): how far each layer's attention weights and positional dot products
move when the same text is shifted, by three [BOS] tokens prepended ("add") or by position ids
started at 3 ("shift"). The paper does not define its two numbers; ours (docs/experiments.md):
- attention: the L1 distance between a text query's attention row before and after, over every
  key (the prepended ones too, where the row before has no mass), averaged over batch, heads and
  the text's queries; 0 to 2;
- positional dot product (rotary PEs): the relative Frobenius change, in %, of the Gram matrix
  E_i · E_j over the text's causal pairs (i >= j), per batch row and E head, averaged; E is the
  rotation the layer applies (RoPE's table, TAPE's E of that layer).
Run in float32 with eager attention: a PE exactly invariant to the shift scores float rounding.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import torch
from torch import Tensor, nn

from tape.model.attention import recorded_weights

PREPENDED = 3  # the paper's three [BOS] tokens, and its position offset of 3


class Trace(NamedTuple):
    """Per layer: the attention weights (B, H, N, N) and the rotation (B, He, N, d) or None."""

    weights: list[Tensor]
    rotations: list[Tensor | None]


@contextlib.contextmanager
def _eager_attention(model: nn.Module) -> Iterator[None]:
    """Every block's attention on the eager backend (which materialises the weights), then back."""
    blocks = [b.attn for b in model.layers]
    before = [a.backend for a in blocks]
    for a in blocks:
        a.backend = "eager"
    try:
        yield
    finally:
        for a, backend in zip(blocks, before):
            a.backend = backend


def trace(model: nn.Module, input_ids: Tensor, position_ids: Tensor) -> Trace:
    """One forward of a DecoderLM, recording each layer's attention weights and rotation."""
    rotations: list[Tensor | None] = []
    hooks = [b.register_forward_pre_hook(lambda _m, args: rotations.append(args[1].rot)) for b in model.layers]
    try:
        with _eager_attention(model), recorded_weights() as weights:
            model(input_ids, position_ids=position_ids)
    finally:
        for h in hooks:
            h.remove()
    return Trace([w.float() for w in weights], [None if r is None else r.float() for r in rotations])


def attention_change(before: Tensor, after: Tensor, prepended: int) -> float:
    """Mean L1 distance of the text's attention rows: before (B, H, N, N), after (B, H, P+N, P+N)
    with the text at the last N positions."""
    after = after[..., prepended:, :]  # (B, H, N, P+N): the text's queries
    before = nn.functional.pad(before, (prepended, 0))  # no mass on the prepended keys
    return float((after - before).abs().sum(-1).mean())


def dot_product_change(before: Tensor, after: Tensor, prepended: int) -> float:
    """Relative change (%) of E_i · E_j over causal pairs: before (B, He, N, d), after
    (B, He, P+N, d) with the text at the last N positions."""
    after = after[..., prepended:, :].double()
    before = before.double()
    n = before.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=before.device).tril()
    gram_before = (before @ before.mT).masked_fill(~causal, 0.0)  # (B, He, N, N)
    gram_after = (after @ after.mT).masked_fill(~causal, 0.0)
    rel = (gram_after - gram_before).flatten(-2).norm(dim=-1) / gram_before.flatten(-2).norm(dim=-1)
    return float(100.0 * rel.mean())


@torch.no_grad()
def shift_robustness(model: nn.Module, input_ids: Tensor, bos_id: int,
                     prepended: int = PREPENDED) -> dict[str, float]:
    """Flat metrics for a DecoderLM on held-out text ``input_ids`` (B, N), per layer l >= 1:
    ``shift_attn_{add,shift}_layer{l}`` and, for rotary PEs, ``shift_pe_{add,shift}_layer{l}``."""
    was_training = model.training
    model.eval()
    try:
        b, n = input_ids.shape
        pos = torch.arange(n, device=input_ids.device).expand(b, n)
        base = trace(model, input_ids, pos)
        shifted = trace(model, input_ids, pos + prepended)
        bos = torch.full((b, prepended), bos_id, dtype=input_ids.dtype, device=input_ids.device)
        added = trace(model, torch.cat([bos, input_ids], dim=1),
                      torch.arange(n + prepended, device=input_ids.device).expand(b, -1))
    finally:
        model.train(was_training)
    out: dict[str, float] = {}
    for layer in range(len(base.weights)):
        for name, other, offset in (("add", added, prepended), ("shift", shifted, 0)):
            out[f"shift_attn_{name}_layer{layer + 1}"] = attention_change(
                base.weights[layer], other.weights[layer], offset)
            if base.rotations[layer] is not None:
                out[f"shift_pe_{name}_layer{layer + 1}"] = dot_product_change(
                    base.rotations[layer], other.rotations[layer], offset)
    return out
