"""TAPE's rotated q and k on the SDPA paths, saved as recipes (tape/model/recompute.py): the same
numbers bit for bit, the rotated copies not kept, and standing aside inside activation
checkpointing (whose own hooks must see every save)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from model_helpers import tiny_model
from torch.utils.checkpoint import checkpoint

import tape.model.attention as attention
from tape.bench.memory import saved_tensor_bytes
from tape.model.recompute import recomputed_in_backward


def _step(monkeypatch: pytest.MonkeyPatch | None, fused, kv, recipes: bool = True):
    if not recipes:
        monkeypatch.setattr(attention, "recomputed_in_backward", lambda r: contextlib.nullcontext())
    torch.manual_seed(0)
    model = tiny_model("tape", n_layers=3, n_kv_heads=kv, attn_backend="sdpa", tape_fused=fused).train()
    ids = torch.randint(0, 37, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids).logits
    logits.float().square().mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("fused,kv", [(False, None), ("concat", None), (False, 2), ("padded", 2)])
def test_recipes_give_the_same_numbers_bit_for_bit(monkeypatch, fused, kv):
    logits, grads = _step(monkeypatch, fused, kv)
    with monkeypatch.context() as m:
        ref_logits, ref_grads = _step(m, fused, kv, recipes=False)
    assert torch.equal(logits, ref_logits)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_the_rotated_copies_are_not_kept(monkeypatch):
    """Two SDPA calls per layer: q and k rotated were kept beside the unrotated ones (for E's
    gradient); as recipes, one (B, H, N, d) pair a layer less, every layer (the last one too)."""
    model = tiny_model("tape", n_layers=3, attn_backend="sdpa", tape_fused=False).train()
    ids = torch.randint(0, 37, (2, 17), generator=torch.Generator().manual_seed(1))
    params = list(model.parameters())
    with_recipes = saved_tensor_bytes(lambda: model(ids).logits, exclude=params)
    monkeypatch.setattr(attention, "recomputed_in_backward", lambda r: contextlib.nullcontext())
    without = saved_tensor_bytes(lambda: model(ids).logits, exclude=params)
    cfg = model.cfg
    pair = 2 * 2 * cfg.n_heads * 17 * cfg.head_dim * 4  # q and k, batch 2, 17 tokens, float32
    assert without - with_recipes == cfg.n_layers * pair


def test_recipes_stand_aside_inside_checkpointing_and_without_grad():
    """Inside non-reentrant checkpointing the rotated tensor goes to checkpoint's own hooks (a
    recipe would keep the unrotated inputs alive); without grad nothing is saved at all."""
    x = torch.randn(4, 4, requires_grad=True)
    made = []

    def region(x):
        y = x * 2
        with recomputed_in_backward([(y, lambda: made.append(1) or (x * 2).detach())]):
            return (y * y).sum()

    checkpoint(region, x, use_reentrant=False).backward()
    assert made == [] and torch.allclose(x.grad, 8 * x.detach())
    x.grad = None
    region(x).backward()
    assert made == [1] and torch.allclose(x.grad, 8 * x.detach())  # y saved twice, rebuilt once
    with torch.no_grad():
        region(x)
    assert made == [1]
