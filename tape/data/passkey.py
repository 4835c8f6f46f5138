"""Passkey retrieval (LongLoRA / landmark prompt, as TAPE's Fig. 3 used; tape-spec D.3).

A task line, filler text cut by characters, a key line "The pass key is K. Remember it. K is the
pass key." inserted at a random character offset, and the question "What is the pass key? The
pass key is". K is uniform in [1, 50000). Each trial draws from its own seeded generator, so a
prompt depends on its seed only (and the global RNG is untouched).

Two ways to draw a trial (``draws``):
- ``official``: as TAPE's ``eval_retrieval.py`` (and LongLoRA's passkey script): numpy's legacy
  RNG seeded with the trial's seed, the insertion offset drawn first (uniform in [0, n_garbage)),
  then the key (uniform in [1, 50000)). Trial 0 at 3072 filler characters: offset 2732, key 43568.
- ``python``: Python's ``random.Random(seed)``, key first, offset in [0, n_garbage] (what this
  repository drew before; kept so earlier runs and the training rows stay reproducible).

The paper's prompt lengths are filler sizes in characters, ``PAPER_FILLER_CHARS`` (about
891 .. 7990 Llama-2 tokens), and its prompts start with BOS (the tokenizer adds it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np
import torch


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


Draws = Literal["official", "python"]


def garbage_chars(i: int, interval: int = 1000, chars_per_token: float = 3.75) -> int:
    """Filler length of test point i (1-based): floor(3.75 * i * interval / 1024) * 1024 chars."""
    return int(chars_per_token * i * interval // 1024 * 1024)


# The paper's Fig. 3 lengths (eval_retrieval.py --max_tokens 8192 --interval 1000): i = 1..8.
PAPER_FILLER_CHARS: tuple[int, ...] = tuple(garbage_chars(i) for i in range(1, 9))


def draw_trial(n_garbage: int, seed: int, draws: Draws = "python") -> tuple[int, int]:
    """(insertion offset in characters, key) of the trial with this seed; see the module doc."""
    if draws == "official":
        rng = np.random.RandomState(seed)  # the legacy generator np.random.seed(seed) sets up
        offset = int(rng.randint(0, max(n_garbage, 1)))  # numpy refuses [0, 0); 0 either way
        return offset, int(rng.randint(1, 50000))
    if draws == "python":
        rng = random.Random(seed)
        key = rng.randrange(1, 50000)
        return rng.randint(0, n_garbage), key
    raise ValueError(f"draws={draws!r}; choose 'official' or 'python'")


def passkey_prompt(n_garbage: int, seed: int, draws: Draws = "python") -> PasskeyPrompt:
    """The prompt with ``n_garbage`` filler characters around the key line."""
    prefix_len, key = draw_trial(n_garbage, seed, draws)
    filler = " ".join([FILLER] * (n_garbage // len(FILLER) + 2))
    prefix, suffix = filler[:prefix_len], filler[: n_garbage - prefix_len]
    text = "\n".join([TASK, prefix, KEY_LINE.format(key=key), suffix, QUESTION])
    return PasskeyPrompt(text=text, key=key, depth=prefix_len / max(n_garbage, 1))


# ---------------------------------------------------------------------------- sizing and training
MAX_KEY = 49999  # the longest key (5 digits): prompt sizes are checked against it


def garbage_for_tokens(
    encode: Callable[[str], Sequence[int]],
    max_tokens: int,
    answer_prefix: str = " ",
    seeds: Sequence[int] = range(8),
    extra_tokens: int = 0,
    draws: Draws = "python",
) -> int:
    """The largest filler length (characters, a multiple of 16) whose prompts plus the longest
    answer (plus ``extra_tokens``, e.g. 1 for a BOS) fit in ``max_tokens`` tokens, for the trials
    of these ``seeds`` drawn by ``draws`` (an evaluation passes its own: other trials may tokenise
    longer). Raises ValueError when not even an empty filler fits."""
    answer = len(encode(answer_prefix + str(MAX_KEY))) + extra_tokens

    def longest(n_garbage: int) -> int:
        return max(len(encode(passkey_prompt(n_garbage, s, draws).text)) for s in seeds) + answer

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
