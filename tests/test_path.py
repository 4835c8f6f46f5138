"""PaTH (tape/pe/path.py) against its definition: logits are q·(product of Householder-like
transforms)·k, computed one explicit product at a time here; strength 0 is NoPE; a cache continues
the carried keys; gradients reach the transforms. The generic properties run in
tests/test_pe_properties.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from model_helpers import tiny_config, tiny_model
from tape.model import DecoderLM
from tape.pe.path import range_transforms


def explicit_product(directions, strengths, lo, hi):
    """H_hi ... H_lo for one head: directions (N, d), strengths (N,)."""
    d = directions.shape[-1]
    out = torch.eye(d, dtype=directions.dtype)
    for t in range(lo, hi + 1):
        w = directions[t]
        out = (torch.eye(d, dtype=w.dtype) - strengths[t] * torch.outer(w, w)) @ out
    return out


def layer_inputs(model, ids):
    """The first layer's attention input, q, k (as attention sees them) and its PaTH state."""
    block = model.layers[0]
    x = block.attn_norm(model.embed(ids))
    b, n, _ = x.shape
    pos = torch.arange(n).expand(b, n)
    state = block.pe.before_attention(model.pe.make_state(pos, pos, x.dtype), x, None, 0)
    cfg = model.cfg
    q = block.attn.q_proj(x).view(b, n, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    k = block.attn.k_proj(x).view(b, n, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
    return q, k, state


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_logits_are_q_times_the_transform_product_times_k(n_kv_heads):
    model = tiny_model("path", dtype=torch.float64, n_kv_heads=n_kv_heads)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    q, k, state = layer_inputs(model, ids)
    bias = model.layers[0].pe.score_bias(q, k, state, None)
    logits = q @ k.repeat_interleave(4 // n_kv_heads, dim=1).transpose(-1, -2) / math.sqrt(8) + bias
    for b in range(2):
        for h in range(4):
            g = h // (4 // n_kv_heads)
            u, beta = state.directions[b, g], state.strengths[b, g]
            for i in range(9):
                for j in range(i + 1):
                    want = q[b, h, i] @ explicit_product(u, beta, j + 1, i) @ k[b, g, j] / math.sqrt(8)
                    assert torch.allclose(logits[b, h, i, j], want, atol=1e-12, rtol=0)


def test_range_transform_blocks_are_the_products_of_their_ranges():
    gen = torch.Generator().manual_seed(0)
    u = F.normalize(torch.randn(7, 5, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(7, generator=gen, dtype=torch.float64)
    t = range_transforms(u, beta)
    assert torch.equal(t, t.triu())
    for lo in range(7):
        for hi in range(lo, 7):
            ur, tr = u[lo : hi + 1].T, t[lo : hi + 1, lo : hi + 1]
            forward = torch.eye(5, dtype=torch.float64) - ur @ tr @ ur.T  # H_lo ... H_hi
            assert torch.allclose(forward.T, explicit_product(u, beta, lo, hi), atol=1e-12)


def test_strength_zero_is_nope():
    nope = tiny_model("nope", dtype=torch.float64)
    path = DecoderLM(tiny_config("path")).to(torch.float64).eval()
    missing, unexpected = path.load_state_dict(nope.state_dict(), strict=False)
    assert unexpected == [] and all(".pe." in k for k in missing)
    with torch.no_grad():
        for block in path.layers:
            block.pe.direction.weight.normal_()
            block.pe.strength.weight.zero_()
            block.pe.strength.bias.fill_(-1e4)  # 2 sigmoid(-1e4) == 0 exactly in float64
    ids = torch.randint(0, 37, (2, 14), generator=torch.Generator().manual_seed(7))
    assert torch.equal(path(ids).logits, nope(ids).logits) or torch.allclose(
        path(ids).logits, nope(ids).logits, atol=1e-12, rtol=0)
    assert torch.equal(path.generate(ids, max_new_tokens=6), nope.generate(ids, max_new_tokens=6))


def test_transforms_matter():
    model = tiny_model("path", dtype=torch.float64)
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(8))
    base = model(ids).logits
    with torch.no_grad():
        model.layers[0].pe.strength.bias.add_(2.0)
    assert (model(ids).logits - base).abs().max() > 1e-3


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_chunked_cache_equals_one_call(n_kv_heads):
    model = tiny_model("path", dtype=torch.float64, n_kv_heads=n_kv_heads)
    ids = torch.randint(0, 37, (2, 15), generator=torch.Generator().manual_seed(3))
    full = model(ids, use_cache=True)
    out = model(ids[:, :4], use_cache=True)
    logits = [out.logits]
    out = model(ids[:, 4:9], past_key_values=out.past_key_values, use_cache=True)
    logits.append(out.logits)
    for t in range(9, 15):
        out = model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits)
    assert torch.allclose(torch.cat(logits, dim=1), full.logits, atol=1e-10, rtol=0)
    for layer in range(model.cfg.n_layers):
        carried = out.past_key_values.pe_rows[layer]
        assert carried.shape == (2, n_kv_heads, 15, 8)
        assert torch.allclose(carried, full.past_key_values.pe_rows[layer], atol=1e-10, rtol=0)


def test_carried_keys_are_the_keys_through_every_later_transform():
    model = tiny_model("path", dtype=torch.float64)
    ids = torch.randint(0, 37, (1, 6), generator=torch.Generator().manual_seed(4))
    q, k, state = layer_inputs(model, ids)
    carried = model(ids, use_cache=True).past_key_values.pe_rows[0]
    u, beta = state.directions[0, 1], state.strengths[0, 1]
    for j in range(6):
        want = explicit_product(u, beta, j + 1, 5) @ k[0, 1, j]
        assert torch.allclose(carried[0, 1, j], want, atol=1e-12, rtol=0)


def test_generate_with_and_without_cache_agree():
    model = tiny_model("path", n_kv_heads=2)
    prompt = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(2))
    ids_c, logits_c = model.generate(prompt, max_new_tokens=8, return_logits=True)
    ids_f, logits_f = model.generate(prompt, max_new_tokens=8, use_cache=False, return_logits=True)
    assert torch.equal(ids_c, ids_f)
    assert torch.allclose(logits_c, logits_f, atol=1e-5, rtol=1e-4)


def test_gradients_reach_the_transforms():
    model = tiny_model("path").train()
    ids = torch.randint(0, 37, (2, 12))
    logits = model(ids).logits
    F.cross_entropy(logits[:, :-1].reshape(-1, 37), ids[:, 1:].reshape(-1)).backward()
    for block in model.layers:
        for p in (block.pe.direction.weight, block.pe.strength.weight, block.pe.strength.bias):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_bias_stays_float32_in_bf16_and_under_autocast():
    model = tiny_model("path", dtype=torch.bfloat16)
    q, k, state = layer_inputs(model, torch.randint(0, 37, (2, 7)))
    assert state.directions.dtype == torch.float32
    assert model.layers[0].pe.score_bias(q, k, state, None).dtype == torch.float32
    model = tiny_model("path")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(torch.randint(0, 37, (2, 7))).logits).all()


def test_init_starts_at_strength_one():
    pe = DecoderLM(tiny_config("path")).layers[0].pe
    assert torch.equal(pe.strength.bias, torch.zeros(4))
    assert 0 < pe.direction.weight.std() < 0.1


def test_score_bias_without_before_attention_is_an_error():
    model = tiny_model("path")
    pos = torch.arange(5).expand(1, 5)
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(RuntimeError, match="before_attention"):
        model.layers[0].pe.score_bias(q, q, model.pe.make_state(pos, pos, torch.float32), None)


def run_with_kernel(kernel: str, n_kv_heads: int = 2, n: int = 70, seed: int = 3):
    """Logits and the transforms' gradients of a head-dim-16 PaTH model at ``path_kernel``."""
    model = tiny_model("path", n_kv_heads=n_kv_heads, d_model=64, max_seq_len=96, path_kernel=kernel).train()
    ids = torch.randint(0, 37, (2, n), generator=torch.Generator().manual_seed(seed))
    logits = model(ids).logits
    logits.square().mean().backward()
    pe = model.layers[0].pe
    return logits, pe.direction.weight.grad, pe.strength.weight.grad


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_reference_equals_flash_linear_attentions_reference(n_kv_heads):
    """Our (B, H, N, N) computation against flash-linear-attention's own PyTorch reference of the
    same attention (its chunked algorithm, N = 70 not a multiple of its chunk), GQA included."""
    naive = pytest.importorskip("fla.ops.path_attn.naive", reason="flash-linear-attention not installed")
    model = tiny_model("path", dtype=torch.float64, n_kv_heads=n_kv_heads, d_model=64, max_seq_len=96)
    ids = torch.randint(0, 37, (2, 70), generator=torch.Generator().manual_seed(4))
    q, k, state = layer_inputs(model, ids)
    v = torch.randn_like(k)
    bias = model.layers[0].pe.score_bias(q, k, state, None)
    groups = q.shape[1] // k.shape[1]
    logits = q @ k.repeat_interleave(groups, dim=1).transpose(-1, -2) / math.sqrt(16) + bias
    causal = torch.ones(70, 70, dtype=torch.bool).tril()
    ours = logits.masked_fill(~causal, float("-inf")).softmax(-1) @ v.repeat_interleave(groups, dim=1)
    theirs = naive.naive_path_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                   state.directions.transpose(1, 2), state.strengths.transpose(1, 2),
                                   torch.zeros(2, 70, q.shape[1], dtype=q.dtype), 1 / math.sqrt(16))
    torch.testing.assert_close(theirs.transpose(1, 2).double(), ours, atol=2e-5, rtol=2e-5)


def test_the_kernel_call_is_wired_like_the_reference(monkeypatch):
    """path_kernel=fla with flash-linear-attention's kernel replaced by its PyTorch reference
    (the kernel itself runs on CUDA only: tests/test_cuda_paths.py): same logits and gradients
    as path_kernel=reference, so layouts, head groups and scale are passed right."""
    ops = pytest.importorskip("fla.ops.path_attn", reason="flash-linear-attention not installed")
    calls = []

    def reference_kernel(q, k, v, w, beta, g=None, scale=None):
        calls.append(q.shape)
        zeros = torch.zeros(*q.shape[:3], dtype=torch.float32)
        return ops.naive_path_attn(q, k, v, w, beta, zeros, scale).to(q.dtype), None

    monkeypatch.setattr(ops, "parallel_path_attn", reference_kernel)
    monkeypatch.setattr("tape.pe.path.why_not_fla", lambda q, mask: None)
    want = run_with_kernel("reference")
    got = run_with_kernel("fla")
    assert calls and calls[0] == (2, 70, 4, 16)  # (B, N, H, d): the kernel's layout
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_auto_uses_the_reference_where_the_kernel_cannot_run(monkeypatch):
    def no_kernel(*args, **kwargs):
        raise AssertionError("the kernel was called off CUDA")

    monkeypatch.setattr("tape.pe.path.fla_path_attention", no_kernel)
    for a, b in zip(run_with_kernel("auto"), run_with_kernel("reference")):
        assert torch.equal(a, b)


def test_forcing_the_kernel_where_it_cannot_run_says_why():
    with pytest.raises(RuntimeError, match=r"path_kernel=fla cannot run this call: it runs on CUDA only"):
        run_with_kernel("fla")


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="path_kernel='triton' must be one of"):
        tiny_model("path", path_kernel="triton")
