"""The attention shim: every backend and fusion mode gives the same A·V and A·E."""

import pytest
import torch

import tape.model.attention as attention
import tape.model.decoder as decoder
from model_helpers import tiny_model, triton_interpreter_problem
from tape.model.attention import Plan, attend, causal_mask, flash_available, pick_backend, plan_attention


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


# ----------------------------------------------------------------------------- value layouts
@pytest.mark.parametrize("fuse", ["two_calls", "concat", "padded"])
@pytest.mark.parametrize("case", ["causal", "cached", "padded"])
@pytest.mark.parametrize("hkv", [4, 2])
def test_value_layouts_match_reference(fuse, case, hkv):
    nq, nk = (6, 6) if case != "cached" else (3, 7)
    q, k, v, e, bias = _inputs(nq=nq, nk=nk, hkv=hkv)
    valid = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6], dtype=torch.bool) if case == "padded" else None
    explicit = causal_mask(nq, valid, nk, q.device)
    out, out_e = attend(q, k, v, extra=e, mask=None if case == "causal" else explicit,
                        backend="sdpa", fuse=fuse)
    ref_v, ref_e = _reference(q, k, v, e, None, explicit)
    assert torch.allclose(out, ref_v, atol=1e-10) and torch.allclose(out_e, ref_e, atol=1e-10)


# ----------------------------------------------------------------------------- the decision
def _fake(monkeypatch, device="cuda", flash=False, triton=False):
    """Pretend CPU tensors live on ``device`` and that flash-attn / triton are installed."""
    monkeypatch.setattr(attention, "_device_type", lambda x: device)
    monkeypatch.setattr(attention, "flash_available", lambda: flash)
    monkeypatch.setattr(attention, "triton_available", lambda: triton)


def _plan(backend="auto", fuse=None, hkv=4, nk=6, dtype=torch.bfloat16, extra=True, mask=None):
    q, k, v, e, _ = _inputs(hkv=hkv, nq=nk, nk=nk, dtype=dtype)
    return plan_attention(backend, fuse, q, k, e if extra else None, mask, None, False)


@pytest.mark.parametrize("flash", [False, True])
def test_cuda_auto_prefers_the_triton_kernel_for_tape(monkeypatch, flash):
    _fake(monkeypatch, flash=flash, triton=True)
    assert _plan() == Plan("triton", "single")
    assert _plan(fuse=True) == Plan("triton", "single")  # tape_fused=true means the kernel on CUDA
    assert _plan(fuse=False) == Plan("flash" if flash else "sdpa", "two_calls")
    assert _plan(extra=False) == Plan("flash" if flash else "sdpa", "single")  # RoPE & co.
    mask = causal_mask(6, torch.ones(2, 6, dtype=torch.bool), 6, torch.device("cpu"))
    assert _plan(mask=mask).backend != "triton"  # a padding mask falls back


def test_cuda_without_triton_falls_back_by_the_documented_order(monkeypatch):
    _fake(monkeypatch, flash=True, triton=False)
    assert _plan() == Plan("flash", "two_calls")  # flash-attn wants equal widths
    _fake(monkeypatch, flash=False, triton=False)
    assert _plan() == Plan("sdpa", "concat")  # SDPA's efficient/cuDNN kernels take [V | E]
    assert _plan(fuse=True) == Plan("sdpa", "concat")


def test_cuda_gqa_with_fused_values_uses_two_equal_width_calls(monkeypatch):
    _fake(monkeypatch, flash=False, triton=False)
    assert _plan(hkv=2) == Plan("sdpa", "two_calls")
    assert _plan(hkv=4) == Plan("sdpa", "concat")
    _fake(monkeypatch, flash=False, triton=True)
    assert _plan(hkv=2) == Plan("triton", "single")  # the kernel handles GQA itself


def test_cpu_auto_picks_the_layout_by_length(monkeypatch):
    _fake(monkeypatch, device="cpu", flash=False, triton=True)
    short, long = attention.CPU_CONCAT_MAX_KEYS, attention.CPU_CONCAT_MAX_KEYS + 1
    assert _plan(nk=short, dtype=torch.float32) == Plan("sdpa", "concat")
    assert _plan(nk=long, dtype=torch.float32) == Plan("sdpa", "padded")
    assert _plan(nk=long, fuse=True, dtype=torch.float32) == Plan("sdpa", "padded")
    assert _plan(fuse=False, dtype=torch.float32) == Plan("sdpa", "two_calls")


def test_forcing_triton_where_it_cannot_run_fails_clearly(monkeypatch):
    _fake(monkeypatch, triton=False)
    with pytest.raises(RuntimeError, match="attn_backend='triton' needs triton"):
        _plan(backend="triton")
    _fake(monkeypatch, triton=True)
    with pytest.raises(RuntimeError, match="no padding mask"):
        _plan(backend="triton", mask=causal_mask(6, None, 6, torch.device("cpu")))
    assert _plan(backend="triton", extra=False).backend == "sdpa"  # calls without E go on as auto


# ----------------------------------------------------------------------------- dtypes at the kernel
ROTARY = ["rope", "tape", "xpos", "randpe"]


def _record_attend(monkeypatch):
    calls = []
    real = decoder.attend

    def spy(q, k, v, **kw):
        calls.append((q.dtype, k.dtype, v.dtype, pick_backend(kw["backend"], q, kw["mask"], kw["bias"],
                                                             kw["alibi_slopes"] is not None,
                                                             extra=kw["extra"], k=k, fuse=kw["fuse"])))
        return real(q, k, v, **kw)

    monkeypatch.setattr(decoder, "attend", spy)
    return calls


@pytest.mark.parametrize("pe", ROTARY)
def test_under_autocast_rotary_pes_hand_attend_q_k_in_vs_dtype(monkeypatch, pe):
    calls = _record_attend(monkeypatch)
    model = tiny_model(pe, n_layers=2).train()
    ids = torch.randint(0, 37, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids).logits.float().mean().backward()
    assert [c[:3] for c in calls] == [(torch.bfloat16,) * 3] * 2


@pytest.mark.parametrize("pe", ROTARY)
def test_with_flash_present_rotary_pes_reach_flash(monkeypatch, pe):
    """Faked flash-attn on 'CUDA': after the dtype cast every rotary PE's call qualifies."""
    _fake(monkeypatch, flash=True, triton=False)

    def fake_flash(q, k, v, softmax_scale, causal, alibi_slopes):  # (B, N, H, d) layout
        assert q.dtype == k.dtype == v.dtype == torch.bfloat16 and causal
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            scale=softmax_scale, enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)

    monkeypatch.setattr(attention, "_flash_attn_func", fake_flash)
    calls = _record_attend(monkeypatch)
    model = tiny_model(pe, n_layers=2).train()
    ids = torch.randint(0, 37, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids).logits.float().mean().backward()
    assert [c[3] for c in calls] == ["flash", "flash"]


def test_triton_backend_on_cpu_runs_the_interpreter_and_matches_sdpa():
    if triton_interpreter_problem():
        pytest.skip(triton_interpreter_problem())
    q, k, v, e, _ = _inputs(nq=5, nk=9, d=16, dtype=torch.float32)
    out, out_e = attend(q, k, v, extra=e, backend="triton")
    ref, ref_e = attend(q, k, v, extra=e, backend="sdpa", fuse=False,
                        mask=causal_mask(5, None, 9, q.device))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_e, ref_e, atol=1e-5, rtol=1e-5)



@pytest.mark.parametrize("backend,fuse", [("eager", None), ("sdpa", False), ("sdpa", "concat"),
                                          ("sdpa", "padded"), ("auto", None), ("triton", None), ("flex", None)])
@pytest.mark.parametrize("bias", [False, True])
def test_no_mask_with_fewer_queries_is_lower_right_causal_on_every_path(backend, fuse, bias):
    """mask=None with 1 < Nq < Nk (several new tokens after a cache) ran SDPA and eager with no
    mask at all (every query saw every key), while the Triton kernel and flex were causal."""
    if backend in ("triton", "flex") and bias:
        pytest.skip("the kernels take no bias")
    if backend == "triton" and triton_interpreter_problem():
        pytest.skip(triton_interpreter_problem())
    if backend == "flex" and not attention.flex_available():
        pytest.skip("needs torch >= 2.5 (FlexAttention)")
    q, k, v, e, b = _inputs(nq=5, nk=9, d=16, dtype=torch.float32)
    b = b if bias else None
    with torch.no_grad():
        out, out_e = attend(q, k, v, extra=e, bias=b, backend=backend, fuse=fuse)
        ref, ref_e = attend(q, k, v, extra=e, bias=b, backend="eager",
                            mask=causal_mask(5, None, 9, q.device))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_e, ref_e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["triton", "flex"])
def test_a_chunk_after_the_cache_runs_on_the_forced_kernel(backend):
    """Several new tokens after a cache got an explicit mask, which the forced kernels refuse."""
    if backend == "triton" and triton_interpreter_problem():
        pytest.skip(triton_interpreter_problem())
    if backend == "flex" and not attention.flex_available():
        pytest.skip("needs torch >= 2.5 (FlexAttention)")
    model = tiny_model("tape", n_kv_heads=2, d_model=64, attn_backend=backend)  # head dim 16
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        rest = model(ids[:, 5:], past_key_values=out.past_key_values, use_cache=True)
    torch.testing.assert_close(torch.cat([out.logits, rest.logits], dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend,passed", [("triton", torch.float32), ("sdpa", torch.bfloat16)])
def test_only_the_kernel_takes_a_float32_e_uncast(monkeypatch, backend, passed):
    """The kernel casts E itself and saves TAPE's float32 E (alive anyway) instead of a bf16 copy;
    every other path gets E in the values' dtype."""
    q, k, v, e, _ = _inputs(nq=4, nk=4, d=16, dtype=torch.float32)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    seen = []
    monkeypatch.setattr(attention, "triton_available", lambda: True)
    monkeypatch.setattr(attention, "_triton", lambda q, k, v, extra, scale, rotation=None: seen.append(extra.dtype) or [v, v])
    real_sdpa = attention._sdpa
    monkeypatch.setattr(attention, "_sdpa", lambda q, k, v, *a: seen.append(v.dtype) or real_sdpa(q, k, v, *a))
    attend(q, k, v, extra=e, backend=backend, fuse=False)
    assert seen[-1] == passed


# ----------------------------------------------------------------------------- FlexAttention
FLEX_CASES = [dict(nq=6, nk=6, hkv=4), dict(nq=6, nk=6, hkv=2), dict(nq=3, nk=9, hkv=2), dict(nq=1, nk=7, hkv=4)]


@pytest.mark.skipif(not attention.flex_available(), reason="needs torch >= 2.5 (FlexAttention)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", FLEX_CASES, ids=lambda c: f"nq{c['nq']}-nk{c['nk']}-hkv{c['hkv']}")
def test_flex_backend_matches_the_reference_forward_on_cpu(case, dtype):
    """One flex_attention call with value [V | E], causal lower-right aligned, GQA; CPU forward."""
    q, k, v, e, _ = _inputs(nq=case["nq"], nk=case["nk"], hkv=case["hkv"], d=16, dtype=dtype)
    e = torch.cat([e, e[..., :8] * 2], dim=-1)  # E wider than V: the value width differs from q/k's
    with torch.no_grad():
        out, out_e = attend(q, k, v, extra=e, backend="flex")
    groups = q.shape[1] // k.shape[1]
    scores = q.double() @ k.double().repeat_interleave(groups, 1).transpose(-1, -2) / 16**0.5
    a = scores.masked_fill(~causal_mask(case["nq"], None, case["nk"], q.device), float("-inf")).softmax(-1)
    ref_v, ref_e = (a @ x.double().repeat_interleave(groups, 1) for x in (v, e))  # (B, H, Nq, dv)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert out.dtype == dtype and out_e.shape == ref_e.shape
    torch.testing.assert_close(out.double(), ref_v, atol=tol, rtol=tol)
    torch.testing.assert_close(out_e.double(), ref_e, atol=tol, rtol=tol)


@pytest.mark.skipif(not attention.flex_available(), reason="needs torch >= 2.5 (FlexAttention)")
def test_flex_inside_a_compiled_model_is_one_graph_without_caches(recwarn):
    """Under an outer torch.compile the call and its block mask are traced (no nested compile, no
    lru_cache, which dynamo would skip with a warning): one graph (fullgraph), the eager result."""
    import torch._dynamo as dynamo

    q, k, v, e, _ = _inputs(nq=5, nk=9, hkv=2, d=16, dtype=torch.float32)

    def call(q, k, v, e):
        return attend(q, k, v, extra=e, backend="flex")

    with torch.no_grad():
        dynamo.reset()
        compiled = torch.compile(call, backend="eager", fullgraph=True)(q, k, v, e)  # a break raises
        eager = call(q, k, v, e)
    assert not [w for w in recwarn if "lru_cache" in str(w.message)]
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want)


def test_backend_checks_look_nothing_up_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's dynamo refuses to trace importlib's find_spec: a lookup inside plan_attention
    broke every compiled attention call (and PaTH's kernel check, its CUDA calls). Availability is
    read once, at import."""
    import importlib.util

    from tape.pe import path

    before = (attention.flex_available(), attention.triton_available(), path.fla_installed())

    def refuse(*args, **kwargs):
        raise AssertionError("find_spec called while planning an attention call")

    monkeypatch.setattr(importlib.util, "find_spec", refuse)
    assert (attention.flex_available(), attention.triton_available(), path.fla_installed()) == before
    assert not hasattr(path.fla_installed, "cache_info")  # dynamo skips functools caches too
    monkeypatch.setattr(attention, "_device_type", lambda x: "cuda")
    q, k, v, e, _ = _inputs(d=16, dtype=torch.bfloat16)
    attention.plan_attention("auto", None, q, k, e, None, None, False)


@pytest.mark.skipif(not attention.flex_available(), reason="needs torch >= 2.5 (FlexAttention)")
def test_flex_backend_refuses_what_it_cannot_run_with_the_fix():
    q, k, v, e, bias = _inputs(d=16, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="attn_backend='flex' needs .* no padding mask"):
        attend(q, k, v, extra=e, bias=bias, backend="flex")
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="no backward on CPU.*torch.no_grad"):
        attend(q, k, v, extra=e, backend="flex")
    assert _plan("flex", extra=False) == Plan("sdpa", "single")  # a call without E goes on as auto
    assert _plan("flex") == Plan("flex", "single")


def test_cuda_auto_takes_flexattention_first_only_when_measured_faster(monkeypatch):
    _fake(monkeypatch, triton=True)
    assert _plan() == Plan("triton", "single")  # the default: the Triton kernel
    monkeypatch.setattr(attention, "CUDA_TAPE_PATH", "flex")
    monkeypatch.setattr(attention, "flex_available", lambda: True)
    assert _plan() == Plan("flex", "single") and _plan(fuse=True) == Plan("flex", "single")
    assert _plan(fuse=False) == Plan("sdpa", "two_calls")  # asked for two calls: no one-QKᵀ path
    padded = causal_mask(6, torch.ones(2, 6, dtype=torch.bool), 6, torch.device("cpu"))
    assert _plan(mask=padded).backend == "sdpa"  # neither flex nor the kernel takes a padding mask
    assert _plan(dtype=torch.float16) == Plan("flex", "single")
    assert _plan(dtype=torch.float32) == Plan("triton", "single")  # compiled flex has no fp32 config


@pytest.mark.parametrize("flash", [False, True])
def test_cuda_auto_takes_sdpa_where_a_gpu_measured_it_fastest(monkeypatch, flash):
    """CUDA_TAPE_PATH may name an SDPA layout (the sweep's and the benchmark's winner): auto
    (tape_fused=null) follows it; tape_fused=true still asks for one QKᵀ, the kernel."""
    from tape.bench.sweep import TAPE_PATHS

    assert set(TAPE_PATHS.values()) == set(attention.CUDA_TAPE_PATHS) and attention.CUDA_TAPE_PATH in TAPE_PATHS.values()
    _fake(monkeypatch, flash=flash, triton=True)
    monkeypatch.setattr(attention, "CUDA_TAPE_PATH", "two_calls")
    assert _plan() == Plan("flash" if flash else "sdpa", "two_calls")
    assert _plan(fuse=True) == Plan("triton", "single")
    monkeypatch.setattr(attention, "CUDA_TAPE_PATH", "concat")
    assert _plan() == Plan("sdpa", "concat") and _plan(fuse="padded") == Plan("sdpa", "padded")
    assert _plan(hkv=2) == Plan("flash" if flash else "sdpa", "two_calls")  # GQA: SDPA wants V as wide as q/k
    _fake(monkeypatch, device="cpu", flash=flash, triton=True)
    assert _plan() == Plan("sdpa", "concat")  # the CPU keeps its own rule (6 keys: one call)


def test_flex_on_cuda_refuses_fp32_with_the_fix(monkeypatch):
    """torch 2.11's compiled FlexAttention found no fp32 launch config for [V | E] on an H200."""
    _fake(monkeypatch, triton=True)
    monkeypatch.setattr(attention, "flex_available", lambda: True)
    assert _plan("flex", dtype=torch.bfloat16) == Plan("flex", "single")
    with pytest.raises(RuntimeError, match="bf16/fp16 inputs on CUDA.*attn_backend='auto'"):
        _plan("flex", dtype=torch.float32)


@pytest.mark.skipif(not attention.flex_available(), reason="needs torch >= 2.5 (FlexAttention)")
def test_a_tape_model_on_the_flex_backend_equals_sdpa_without_grad_on_cpu():
    ids = torch.randint(0, 37, (2, 11), generator=torch.Generator().manual_seed(0))
    flex = tiny_model("tape", dtype=torch.float64, attn_backend="flex").eval()
    sdpa = tiny_model("tape", dtype=torch.float64, attn_backend="sdpa").eval()
    with torch.no_grad():
        torch.testing.assert_close(flex(ids).logits, sdpa(ids).logits, atol=1e-10, rtol=1e-10)
        assert torch.equal(flex.generate(ids[:, :4], max_new_tokens=5), sdpa.generate(ids[:, :4], max_new_tokens=5))


def _token_major_leaves(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(leaf, q view, k view): q (B, H, N, d) and k (B, Hkv, N, d) as the halves of one leaf laid
    out (B, N, H + Hkv, d), the non-contiguous views TAPE's joined rotation hands the attention."""
    heads = q.shape[1]
    leaf = torch.cat([q.transpose(1, 2), k.transpose(1, 2)], dim=2).detach().requires_grad_(True)
    return leaf, leaf[:, :, :heads].transpose(1, 2), leaf[:, :, heads:].transpose(1, 2)


@pytest.mark.cuda  # two shapes: each compiles its own kernels (tens of seconds on the GPU)
@pytest.mark.parametrize(("case", "dtype", "token_major"),
                         [(FLEX_CASES[1], torch.bfloat16, True), (FLEX_CASES[2], torch.float16, False)],
                         ids=["gqa-bf16-token-major", "nq-lt-nk-fp16"])
def test_flex_backend_matches_float64_forward_and_backward_on_cuda(case, dtype, token_major):
    """Compiled FlexAttention on a GPU, forward and every gradient, against float64 eager; q and
    k token-major views of one tensor (the model's layout) or contiguous."""
    q, k, v, e, _ = _inputs(nq=case["nq"] * 32, nk=case["nk"] * 32, hkv=case["hkv"], d=64, dtype=torch.float64)
    leaves = [t.cuda().requires_grad_(True) for t in (q, k, v, e)]
    low = [t.detach().to(dtype).requires_grad_(True) for t in leaves]
    inputs = list(low)
    if token_major:
        joined, inputs[0], inputs[1] = _token_major_leaves(low[0], low[1])
        assert not inputs[0].is_contiguous() and inputs[0].stride(-1) == 1
    out, out_e = attend(*inputs[:3], extra=inputs[3], backend="flex")
    ref, ref_e = attend(*leaves[:3], extra=leaves[3], backend="eager",
                        mask=causal_mask(q.shape[-2], None, k.shape[-2], leaves[0].device))
    g, g_e = torch.randn_like(ref), torch.randn_like(ref_e)
    (out.double() * g).sum().add((out_e.double() * g_e).sum()).backward()
    (ref * g).sum().add((ref_e * g_e).sum()).backward()
    grads = [t.grad for t in low]
    if token_major:
        heads = q.shape[1]
        grads[:2] = joined.grad[:, :, :heads].transpose(1, 2), joined.grad[:, :, heads:].transpose(1, 2)
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-2
    for got, want in zip((out, out_e, *grads), (ref, ref_e, *(t.grad for t in leaves))):
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_token_major_leaves_are_the_joined_rotations_layout():
    """The CUDA flex test's q and k views are laid out as RotateJoined's outputs."""
    from tape.model.rotation import RotateJoined, join

    q, k, _, _, _ = _inputs(hkv=4, dtype=torch.float32)
    rot = torch.randn(2, 4, q.shape[-2], q.shape[-1])
    q_rot, k_rot = RotateJoined.apply(join(q, k), rot, torch.float32, q.shape[1])
    _, q_view, k_view = _token_major_leaves(q, k)
    assert (q_view.stride(), k_view.stride()) == (q_rot.stride(), k_rot.stride())
    assert torch.equal(q_view, q) and torch.equal(k_view, k)


@pytest.mark.skipif(not attention.flex_available(), reason="needs torch >= 2.5 (FlexAttention)")
def test_compiled_flex_outlasts_dynamos_default_recompile_limit():
    """At dynamo's default of 8, a ninth (shape, grad mode) silently ran the unfused reference."""
    import torch._dynamo.config as dynamo_config

    from tape.model import flex

    flex._flex_fn.cache_clear()
    before = dynamo_config.recompile_limit
    # config.patch, not monkeypatch: monkeypatch's undo deletes a config module's key for good
    with dynamo_config.patch(recompile_limit=8):
        assert flex._flex_fn("cpu") is not None and dynamo_config.recompile_limit == 8  # nothing compiled on CPU
        flex._flex_fn("cuda")  # builds the compiled wrapper; compiles nothing until called
        assert dynamo_config.recompile_limit >= flex.FLEX_RECOMPILE_LIMIT >= 2 * 16  # 16 shapes, grad on and off
    flex._flex_fn.cache_clear()
    assert dynamo_config.recompile_limit == before  # restored: later compiles in this process still work


def test_under_torch_compile_auto_leaves_the_triton_kernel_for_traceable_paths(monkeypatch):
    """The compiler cannot trace our kernel's autograd Function: auto takes flex (bf16/fp16) or SDPA."""
    _fake(monkeypatch, triton=True)
    monkeypatch.setattr(attention, "flex_available", lambda: True)
    assert _plan() == Plan("triton", "single")  # eager
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _plan() == Plan("flex", "single") and _plan(dtype=torch.float16) == Plan("flex", "single")
    assert _plan(dtype=torch.float32).backend == "sdpa"  # compiled flex has no fp32 config on CUDA
    assert _plan(hkv=2, dtype=torch.float32) == Plan("sdpa", "two_calls")  # GQA
    monkeypatch.setattr(attention, "flex_available", lambda: False)
    assert _plan() == Plan("sdpa", "concat")
    assert _plan("triton") == Plan("triton", "single")  # forced: runs eagerly, a graph break


def test_a_forced_triton_call_is_a_graph_break_not_a_trace() -> None:
    assert getattr(attention._triton, "_torchdynamo_disable", False)
