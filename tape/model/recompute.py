"""Tensors that operators save for backward as a way to recompute them, not their memory.

TAPE's rotated q and k are cheap to recompute from the unrotated ones and E, which the rotation
keeps for E's gradient anyway; SDPA saves the rotated ones. Around such a call,
``recomputed_in_backward`` packs a saved tensor that is one of the given ones as its recipe, so
the tensor is freed after the forward and rebuilt (bit for bit: the same elementwise operators on
the same inputs) when backward first reads it.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor


def _key(t: Tensor) -> tuple:
    """What identifies a tensor's memory and view while both are alive."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class BuiltOnce:
    """Builds a tensor on the first call and hands it to each of ``unread`` calls; lets it go after
    the last (a recipe: one call per saved copy; a build that recipes share: one per recipe)."""

    def __init__(self, make: Callable[[], Tensor], unread: int = 0) -> None:
        self.make, self.unread, self.value = make, unread, None

    def __call__(self) -> Tensor:
        value = self.value if self.value is not None else self.make()
        self.unread -= 1
        self.value = value if self.unread > 0 else None
        return value


_TRANSPARENT: list[tuple[Callable, Callable]] = []
"""Saved-tensor hooks that only look (``observing_saves``): ours chain to them, not stand aside."""


@contextlib.contextmanager
def observing_saves(pack: Callable[[Tensor], object], unpack: Callable[[object], Tensor]) -> Iterator[None]:
    """``torch.autograd.graph.saved_tensors_hooks`` for hooks that watch what is saved (memory
    counts): ``recomputed_in_backward`` inside them still packs its recipes and hands them the rest."""
    _TRANSPARENT.append((pack, unpack))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        _TRANSPARENT.pop()


def _outer_hooks() -> tuple[Callable, Callable] | None | bool:
    """The active saved-tensor hooks: None, an observing pair to chain to, or False for any other
    (non-reentrant activation checkpointing: ours stand aside, or they would keep the unrotated
    inputs alive that checkpointing means to free)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return False
    active = top(False)
    if active is None:
        return None
    if _TRANSPARENT and tuple(active) == _TRANSPARENT[-1]:
        return _TRANSPARENT[-1]
    return False


@contextlib.contextmanager
def recomputed_in_backward(recipes: Sequence[tuple[Tensor, Callable[[], Tensor]]]) -> Iterator[None]:
    """While the block runs, an operator that saves one of the tensors saves its recipe (the
    callable, which must rebuild it exactly) instead. Stands aside (saves tensors as usual) without
    grad, under ``torch.compile``, inside other saved-tensor hooks (but observing ones) and on the
    meta device (FLOP counts: no memory, and no addresses to tell tensors apart)."""
    outer = _outer_hooks()
    meta = any(t.device.type == "meta" for t, _ in recipes)
    if not torch.is_grad_enabled() or torch.compiler.is_compiling() or outer is False or meta:
        yield
        return
    outer_pack, outer_unpack = outer or (lambda t: t, lambda t: t)
    by_key = {_key(t): BuiltOnce(make) for t, make in recipes}  # keys only: the tensors may be freed

    def pack(t: Tensor) -> object:
        recipe = by_key.get(_key(t))
        if recipe is None:
            return outer_pack(t)
        recipe.unread += 1
        return recipe

    def unpack(saved: object) -> Tensor:
        return saved() if isinstance(saved, BuiltOnce) else outer_unpack(saved)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
