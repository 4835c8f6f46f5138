"""Multiple-choice accuracy by log-likelihood (the paper's Table 9): every choice's continuation
is scored after the shared context; ``acc`` takes the likeliest choice, ``acc_norm`` the likeliest
per byte of continuation (lm-evaluation-harness's two measures)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from tape.data.multiple_choice import Prompt

Encode = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class Scored:
    """One item's log-likelihoods (nats, one per choice) and whether each measure chose right."""

    loglikelihoods: tuple[float, ...]
    correct: bool
    correct_norm: bool
    tokens: int  # the longest scored sequence, context included


def split_ids(encode: Encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids): the whole text encoded once and cut where the context's
    own encoding ends, so the continuation is scored as the tokenizer reads the whole; where the
    encodings disagree at the cut, the continuation is encoded alone."""
    ctx, whole = list(encode(context)), list(encode(context + continuation))
    if len(whole) > len(ctx) and whole[:len(ctx)] == ctx:
        return ctx, whole[len(ctx):]
    return ctx, list(encode(continuation))


@torch.no_grad()
def loglikelihoods(model: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                   device: torch.device | str) -> list[float]:
    """Sum of log p(continuation | context) for each (context ids, continuation ids), in one
    right-padded forward pass (causal attention: padding after a row never reaches it)."""
    rows = [list(c) + list(k) for c, k in pairs]
    width = max(len(r) for r in rows) - 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r) - 1] = torch.tensor(r[:-1])
    logits = model(ids.to(device)).logits  # (C, width, V)
    out = []
    for i, (c, k) in enumerate(pairs):
        first = len(c) - 1  # the position that predicts the continuation's first token
        logp = logits[i, first:first + len(k)].float().log_softmax(-1)  # (len(k), V)
        target = torch.tensor(list(k), device=logp.device)
        out.append(float(logp.gather(-1, target[:, None]).sum()))
    return out


def score(model: nn.Module, encode: Encode, prompt: Prompt, answer: int, device: torch.device | str,
          bos_id: int | None = None, max_tokens: int | None = None) -> Scored:
    """One item: each continuation's log-likelihood after the context (with ``bos_id`` first;
    contexts cut from the left to ``max_tokens`` with the continuation)."""
    pairs = []
    for continuation in prompt.continuations:
        ctx, cont = split_ids(encode, prompt.context, continuation)
        ctx = ([bos_id] if bos_id is not None else []) + ctx
        if max_tokens is not None and len(ctx) + len(cont) > max_tokens:
            keep = max_tokens - len(cont)
            if keep < 1:
                raise ValueError(f"a continuation of {len(cont)} tokens leaves no context within max_tokens={max_tokens}")
            ctx = ctx[len(ctx) - keep:]
        pairs.append((ctx, cont))
    lls = loglikelihoods(model, pairs, device)
    per_byte = [ll / max(len(c.encode("utf-8")), 1) for ll, c in zip(lls, prompt.continuations)]
    return Scored(tuple(lls), _argmax(lls) == answer, _argmax(per_byte) == answer,
                  max(len(c) + len(k) for c, k in pairs))


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def accuracy(correct: Sequence[bool]) -> tuple[float, float]:
    """(accuracy %, its standard error %): sqrt(p (1 - p) / (n - 1)), the sample standard
    deviation of the 0/1 outcomes over sqrt(n), as lm-evaluation-harness reports (nan for n = 1)."""
    n = len(correct)
    if n == 0:
        raise ValueError("no items")
    p = sum(correct) / n
    stderr = math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else math.nan
    return 100 * p, 100 * stderr

