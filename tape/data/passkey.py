"""Passkey retrieval (LongLoRA / landmark prompt, as TAPE's Fig. 3 used; tape-spec D.3).

A task line, filler text cut by characters, a key line "The pass key is K. Remember it. K is the
pass key." inserted at a random character offset, and the question "What is the pass key? The
pass key is". K is uniform in [1, 50000). Each trial draws from its own seeded generator, so a
prompt depends on its seed only (and the global RNG is untouched).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from tape.model.generate import greedy_generate

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyPrompt:
    text: str
    key: int
    depth: float  # where the key line sits in the filler, 0 = start, 1 = end


def garbage_chars(i: int, interval: int = 1000, chars_per_token: float = 3.75) -> int:
    """Filler length of test point i (1-based): floor(3.75 * i * interval / 1024) * 1024 chars."""
    return int(chars_per_token * i * interval // 1024 * 1024)


def passkey_prompt(n_garbage: int, seed: int) -> PasskeyPrompt:
    """The prompt with ``n_garbage`` filler characters around the key line."""
    rng = random.Random(seed)
    key = rng.randrange(1, 50000)
    filler = " ".join([FILLER] * (n_garbage // len(FILLER) + 2))
    prefix_len = rng.randint(0, n_garbage)
    prefix, suffix = filler[:prefix_len], filler[: n_garbage - prefix_len]
    text = "\n".join([TASK, prefix, KEY_LINE.format(key=key), suffix, QUESTION])
    return PasskeyPrompt(text=text, key=key, depth=prefix_len / max(n_garbage, 1))


@torch.no_grad()
def passkey_trial(
    model: nn.Module,
    encode: Callable[[str], Sequence[int]],
    prompt: PasskeyPrompt,
    answer_prefix: str = " ",
    device: torch.device | str | None = None,
) -> tuple[bool, int]:
    """Greedy-generate as many tokens as the answer has; correct iff every token matches.
    ``encode`` maps text to token ids (without special tokens); ``answer_prefix`` is what
    joins the question and the key (a space for BPE vocabularies). Returns (correct, prompt tokens)."""
    device = device or next(model.parameters()).device
    ids = torch.tensor([list(encode(prompt.text))], device=device)
    answer = list(encode(answer_prefix + str(prompt.key)))
    out = greedy_generate(model, ids, max_new_tokens=len(answer))[0, ids.shape[1]:]
    return out.tolist() == answer, ids.shape[1]


def passkey_accuracy(
    model: nn.Module,
    encode: Callable[[str], Sequence[int]],
    n_garbage: int,
    trials: int = 20,
    seed: int = 0,
    answer_prefix: str = " ",
) -> dict[str, float]:
    """Accuracy over ``trials`` prompts (seeds seed .. seed + trials - 1) and their mean length."""
    results = [passkey_trial(model, encode, passkey_prompt(n_garbage, seed + t), answer_prefix)
               for t in range(trials)]
    return {
        "accuracy": sum(ok for ok, _ in results) / trials,
        "mean_tokens": sum(n for _, n in results) / trials,
        "trials": trials,
    }


# ---------------------------------------------------------------------------- sizing and training
MAX_KEY = 49999  # the longest key (5 digits): prompt sizes are checked against it


def garbage_for_tokens(
    encode: Callable[[str], Sequence[int]],
    max_tokens: int,
    answer_prefix: str = " ",
    probe_seeds: int = 8,
) -> int:
    """The largest filler length (characters, a multiple of 16) whose prompts plus the longest
    answer fit in ``max_tokens`` tokens, checked on ``probe_seeds`` seeds (0, 1, ...).
    Raises ValueError when not even an empty filler fits."""
    answer = len(encode(answer_prefix + str(MAX_KEY)))

    def longest(n_garbage: int) -> int:
        return max(len(encode(passkey_prompt(n_garbage, s).text)) for s in range(probe_seeds)) + answer

    if longest(0) > max_tokens:
        raise ValueError(f"a passkey prompt with no filler needs {longest(0)} tokens > {max_tokens}")
    lo, hi = 0, 16  # longest(lo * 16) fits; grow hi until it does not
    while longest(hi * 16) <= max_tokens:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # binary search on multiples of 16 characters
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if longest(mid * 16) <= max_tokens else (lo, mid)
    return lo * 16


def passkey_example(
    encode: Callable[[str], Sequence[int]],
    n_garbage: int,
    seed: int,
    seq_len: int,
    pad_id: int,
    answer_prefix: str = " ",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One training row: prompt then answer tokens, right-padded to ``seq_len``.
    Returns (input_ids (seq_len,), labels (seq_len,)): labels are -100 everywhere but on the
    answer tokens, so only the key is scored (labels[t] is the target at position t, as in
    Hugging Face causal LMs, which shift internally)."""
    prompt = passkey_prompt(n_garbage, seed)
    ids, answer = list(encode(prompt.text)), list(encode(answer_prefix + str(prompt.key)))
    n = len(ids) + len(answer)
    if n > seq_len:
        raise ValueError(f"passkey example of {n} tokens does not fit seq_len={seq_len}; "
                         "size n_garbage with garbage_for_tokens")
    input_ids = torch.full((seq_len,), pad_id, dtype=torch.long)
    input_ids[:n] = torch.tensor(ids + answer)
    labels = torch.full((seq_len,), -100, dtype=torch.long)
    labels[len(ids) : n] = torch.tensor(answer)
    return input_ids, labels
