"""Passkey retrieval scored by greedy generation: one trial, and the accuracy over seeded
trials (the prompts come from ``tape.data.passkey``)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from tape.data.passkey import Draws, PasskeyPrompt, passkey_prompt
from tape.model.generate import greedy_generate


@torch.no_grad()
def passkey_trial(
    model: nn.Module,
    encode: Callable[[str], Sequence[int]],
    prompt: PasskeyPrompt,
    answer_prefix: str = " ",
    device: torch.device | str | None = None,
    bos_id: int | None = None,
    kv_cache: bool = True,
) -> tuple[bool, int]:
    """Greedy-generate as many tokens as the answer has; correct iff every token matches.
    ``encode`` maps text to token ids (without special tokens); ``bos_id``, when given, starts
    the prompt (the official prompts start with BOS); ``answer_prefix`` is what joins the
    question and the key (a space for our BPE; "" for Llama's tokenizer, whose encoding of the
    bare key starts with its word marker); ``kv_cache=False`` recomputes the whole prefix for every
    token, as the paper's eval_retrieval.py. Returns (correct, prompt length in tokens with BOS)."""
    device = device or next(model.parameters()).device
    ids = torch.tensor([([bos_id] if bos_id is not None else []) + list(encode(prompt.text))], device=device)
    answer = list(encode(answer_prefix + str(prompt.key)))
    out = greedy_generate(model, ids, max_new_tokens=len(answer), use_cache=kv_cache)[0, ids.shape[1]:]
    return out.tolist() == answer, ids.shape[1]


def passkey_accuracy(
    model: nn.Module,
    encode: Callable[[str], Sequence[int]],
    n_garbage: int,
    trials: int = 20,
    seed: int = 0,
    answer_prefix: str = " ",
    bos_id: int | None = None,
    draws: Draws = "python",
    kv_cache: bool = True,
) -> dict[str, float]:
    """Accuracy over ``trials`` prompts (seeds seed .. seed + trials - 1) and their mean length."""
    results = [passkey_trial(model, encode, passkey_prompt(n_garbage, seed + t, draws), answer_prefix,
                             bos_id=bos_id, kv_cache=kv_cache)
               for t in range(trials)]
    return {
        "accuracy": sum(ok for ok, _ in results) / trials,
        "mean_tokens": sum(n for _, n in results) / trials,
        "trials": trials,
    }
