"""The context-extension training loss: text tokens and passkey answers averaged separately.

Batches are dicts with ``input_ids`` (B, N), ``labels`` (B, N; -100 = not scored; labels[t] is
the target at position t, shifted here as in Hugging Face) and optionally ``passkey`` (B,) bool,
marking passkey rows. The loss is the mean over scored text tokens plus ``passkey_weight`` times
the mean over scored passkey tokens: averaged separately, the few answer tokens of the passkey
rows are not drowned by the text tokens.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def _part_masks(labels: Tensor, passkey: Tensor | None) -> dict[str, Tensor]:
    """The scored targets (B, N-1) of text rows and of passkey rows."""
    scored = labels[:, 1:] != -100  # (B, N-1)
    rows = labels.new_zeros(labels.shape[0], dtype=bool) if passkey is None else passkey.bool()
    return {"text": scored & ~rows[:, None], "passkey": scored & rows[:, None]}


def scored_parts(labels: Tensor, passkey: Tensor | None) -> tuple[str, ...]:
    """The parts with a scored target, read where the batch is (on the host before it moves to
    the GPU, this costs no wait)."""
    return tuple(name for name, mask in _part_masks(labels, passkey).items() if bool(mask.any()))


def split_losses(logits: Tensor, labels: Tensor, passkey: Tensor | None,
                 present: tuple[str, ...] | None = None) -> dict[str, Tensor]:
    """Mean next-token NLL over text rows and over passkey rows (keys: the parts scored,
    ``present`` when the caller knows them, else found here, which waits for a GPU).
    logits: (B, N, V), labels: (B, N), passkey: (B,) bool or None."""
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), labels[:, 1:], ignore_index=-100,
                          reduction="none")  # (B, N-1), 0 where not scored
    masks = _part_masks(labels, passkey)
    present = scored_parts(labels, passkey) if present is None else present
    return {name: (nll * masks[name]).sum() / masks[name].sum() for name in present}


def weighted_loss(parts: dict[str, Tensor], passkey_weight: float, like: Tensor) -> Tensor:
    """text + passkey_weight * passkey (a missing part counts 0, keeping the graph on ``like``)."""
    zero = like.reshape(-1)[:1].sum() * 0  # 0 with a graph (one element: an fp16 sum could overflow to inf)
    return parts.get("text", zero) + passkey_weight * parts.get("passkey", zero)
