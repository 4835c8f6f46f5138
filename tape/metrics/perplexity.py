"""Perplexity with the LongLoRA protocol that TAPE's Table 2 used (tape-spec D.3).

Windows of ``seq_len`` tokens start at ``range(0, n - seq_len, stride)`` (stride 256), as the
loop of LongLoRA's ``eval_distributed.py`` and TAPE's evaluation script do: only full windows,
and none starting exactly at n - seq_len. (LongLoRA's single-process ``eval.py`` also drops the
last start of that range.) Every token of a window after its first is scored from the
window's own prefix (labels = inputs, shifted), so a window scores seq_len - 1 tokens, and
tokens are scored many times with different context lengths. Perplexity = exp(mean NLL).
This is not the "score only the last stride" protocol, and not non-overlapping chunks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def load_token_file(path: str | Path, dtype: str = "uint16") -> np.memmap:
    """A flat binary token file (LongLoRA's PG-19 / Proof-pile ``.bin``), memory-mapped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"token file {path} not found. Paper scale uses LongLoRA's tokenised test sets "
            "(pg19/test.bin, proof-pile/test_sampled_data.bin: uint16 Llama-2 tokens); download "
            "them and point the config at them, or write your own with numpy "
            "(np.array(ids, dtype=np.uint16).tofile(path))"
        )
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


def window_starts(n_tokens: int, seq_len: int, stride: int = 256, max_windows: int | None = None) -> list[int]:
    """Start offsets ``range(0, n_tokens - seq_len, stride)`` (the LongLoRA loop); with
    ``max_windows``, that many evenly spread ones."""
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len}: a window needs at least 2 tokens")
    starts = list(range(0, n_tokens - seq_len, stride))
    if max_windows is not None and len(starts) > max_windows:
        pick = np.linspace(0, len(starts) - 1, max_windows).round().astype(int)
        starts = [starts[i] for i in pick]
    return starts


@torch.no_grad()
def sliding_window_perplexity(
    model: nn.Module,
    tokens: Sequence[int] | np.ndarray | torch.Tensor,
    seq_len: int,
    stride: int = 256,
    batch_size: int = 1,
    max_windows: int | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Perplexity of ``model`` (returns .logits for input_ids) over a token stream."""
    data = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    starts = window_starts(len(data), seq_len, stride, max_windows)
    if not starts:
        raise ValueError(f"{len(data)} tokens hold no window of {seq_len} (a window needs "
                         f"seq_len + 1 = {seq_len + 1} tokens or more)")
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_nll, total_tokens = 0.0, 0
    try:
        for i in range(0, len(starts), batch_size):
            ids = torch.stack([data[s : s + seq_len] for s in starts[i : i + batch_size]]).to(device)
            logits = model(input_ids=ids, use_cache=False).logits.float()  # (b, L, V); no KV cache kept
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                  reduction="sum")
            total_nll += float(nll)
            total_tokens += ids[:, 1:].numel()
    finally:
        model.train(was_training)
    mean = total_nll / total_tokens
    return {"perplexity": math.exp(mean), "nll": mean, "windows": len(starts), "scored_tokens": total_tokens}
