"""A plain PyTorch training loop for Hugging Face causal LMs (pretraining and context
extension): AdamW on the trainable parameters, linear warm-up then constant or cosine learning
rate, gradient clipping and accumulation. Deterministic given the model's initial weights and a
batch function that depends on the batch index only.

Batches are dicts with ``input_ids`` (B, N), ``labels`` (B, N; -100 = not scored; labels[t] is
the target at position t, shifted here as in Hugging Face) and optionally ``passkey`` (B,) bool,
marking passkey rows. The loss is the mean over scored text tokens plus ``passkey_weight`` times
the mean over scored passkey tokens: averaged separately, the few answer tokens of the passkey
rows are not drowned by the text tokens.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tape.schedule import lr_factor

def split_losses(logits: Tensor, labels: Tensor, passkey: Tensor | None) -> dict[str, Tensor]:
    """Mean next-token NLL over text rows and over passkey rows (keys present when scored).
    logits: (B, N, V), labels: (B, N), passkey: (B,) bool or None."""
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), labels[:, 1:], ignore_index=-100,
                          reduction="none")  # (B, N-1)
    scored = labels[:, 1:] != -100  # (B, N-1)
    rows = torch.zeros(labels.shape[0], dtype=torch.bool, device=labels.device) if passkey is None else passkey
    out = {}
    for name, mask in (("text", scored & ~rows[:, None]), ("passkey", scored & rows[:, None])):
        if mask.any():
            out[name] = nll[mask].mean()
    return out


def train_loop(
    model: nn.Module,
    batches: Callable[[int], dict[str, Tensor]],
    steps: int,
    lr: float,
    warmup_steps: int = 0,
    schedule: str = "constant",
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    grad_clip: float | None = 1.0,
    grad_accum: int = 1,
    passkey_weight: float = 1.0,
    device: torch.device | str = "cpu",
    log: Callable[[int, dict[str, float]], None] | None = None,
    log_every: int = 10,
) -> dict[str, Any]:
    """Train ``model`` in place for ``steps`` optimizer steps; batch i of the stream is
    ``batches(i)`` (step s uses batches s*grad_accum .. s*grad_accum + grad_accum - 1).
    Returns the last logged losses, steps, the wall time and steps per second."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, warmup_steps, steps, schedule, min_lr_ratio))
    model.train()
    t0, last = time.perf_counter(), {}
    for step in range(steps):
        sums: dict[str, float] = {}
        for micro in range(grad_accum):
            batch = {k: v.to(device) for k, v in batches(step * grad_accum + micro).items()}
            logits = model(input_ids=batch["input_ids"]).logits  # (B, N, V)
            parts = split_losses(logits, batch["labels"], batch.get("passkey"))
            loss = parts.get("text", logits.new_zeros(())) + passkey_weight * parts.get("passkey", logits.new_zeros(()))
            (loss / grad_accum).backward()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach()) / grad_accum
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if log is not None and (step % log_every == 0 or step == steps - 1):
            last = {f"loss_{k}": v for k, v in sums.items()} | {"lr": sched.get_last_lr()[0]}
            log(step, last)
    elapsed = time.perf_counter() - t0
    model.eval()
    return {**last, "steps": steps, "train_time_s": elapsed, "steps_per_s": steps / max(elapsed, 1e-9)}
