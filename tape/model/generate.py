"""Decoding with a KV cache, for our DecoderLM and for Hugging Face causal LMs alike (both take
input_ids / attention_mask / position_ids / past_key_values / use_cache and return .logits and
.past_key_values). Greedy by default; ``choose=TopKTopPSampler(...)`` samples (seeded)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

Choose = Callable[[Tensor], Tensor]  # (B, V) logits -> (B,) next token ids


def argmax_choice(logits: Tensor) -> Tensor:
    return logits.argmax(-1)


class TopKTopPSampler:
    """Sample the next token from softmax(logits) restricted to the ``top_k`` most likely tokens
    and/or the smallest set whose probability reaches ``top_p`` (None: no restriction; note that
    Hugging Face's generate() adds top_k=50 by default, this does not). Seeded by ``seed``."""

    def __init__(self, top_k: int | None = None, top_p: float | None = None, seed: int = 0) -> None:
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p} must be in (0, 1]")
        self.top_k, self.top_p, self.seed = top_k, top_p, seed
        self.generator: torch.Generator | None = None

    def __call__(self, logits: Tensor) -> Tensor:  # (B, V) -> (B,)
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(device=logits.device).manual_seed(self.seed)
        logits = logits.float()
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
            drop = probs.cumsum(-1) - probs >= self.top_p  # keep the first token that crosses top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        return torch.multinomial(logits.softmax(-1), 1, generator=self.generator)[:, 0]


def vocab_size(model: nn.Module) -> int | None:
    """The number of input token ids ``model`` embeds (our DecoderLM or a Hugging Face model)."""
    cfg_size = getattr(getattr(model, "cfg", None), "vocab_size", None)
    if cfg_size is not None:
        return int(cfg_size)
    try:
        embed = model.get_input_embeddings()  # Hugging Face models (and PEFT wrappers)
    except (AttributeError, NotImplementedError):
        return None
    return int(embed.num_embeddings) if isinstance(embed, nn.Embedding) else None


def check_token_ids(ids: Tensor, size: int | None, name: str = "prompt_ids") -> None:
    """A clear error for ids the embedding cannot look up (torch says only 'index out of range')."""
    if size is None or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds token id {bad}, outside the model's vocabulary: ids must be "
                         f"in [0, {size}) (vocab_size={size})")


def positions_from_mask(mask: Tensor, n_last: int) -> Tensor:
    """Positions that count real tokens only (left padding), for the last n_last columns."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -n_last:]


@torch.no_grad()
def greedy_generate(
    model: nn.Module,
    prompt_ids: Tensor,  # (B, N) int64, left-padded if lengths differ
    max_new_tokens: int,
    attention_mask: Tensor | None = None,  # (B, N), 0 marks left padding
    eos_token_id: int | None = None,
    use_cache: bool = True,
    return_logits: bool = False,
    choose: Choose = argmax_choice,
) -> Tensor | tuple[Tensor, Tensor]:
    """Returns (B, N + max_new_tokens) ids; a sequence that emitted ``eos_token_id`` keeps
    emitting it. With ``return_logits`` also the (B, new, V) logits each token came from.
    ``use_cache=False`` recomputes the whole prefix every step (a reference for tests).
    ``choose`` picks each next token from the logits (greedy unless a sampler is given)."""
    check_token_ids(prompt_ids, vocab_size(model))
    was_training = model.training
    model.eval()
    try:
        ids = prompt_ids
        mask = attention_mask if attention_mask is not None else torch.ones_like(prompt_ids)
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        cache, step_input, step_logits = None, ids, []
        for _ in range(max_new_tokens):
            if use_cache:
                pos = positions_from_mask(mask, step_input.shape[1])
                out = model(input_ids=step_input, attention_mask=mask, position_ids=pos,
                            past_key_values=cache, use_cache=True)
                cache = out.past_key_values
            else:
                out = model(input_ids=ids, attention_mask=mask,  # no cache built (HF's default builds one)
                            position_ids=positions_from_mask(mask, ids.shape[1]), use_cache=False)
            logits = out.logits[:, -1]  # (B, V)
            nxt = choose(logits)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done = done | (nxt == eos_token_id)
            step_logits.append(logits)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt[:, None])], dim=1)
            step_input = nxt[:, None]
            if eos_token_id is not None and bool(done.all()):
                pad = max_new_tokens - len(step_logits)
                ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), eos_token_id)], dim=1)
                break
    finally:
        model.train(was_training)
    if return_logits:
        return ids, torch.stack(step_logits, dim=1)
    return ids
