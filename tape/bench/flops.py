"""Exact parameter counts and FLOPs counted by ``torch.utils.flop_counter`` on the meta device.

FlopCounterMode counts matrix products only (mm, bmm, addmm, attention kernels), 2 FLOPs per
multiply-accumulate, so MACs = FLOPs / 2. Elementwise work (rotations, softmax, norms, the
optimizer) is not counted, and attention is counted over the full N x N score matrix even when
the kernel is causal (the same convention as the paper's Table 3, see tape-spec C.2).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tape.model import DecoderLM, ModelConfig

META = torch.device("meta")


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of the matrix products ``fn`` runs (forward, and backward if it calls it)."""
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def lm_loss(model: DecoderLM, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``model`` on ``ids`` (B, N): the loss every train step uses."""
    logits = model(ids).logits  # (B, N, V)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def model_costs(cfg: ModelConfig, batch: int, seq_len: int, backward: bool = False) -> dict[str, int]:
    """{"params", "flops"} of a DecoderLM on a (batch, seq_len) input; nothing is allocated.

    backward=False: one forward pass to the logits (Table 3's convention);
    backward=True: forward, loss and backward (a training step without the optimizer).
    """
    with META:
        model = DecoderLM(cfg)
        ids = torch.zeros(batch, seq_len, dtype=torch.long)
    if backward:
        flops = count_flops(lambda: lm_loss(model, ids).backward())
    else:
        flops = count_flops(lambda: model(ids))
    return {"params": model.num_parameters(), "flops": flops}
