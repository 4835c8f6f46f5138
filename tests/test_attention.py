"""The attention shim: every backend and fusion mode gives the same A·V and A·E."""

import pytest
import torch

from tape.model.attention import attend, causal_mask, flash_available


def _inputs(b=2, h=4, hkv=2, nq=6, nk=6, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    e = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    bias = torch.randn(b, h, nq, nk, generator=g, dtype=torch.float32)
    return q, k, v, e, bias


def test_causal_mask_is_lower_right_aligned_with_padding():
    valid = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    m = causal_mask(2, valid, 5, torch.device("cpu"))  # 2 queries = the last 2 of 5 keys
    assert m.shape == (2, 1, 2, 5)
    assert m[1, 0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert m[0, 0].tolist() == [[False, True, True, True, False], [False, True, True, True, True]]
    pad_query = causal_mask(3, torch.tensor([[0, 0, 1]], dtype=torch.bool), 3, torch.device("cpu"))
    assert pad_query[0, 0, 0].tolist() == [True, False, False]  # a pad query sees itself only


def _reference(q, k, v, e, bias, mask):
    """Attention written out directly, float64, one head at a time."""
    groups = q.shape[1] // k.shape[1]
    outs_v, outs_e = torch.zeros_like(q), torch.zeros_like(q)
    for h in range(q.shape[1]):
        s = q[:, h] @ k[:, h // groups].transpose(-1, -2) / q.shape[-1] ** 0.5
        if bias is not None:
            s = s + bias[:, h].double()
        s = s.masked_fill(~mask[:, 0], float("-inf"))
        a = s.softmax(-1)
        outs_v[:, h], outs_e[:, h] = a @ v[:, h // groups], a @ e[:, h // groups]
    return outs_v, outs_e


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", ["causal", "cached", "padded"])
def test_backends_match_reference(backend, fuse, with_bias, case):
    nq, nk = (6, 6) if case != "cached" else (3, 7)
    q, k, v, e, bias = _inputs(nq=nq, nk=nk)
    valid = None
    if case == "padded":
        valid = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    explicit = causal_mask(nq, valid, nk, q.device)
    mask = None if case == "causal" else explicit
    out, out_e = attend(q, k, v, extra=e, mask=mask, bias=bias if with_bias else None,
                        backend=backend, fuse=fuse)
    ref_v, ref_e = _reference(q, k, v, e, bias if with_bias else None, explicit)
    assert torch.allclose(out, ref_v, atol=1e-10) and torch.allclose(out_e, ref_e, atol=1e-10)


def test_without_extra_values_returns_none():
    q, k, v, _, _ = _inputs()
    out, extra = attend(q, k, v, backend="sdpa")
    assert extra is None and out.shape == q.shape


def test_forcing_flash_without_it_fails_clearly():
    if flash_available():
        pytest.skip("flash-attn is installed on a CUDA machine")
    q, k, v, _, _ = _inputs()
    with pytest.raises(RuntimeError, match="flash-attn"):
        attend(q, k, v, backend="flash")


@pytest.mark.skipif(not flash_available(), reason="needs flash-attn on a CUDA device (pip install -e .[flash])")
@pytest.mark.parametrize("hkv", [4, 2])
def test_flash_matches_sdpa_on_gpu(hkv):
    q, k, v, e = (t.cuda().to(torch.bfloat16) for t in _inputs(hkv=hkv, nq=64, nk=64, d=64)[:4])
    out_f, e_f = attend(q, k, v, extra=e, backend="flash")
    out_s, e_s = attend(q, k, v, extra=e, backend="sdpa", fuse=False)
    assert (out_f - out_s).abs().max() < 2e-2 and (e_f - e_s).abs().max() < 2e-2
