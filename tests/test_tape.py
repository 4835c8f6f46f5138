"""TAPE's defining properties: RoPE at initialisation, exact invariance to position shifts,
equivariance of one layer to a common phase rotation of E and to token permutations, and
agreement with a full-width reference written from the equations of tape-spec A.2.3."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model_helpers import phase_rotate, randomize, tiny_config, tiny_model, triton_interpreter_problem
from tape.model import DecoderLM
from tape.pe.base import PositionState
from tape.pe.tape import _head_map, _head_map_grad, _token_major, _UpdateE

FAST = settings(max_examples=12, deadline=None)


# ----------------------------------------------------------------------------- identity at init
@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(n_kv_heads=2),
        dict(n_kv_heads=1, n_layers=3),
        dict(tape_zero_init="w2"),
        dict(tape_post_attn="rowsum", n_layers=3),
        dict(rope_theta=500.0, rope_scaling=2.0),
        dict(rope_yarn_factor=2.0, rope_yarn_original_length=12),
    ],
    ids=["mha", "gqa", "mqa", "zero-w2", "rowsum", "theta-pi", "yarn"],
)
def test_tape_at_init_equals_rope(overrides):
    torch.manual_seed(0)
    rope = randomize(DecoderLM(tiny_config("rope", **overrides)))
    tape_model = DecoderLM(tiny_config("tape", **overrides))  # TAPE's own init: zeros where needed
    missing, _ = tape_model.load_state_dict(rope.state_dict(), strict=False)
    assert missing and all(".pe." in k for k in missing)
    ids = torch.randint(0, 37, (3, 24))
    pos = torch.arange(24).expand(3, 24) + 11
    diff = (rope(ids, position_ids=pos).logits - tape_model(ids, position_ids=pos).logits).abs().max()
    assert diff <= 1e-5


# ----------------------------------------------------------------------------- shift invariance
@FAST
@given(
    offset=st.integers(0, 10_000),
    n=st.integers(2, 20),
    kv=st.sampled_from([None, 2, 1]),
    post=st.sampled_from(["mix", "rowsum"]),
    seed=st.integers(0, 2**16),
)
def test_tape_logits_invariant_to_position_shift(offset, n, kv, post, seed):
    model = tiny_model("tape", dtype=torch.float64, seed=seed, n_layers=3, n_kv_heads=kv,
                       tape_post_attn=post)
    ids = torch.randint(0, 37, (2, n), generator=torch.Generator().manual_seed(seed))
    pos = torch.arange(n).expand(2, n)
    a = model(ids, position_ids=pos).logits
    b = model(ids, position_ids=pos + offset).logits
    assert (a - b).abs().max() <= 1e-9


def test_tape_weights_are_active():
    """Random TAPE weights change the logits (so the invariance test is not vacuous)."""
    model = tiny_model("tape", dtype=torch.float64, n_layers=3)
    rope = tiny_model("tape", dtype=torch.float64, n_layers=3)
    with torch.no_grad():
        for name, p in rope.named_parameters():
            if ".pe." in name:
                p.zero_()
    ids = torch.randint(0, 37, (2, 12))
    assert (model(ids).logits - rope(ids).logits).abs().max() > 1e-3


# ----------------------------------------------------------------------------- layer symmetries
def _middle_block(kv, post, dtype=torch.float64, seed=0):
    model = tiny_model("tape", dtype=dtype, seed=seed, n_layers=2, n_kv_heads=kv, tape_post_attn=post)
    return model, model.layers[0]  # layer 0 updates E (the last layer does not)


@FAST
@given(kv=st.sampled_from([None, 2, 1]), post=st.sampled_from(["mix", "rowsum"]), n=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_layer_equivariant_to_common_phase_rotation(kv, post, n, seed):
    model, block = _middle_block(kv, post, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    he, d = model.cfg.kv_heads, model.cfg.head_dim
    x = torch.randn(2, n, model.cfg.d_model, generator=gen, dtype=torch.float64)
    e = torch.randn(2, he, n, d, generator=gen, dtype=torch.float64)  # arbitrary E, not a RoPE table
    phase = torch.rand(d // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    pos = torch.arange(n).expand(2, n)
    x1, s1 = block(x, PositionState(pos, pos, rot=e), None, None, 0)
    x2, s2 = block(x, PositionState(pos, pos, rot=phase_rotate(e, phase)), None, None, 0)
    assert torch.allclose(x1, x2, atol=1e-10, rtol=0)
    assert torch.allclose(phase_rotate(s1.rot, phase), s2.rot, atol=1e-10, rtol=0)
    assert (s1.rot - e).abs().max() > 1e-4  # the layer did update E


@FAST
@given(kv=st.sampled_from([None, 2]), post=st.sampled_from(["mix", "rowsum"]), n=st.integers(2, 12),
       seed=st.integers(0, 2**16))
def test_layer_permutation_equivariant_without_causal_mask(kv, post, n, seed):
    model, block = _middle_block(kv, post, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, model.cfg.d_model, generator=gen, dtype=torch.float64)
    e = torch.randn(2, model.cfg.kv_heads, n, model.cfg.head_dim, generator=gen, dtype=torch.float64)
    perm = torch.randperm(n, generator=gen)
    pos = torch.arange(n).expand(2, n)
    full = torch.ones(1, 1, n, n, dtype=torch.bool)  # an explicit all-True mask: no causality
    x1, s1 = block(x, PositionState(pos, pos, rot=e), full, None, 0)
    x2, s2 = block(x[:, perm], PositionState(pos, pos, rot=e[:, :, perm]), full, None, 0)
    assert torch.allclose(x1[:, perm], x2, atol=1e-10, rtol=0)
    assert torch.allclose(s1.rot[:, :, perm], s2.rot, atol=1e-10, rtol=0)


# ----------------------------------------------------------------------------- fused == unfused
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kv", [None, 2])
def test_fused_equals_unfused_on_every_backend(dtype, kv):
    ids = torch.randint(0, 37, (2, 17), generator=torch.Generator().manual_seed(7))
    results = {}
    # the Triton kernel takes fp32/16, bf16; on CPU it runs under the interpreter (where that works)
    kernel = dtype == torch.float32 and not triton_interpreter_problem()
    backends = ["eager", "sdpa"] + (["triton"] if kernel else [])
    for backend in backends:
        for fused in (True, False, None, "concat", "padded"):
            if (backend != "sdpa" and fused in ("concat", "padded")) or (backend == "triton" and not fused):
                continue  # the layouts are SDPA's; the kernel is one pass whatever fused says
            model = tiny_model("tape", dtype=dtype, n_layers=3, n_kv_heads=kv,
                               attn_backend=backend, tape_fused=fused).train()
            logits = model(ids).logits
            logits.square().mean().backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            results[backend, fused] = (logits.detach(), grads)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    ref_logits, ref_grads = results["eager", True]
    for key, (logits, grads) in results.items():
        assert torch.allclose(logits, ref_logits, atol=tol, rtol=tol), key
        assert torch.allclose(grads, ref_grads, atol=tol, rtol=1e-3 if dtype == torch.float32 else tol), key


# ----------------------------------------------------------------------------- full-width reference
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat([-x[..., d:], x[..., :d]], dim=-1)


def reference_tape_logits(model: DecoderLM, ids: torch.Tensor, post: str) -> torch.Tensor:
    """TAPE as the official code writes it (tape-spec A.2.3): cos and sin each at full head
    width d with duplicated halves, updated by A·cos, A·sin, the post-attention map and the
    PE-MLP. Written from the equations, independently of tape.pe.tape."""
    cfg = model.cfg
    b, n = ids.shape
    h, d = cfg.n_heads, cfg.head_dim
    x = model.embed.weight[ids]
    inv = model.pe.opts.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv  # (N, d/2)
    emb = torch.cat([ang, ang], dim=-1)  # duplicated halves
    cos = emb.cos().expand(b, h, n, d).clone()
    sin = emb.sin().expand(b, h, n, d).clone()
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for block in model.layers:
        at, mlp, pe = block.attn, block.mlp, block.pe
        hh = _rms(x, block.attn_norm.weight, cfg.norm_eps)
        q = (hh @ at.q_proj.weight.T).view(b, n, h, d).transpose(1, 2)
        k = (hh @ at.k_proj.weight.T).view(b, n, h, d).transpose(1, 2)
        v = (hh @ at.v_proj.weight.T).view(b, n, h, d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        a = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + ((a @ v).transpose(1, 2).reshape(b, n, h * d)) @ at.o_proj.weight.T
        if pe.post_attn is not None:
            wpost = pe.post_attn.weight
            cos_a, sin_a = a @ cos, a @ sin
            if post == "rowsum":  # the official einsum('bqnd,qe->bqnd'): e is summed away
                cos = cos + torch.einsum("bqnd,qe->bqnd", cos_a, wpost)
                sin = sin + torch.einsum("bqnd,qe->bqnd", sin_a, wpost)
            else:
                cos = cos + torch.einsum("bhnd,gh->bgnd", cos_a, wpost)
                sin = sin + torch.einsum("bhnd,gh->bgnd", sin_a, wpost)
        hm = _rms(x, block.mlp_norm.weight, cfg.norm_eps)
        m = (torch.nn.functional.silu(hm @ mlp.gate_proj.weight.T) * (hm @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
        if pe.x_proj is not None:
            g = torch.nn.functional.silu(m @ pe.x_proj.weight.T)  # (B, N, I)
            gate = g.transpose(1, 2)[..., None]  # (B, I, N, 1)
            new = []
            for t in (cos, sin):
                u = torch.einsum("ih,bhnd->bind", pe.w1.weight, t) * gate
                new.append(t + torch.einsum("hi,bind->bhnd", pe.w2.weight, u))
            cos, sin = new
        x = x + m
        assert torch.equal(cos[..., : d // 2], cos[..., d // 2 :])  # the halves stay tied
    return _rms(x, model.norm.weight, cfg.norm_eps) @ model.lm_head.weight.T


@pytest.mark.parametrize("post", ["mix", "rowsum"])
@pytest.mark.parametrize("n_layers", [1, 3])
def test_half_width_storage_equals_full_width_reference(post, n_layers):
    model = tiny_model("tape", dtype=torch.float64, n_layers=n_layers, tape_post_attn=post)
    ids = torch.randint(0, 37, (2, 14), generator=torch.Generator().manual_seed(8))
    ours = model(ids).logits
    ref = reference_tape_logits(model, ids, post)
    assert torch.allclose(ours, ref, atol=1e-10, rtol=0)


# ----------------------------------------------------------------------------- switches and cache
def test_ablation_switches_remove_their_parameters():
    both = DecoderLM(tiny_config("tape", n_layers=3))
    names = {n for n, _ in both.named_parameters() if ".pe." in n}
    assert {"layers.0.pe.post_attn.weight", "layers.0.pe.x_proj.weight", "layers.1.pe.w1.weight"} <= names
    assert not any(n.startswith("layers.2.") for n in names)  # the last layer's E is never read
    no_attn = DecoderLM(tiny_config("tape", n_layers=3, tape_attn_update=False))
    assert not any("post_attn" in n for n, _ in no_attn.named_parameters())
    no_mlp = DecoderLM(tiny_config("tape", n_layers=3, tape_mlp_update=False))
    assert not any(k in n for n, _ in no_mlp.named_parameters() for k in ("x_proj", "w1", "w2"))


def test_both_updates_off_is_rope_even_with_random_weights():
    neither = tiny_model("tape", tape_attn_update=False, tape_mlp_update=False)
    rope = DecoderLM(tiny_config("rope"))
    rope.load_state_dict(neither.state_dict())
    ids = torch.randint(0, 37, (2, 10))
    assert torch.allclose(neither(ids).logits, rope.eval()(ids).logits, atol=1e-6)


def test_cache_keeps_each_layers_e_rows():
    model = tiny_model("tape", n_layers=3, n_kv_heads=2)
    out = model(torch.randint(0, 37, (2, 6)), use_cache=True)
    step = model(torch.randint(0, 37, (2, 1)), past_key_values=out.past_key_values, use_cache=True)
    cache = step.past_key_values
    assert cache.length == 7
    for layer in cache.layers[:-1]:
        assert layer.extra.shape == (2, 2, 7, model.cfg.head_dim)  # (B, Hkv, T, d)
    assert cache.layers[-1].extra is None  # the last layer does not aggregate E


# ----------------------------------------------------------------------------- the folded E update
@pytest.mark.parametrize("parts,token_major", [("both", False), ("both", True), ("attention only", False),
                                               ("attention only", True), ("mix only", False)])
def test_e_update_gradients_match_finite_differences(parts, token_major):
    """The custom backward of E' = (I + M)(E + P·AE): E, A·E, P, gate, W1, W2 all get gradients
    (float64), with either update absent as in the ablations; A·E laid out head- or token-major
    (attention's output for token-major q, which the head map takes token by token)."""
    gen = torch.Generator().manual_seed(3)
    b, he, h, n, d, i = 2, 2, 4, 5, 4, 6
    e, ae, p, gate, w1, w2 = [torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
                              for s in ((b, he, n, d), (b, h, n, d), (he, h), (b, n, i), (i, he), (he, i))]
    if token_major:
        ae = ae.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        assert _token_major(ae)
    if parts == "attention only":
        gate = w1 = w2 = None
    if parts == "mix only":
        ae = p = None
    assert torch.autograd.gradcheck(_UpdateE.apply, (e, ae, p, gate, w1, w2))


def test_the_head_map_takes_token_major_heads_without_a_copy():
    """A token-major x (B, H, N, d) maps token by token: the same numbers as head-major, and no
    copy dispatched for it or for p's gradient."""
    from tape.bench.dispatch_count import device_ops

    gen = torch.Generator().manual_seed(0)
    p = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 4, 7, 8, generator=gen, dtype=torch.float64)
    grad = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64)
    token_major = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert _token_major(token_major) and not _token_major(x)
    torch.testing.assert_close(_head_map(p, token_major), _head_map(p, x), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(_head_map_grad(grad.transpose(1, 2).contiguous().transpose(1, 2), token_major),
                               torch.einsum("bgnd,bhnd->gh", grad, x), atol=1e-12, rtol=1e-12)
    ops = device_ops(lambda: (_head_map(p, token_major), _head_map_grad(_head_map(p, token_major), token_major)))
    assert set(ops) <= {"bmm", "sum"}, ops


@FAST
@given(kv=st.sampled_from([None, 2, 1]), post=st.sampled_from(["mix", "rowsum"]), n=st.integers(1, 9),
       seed=st.integers(0, 99))
def test_one_e_update_equals_the_attention_update_then_the_token_mix(kv, post, n, seed):
    """after_attention then after_mlp equal E1 = E + map(A·E) (the paper's head mix, or the
    official rowsum), then E1 + W2 diag(g) W1 E1, written out with einsums (tape-spec A.2.3)."""
    model = tiny_model("tape", dtype=torch.float64, n_kv_heads=kv, seed=seed, tape_post_attn=post)
    layer, cfg = model.layers[0].pe, model.cfg
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.post_attn.weight.normal_(generator=gen)
        layer.w1.weight.normal_(generator=gen)
    e = torch.randn(2, cfg.kv_heads, n, cfg.head_dim, generator=gen, dtype=torch.float64)
    ae = torch.randn(2, cfg.n_heads, n, cfg.head_dim, generator=gen, dtype=torch.float64)
    m = torch.randn(2, n, cfg.d_model, generator=gen, dtype=torch.float64)
    pos = torch.arange(n).expand(2, n)
    state = layer.after_attention(PositionState(pos, pos, rot=e), ae)
    assert torch.equal(state.rot, e)  # applied after the MLP, with the token mix
    out = layer.after_mlp(state, m)
    w = layer.post_attn.weight
    if post == "mix":
        e1 = e + torch.einsum("gh,bhnd->bgnd", w, ae)
    else:  # head h scaled by sum_e W[h, e], summed over the query heads of each E head
        scaled = ae * w.sum(-1)[:, None, None]
        e1 = e + scaled.view(2, cfg.kv_heads, -1, n, cfg.head_dim).sum(2)
    g = torch.nn.functional.silu(m @ layer.x_proj.weight.T).transpose(1, 2)[..., None]  # (B, I, N, 1)
    ref = e1 + torch.einsum("hi,bind->bhnd", layer.w2.weight, torch.einsum("ih,bhnd->bind", layer.w1.weight, e1) * g)
    assert out.pending is None
    assert torch.allclose(out.rot, ref, atol=1e-12, rtol=1e-12)


@FAST
@given(kv=st.sampled_from([None, 2, 1]), n=st.integers(1, 9), seed=st.integers(0, 99))
def test_token_mix_equals_the_two_matmul_form(kv, n, seed):
    """W2 · diag(g) · W1 · E folded per token equals u = W1·E, u *= g, W2·u (tape-spec A.2.3)."""
    model = tiny_model("tape", dtype=torch.float64, n_kv_heads=kv, seed=seed)
    layer = model.layers[0].pe
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(2, model.cfg.kv_heads, n, model.cfg.head_dim, generator=gen, dtype=torch.float64)
    m = torch.randn(2, n, model.cfg.d_model, generator=gen, dtype=torch.float64)
    pos = torch.arange(n).expand(2, n)
    out = layer.after_mlp(PositionState(pos, pos, rot=e), m).rot
    g = torch.nn.functional.silu(m @ layer.x_proj.weight.T).transpose(1, 2)[..., None]  # (B, I, N, 1)
    u = torch.einsum("ih,bhnd->bind", layer.w1.weight, e) * g
    ref = e + torch.einsum("hi,bind->bhnd", layer.w2.weight, u)
    assert torch.allclose(out, ref, atol=1e-12, rtol=1e-12)


# ----------------------------------------------------------------------------- E precision
def test_tapes_e_is_float32_at_every_layer_of_a_bf16_model(monkeypatch):
    """A bf16 model (and bf16 autocast) keeps E in float32 through every layer's updates."""
    import tape.model.decoder as decoder

    seen = []
    real = decoder.Block.forward

    def spy(self, x, state, mask, cache, idx):
        seen.append(state.rot.dtype)
        x, state = real(self, x, state, mask, cache, idx)
        seen.append(state.rot.dtype)
        return x, state

    monkeypatch.setattr(decoder.Block, "forward", spy)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    model = tiny_model("tape", dtype=torch.bfloat16, n_layers=3, n_kv_heads=2).train()
    model(ids).logits.float().square().mean().backward()
    assert seen == [torch.float32] * 6
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters() if p.grad is not None)
    seen.clear()
    fp32 = tiny_model("tape", n_layers=3).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp32(ids).logits.float().square().mean().backward()
    assert seen == [torch.float32] * 6


def test_the_e_update_asks_nothing_of_autocast_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's dynamo cannot trace ``torch.amp.is_autocast_available``: the devices with
    autocast are read once, at import, and the E update calls nothing of it."""
    from tape.pe import tape as tape_pe

    def refuse(*args, **kwargs):
        raise AssertionError("is_autocast_available called inside the E update")

    monkeypatch.setattr(torch.amp, "is_autocast_available", refuse)
    e, ae = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    gate, w1, w2 = torch.randn(1, 5, 3), torch.randn(3, 2), torch.randn(2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _UpdateE.apply(e, ae, torch.eye(2), gate, w1, w2)
    assert out.dtype == torch.float32 and "cpu" in tape_pe.AUTOCAST_DEVICES and "meta" not in tape_pe.AUTOCAST_DEVICES
