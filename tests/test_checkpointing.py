"""Gradient checkpointing in DecoderLM (ModelConfig.gradient_checkpointing): every block is
recomputed in the backward pass, and the loss and every gradient equal those without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tape.model import DecoderLM, ModelConfig


def _loss_and_grads(cfg: ModelConfig, ids: torch.Tensor, dtype: torch.dtype):
    torch.manual_seed(0)
    model = DecoderLM(cfg).to(dtype).train()
    with torch.no_grad():  # TAPE's zero-initialised maps get weights, so they take part
        for name, p in model.named_parameters():
            if ".pe." in name:
                p.normal_(0, 0.1)
    calls = [0]
    for block in model.layers:
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    torch.manual_seed(1)  # RandPE draws its training positions: the same draw in both runs
    logits = model(ids).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, calls[0]


@pytest.mark.parametrize("pe", ["rope", "tape", "randpe", "fire", "alibi", "t5", "xpos", "nope"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_checkpointing_gives_the_same_loss_and_gradients(pe: str, dtype: torch.dtype) -> None:
    base = ModelConfig(vocab_size=40, n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, max_seq_len=16, pe=pe)
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(3))
    loss0, grads0, calls0 = _loss_and_grads(base, ids, dtype)
    loss1, grads1, calls1 = _loss_and_grads(base.replace(gradient_checkpointing=True), ids, dtype)
    assert (calls0, calls1) == (3, 6)  # each block runs again in backward
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert torch.allclose(loss0, loss1, atol=tol, rtol=0)
    assert grads0.keys() == grads1.keys() and len(grads0) > 0
    for name in grads0:
        assert torch.allclose(grads0[name], grads1[name], atol=tol, rtol=1e-5), name


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(2, 20), layers=st.integers(1, 3), kv=st.sampled_from([1, 2, 4]),
       pe=st.sampled_from(["tape", "rope", "fire"]))
def test_checkpointing_property_over_shapes(batch: int, seq: int, layers: int, kv: int, pe: str) -> None:
    base = ModelConfig(vocab_size=30, n_layers=layers, d_model=32, n_heads=4, n_kv_heads=kv, max_seq_len=20, pe=pe)
    ids = torch.randint(0, 30, (batch, seq), generator=torch.Generator().manual_seed(seq))
    loss0, grads0, _ = _loss_and_grads(base, ids, torch.float64)
    loss1, grads1, calls = _loss_and_grads(base.replace(gradient_checkpointing=True), ids, torch.float64)
    assert calls == 2 * layers and torch.allclose(loss0, loss1, atol=1e-12, rtol=0)
    assert all(torch.allclose(grads0[n], grads1[n], atol=1e-12, rtol=1e-9) for n in grads0)


def test_checkpointing_is_off_in_eval_and_under_no_grad() -> None:
    cfg = ModelConfig(vocab_size=40, n_layers=2, d_model=32, n_heads=4, max_seq_len=16, gradient_checkpointing=True)
    model = DecoderLM(cfg)
    calls = [0]
    for block in model.layers:
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    ids = torch.randint(0, 40, (1, 8))
    with torch.no_grad():
        model.train()(ids)
    model.eval()(ids).logits.sum().backward()
    assert calls[0] == 4  # two forwards of two blocks, nothing recomputed
    out = model.eval()(ids, use_cache=True)  # decoding with the cache is untouched
    assert out.past_key_values is not None
