"""The Triton [V | E] attention kernel against float64 autograd of the eager reference: outputs,
LSE and the gradients of q, k, v and E. On CPU tensors it runs under the Triton interpreter; on a
GPU the compiled kernel is tested instead (``-m cuda``) and the interpreter tests are skipped,
with the reason printed (as they are wherever the interpreter cannot run)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import triton_interpreter_problem

pytest.importorskip("triton")  # CI installs it from requirements.txt; this guards bare machines
from tape.kernels.triton_attention import (  # noqa: E402
    attention_backward,
    attention_forward,
    check_inputs,
    fused_attention,
)


def _interpreter_problem() -> str:
    """Why the interpreter tests cannot run here ("" when they can)."""
    if torch.cuda.is_available():
        return "a CUDA device is here: the compiled kernel is tested instead (-m cuda)"
    return triton_interpreter_problem()


INTERPRETER_PROBLEM = _interpreter_problem()
interpreted = pytest.mark.skipif(bool(INTERPRETER_PROBLEM), reason=INTERPRETER_PROBLEM)


def reference(q, k, v, e):
    """Eager causal attention (lower-right aligned), GQA by repetition: (A·V, A·E, LSE)."""
    groups = q.shape[1] // k.shape[1]
    k, v, e = (x.repeat_interleave(groups, dim=1) for x in (k, v, e))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Nq, Nk)
    nq, nk = scores.shape[-2:]
    hidden = torch.arange(nk)[None, :] > torch.arange(nk - nq, nk)[:, None]
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = scores.softmax(-1)
    return probs @ v, probs @ e, scores.logsumexp(-1)


def _inputs(b, h, hkv, nq, nk, d, dv, de, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, dv), (b, hkv, nk, de)]
    return [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]


def _compare(shape, dtype=torch.float32, tol=2e-5, block=16, only_e=False, seed=0, device="cpu"):
    """Max errors of the kernel (in ``dtype``, on ``device``) against float64 autograd on the
    CPU, relative to the scale."""
    exact = _inputs(*shape, seed=seed)
    exact = [x.to(dtype).double() for x in exact]  # the reference sees the same rounded inputs
    ours = [x.to(device=device, dtype=dtype).requires_grad_() for x in exact]
    ref = [x.clone().requires_grad_() for x in exact]
    o, oe = fused_attention(*ours, block=block)
    _, _, lse = attention_forward(*[x.detach() for x in ours], block=block)
    r_o, r_oe, r_lse = reference(*ref)
    gen = torch.Generator().manual_seed(seed + 1)
    g_o = torch.zeros_like(r_o) if only_e else torch.randn(r_o.shape, generator=gen, dtype=torch.float64)
    g_oe = torch.randn(r_oe.shape, generator=gen, dtype=torch.float64)
    ((o.double().cpu() * g_o).sum() + (oe.double().cpu() * g_oe).sum()).backward()
    ((r_o * g_o).sum() + (r_oe * g_oe).sum()).backward()
    assert o.dtype == oe.dtype == dtype and lse.dtype == torch.float32
    pairs = {"o": (o, r_o), "oe": (oe, r_oe), "lse": (lse, r_lse)}
    pairs.update({f"d{n}": (a.grad, r.grad) for n, a, r in zip("qkve", ours, ref)})
    for name, (got, want) in pairs.items():
        assert got.shape == want.shape, name
        err = (got.double().cpu() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.0e} at {shape}, {dtype}"
    return ref


# (B, H, Hkv, Nq, Nk, d, dv, de)
SHAPES = {
    "N not a multiple of the block": (1, 2, 2, 45, 45, 16, 16, 16),
    "N = 100, head dim 64": (1, 1, 1, 100, 100, 64, 64, 64),
    "GQA, E narrower than V": (2, 4, 2, 21, 21, 32, 32, 16),
    "decode: one query against a cache": (1, 4, 2, 1, 37, 16, 16, 16),
    "prefill after a cache (lower-right causal)": (1, 2, 1, 19, 50, 16, 16, 8),
    "odd head dims, E wider than V": (1, 3, 1, 17, 17, 24, 20, 40),
    "heads wider than 64 (dK/dV/dE in one masked loop)": (1, 2, 1, 33, 40, 72, 72, 72),
}


@interpreted
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fp32_matches_float64_autograd(shape):
    _compare(shape)


@interpreted
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_half_precision_inputs_accumulate_in_fp32(dtype, tol):
    _compare((1, 2, 1, 21, 30, 24, 24, 12), dtype=dtype, tol=tol)


@interpreted
def test_dq_dk_carry_the_e_path():
    """With a loss on A·E alone, dq and dk are the reference's (the official kernel returns 0)."""
    ref = _compare((1, 2, 2, 20, 20, 16, 16, 16), only_e=True)
    assert ref[0].grad.abs().max() > 1e-3 and ref[1].grad.abs().max() > 1e-3


# (Nq, Nk): query and key counts on both sides of 16-row block edges, keys offset by whole
# blocks, part blocks and none, so that each kernel runs blocks every row sees (no mask), blocks
# on the diagonal (masked) and tails of both.
BLOCK_EDGES = [(16, 16), (17, 17), (33, 33), (48, 48), (15, 31), (16, 32), (17, 50), (31, 47), (2, 49), (40, 41)]


@interpreted
@pytest.mark.parametrize("nq, nk", BLOCK_EDGES, ids=[f"{a}x{b}" for a, b in BLOCK_EDGES])
def test_masked_and_unmasked_blocks_split_where_causality_says(nq, nk):
    _compare((1, 2, 1, nq, nk, 16, 16, 8), block=16, seed=nq + nk)


@interpreted
@pytest.mark.parametrize("offset", range(16))
def test_every_key_offset_modulo_the_block_splits_right(offset: int) -> None:
    """Nk - Nq at each residue modulo BLOCK_N: ``full`` (forward and backward) must never hand the
    unmasked loop a key block that a block's first query row may not see."""
    _compare((1, 2, 1, 17, 17 + offset, 16, 16, 8), block=16, seed=offset)


@interpreted
@pytest.mark.parametrize("nq, nk", BLOCK_EDGES[1::3], ids=[f"{a}x{b}" for a, b in BLOCK_EDGES[1::3]])
def test_one_masked_loop_as_compiled_fp32_runs_it(nq, nk, monkeypatch):
    """Compiled fp32 does not split (``splits``): its one masked loop over every block, here under
    the interpreter."""
    import tape.kernels.triton_attention as ta

    monkeypatch.setattr(ta, "splits", lambda q: False)
    _compare((1, 2, 1, nq, nk, 16, 16, 8), block=16, seed=nq * nk)
    _compare((1, 2, 1, nq, nk, 72, 72, 72), block=16, seed=nq)  # a wide head: dK/dV/dE's one loop


@interpreted
@settings(max_examples=6, deadline=None)
@given(
    nq=st.integers(1, 24), extra_keys=st.integers(0, 9), groups=st.sampled_from([1, 2]),
    de=st.sampled_from([8, 16]), block=st.sampled_from([16, 32]), seed=st.integers(0, 99),
)
def test_random_shapes_match(nq, extra_keys, groups, de, block, seed):
    _compare((1, 2 * groups, 2, nq, nq + extra_keys, 16, 16, de), block=block, seed=seed)


@interpreted
def test_non_contiguous_layout_matches():
    """q, k, v in the (B, N, H, d) projection layout, viewed as (B, H, N, d): strides are honoured."""
    q, k, v, e = _inputs(1, 2, 2, 18, 18, 16, 16, 16)
    views = [x.float().transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, e)]
    assert not views[0].is_contiguous()
    o, oe, _ = attention_forward(*views, block=16)
    r_o, r_oe, _ = reference(q, k, v, e)
    torch.testing.assert_close(o.double(), r_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(oe.double(), r_oe, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad,message", [
    (dict(nq=9, nk=8), "lower-right causal"),
    (dict(d=160), "at most 128"),
    (dict(h=3), "not a multiple"),
])
def test_bad_input_is_refused(bad, message):
    shape = dict(b=1, h=2, hkv=2, nq=4, nk=8, d=16, dv=16, de=16) | bad
    with pytest.raises(ValueError, match=message):
        check_inputs(*[x.float() for x in _inputs(**shape)])


@interpreted
def test_gradients_of_sliced_and_expanded_inputs():
    """q, k, v sliced from one projection and an expanded E (as layer 0's table): the backward
    writes dense gradients, not through the inputs' strides (which crashed or raced before)."""
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(1, 2, 19, 3 * 8, generator=gen, dtype=torch.float64)
    base = torch.randn(1, 1, 19, 8, generator=gen, dtype=torch.float64)
    ours_qkv, ours_base = qkv.float().requires_grad_(), base.float().requires_grad_()
    ref_qkv, ref_base = qkv.clone().requires_grad_(), base.clone().requires_grad_()
    outs = []
    for full, b, attend in ((ours_qkv, ours_base, lambda *t: fused_attention(*t, block=16)),
                            (ref_qkv, ref_base, lambda *t: reference(*t)[:2])):
        q, k, v = full.split(8, dim=-1)  # (1, 2, 19, 8) views with stride 24 along N
        o, oe = attend(q, k, v, b.expand(1, 2, 19, 8))
        (o.double().square().sum() + oe.double().sum()).backward()
        outs.append((o, oe))
    torch.testing.assert_close(outs[0][0].double(), outs[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_qkv.grad.double(), ref_qkv.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours_base.grad.double(), ref_base.grad, atol=1e-4, rtol=1e-4)


def _wide_e_run(device: str, dtype: torch.dtype) -> None:
    """A float32 E beside half q, k, v (TAPE's layout): the same outputs and gradients as passing
    E cast to the half dtype, and E itself saved for backward, not a half copy of it."""
    gen = torch.Generator().manual_seed(5)
    shapes = [(1, 4, 21, 16), (1, 2, 21, 16), (1, 2, 21, 16), (1, 2, 21, 8)]  # GQA 4/2, de != dv
    q, k, v, e = (torch.randn(*s, generator=gen).to(device) for s in shapes)
    half = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    wide = e.clone().requires_grad_()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        o, oe = fused_attention(*half, wide, block=16)
    assert any(t.data_ptr() == wide.data_ptr() and t.dtype == torch.float32 for t in saved)
    assert not any(t.shape == e.shape and t.dtype == dtype for t in saved), "a half copy of E was saved"
    (o.float().square().sum() + oe.float().sum()).backward()
    cast = [x.detach().clone().requires_grad_() for x in (*half, e.to(dtype))]
    o2, oe2 = fused_attention(*cast, block=16)
    (o2.float().square().sum() + oe2.float().sum()).backward()
    assert oe.dtype == dtype and wide.grad.dtype == torch.float32
    torch.testing.assert_close(o, o2, rtol=0, atol=0)
    torch.testing.assert_close(oe, oe2, rtol=0, atol=0)
    for ours, theirs in zip(half, cast):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=0)
    # E's gradient: the same float32 sums, written without rounding them to the half dtype first
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(wide.grad.to(dtype), cast[3].grad, rtol=eps, atol=eps)
    exact = [x.detach().cpu().double().requires_grad_() for x in cast]  # the values the kernel multiplies
    ref_o, ref_oe, _ = reference(*exact)
    (ref_o.square().sum() + ref_oe.sum()).backward()
    l1 = [float((g.cpu().double() - exact[3].grad).abs().sum()) for g in (wide.grad, cast[3].grad)]
    assert 0 < l1[0] < l1[1], f"E's gradient error: written in float32 {l1[0]:.3g}, via {dtype} {l1[1]:.3g}"


@interpreted
def test_a_loop_bound_reads_as_an_index_under_the_interpreter(monkeypatch):
    """Triton 3.6's interpreter turned a loop bound into an int with ``int(array)``, which numpy
    >= 2.4 refuses for a one-element array: our launches squeeze it first (triton 3.9's fix), so
    the interpreter runs on the GPU image's stack (triton 3.6, numpy 2.5) too. Here the old
    ``__index__`` is put in place to show the shim replaces it."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def strict(tensor, scope):  # triton 3.6's __index__ under numpy >= 2.4
        original(tensor, scope)

        def index(self):
            data = self.handle.data
            if data.ndim:
                raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
            return int(data)

        scope.set_attr(tensor, "__index__", index)

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", strict)
    _compare((1, 2, 1, 9, 21, 16, 16, 8), block=16, seed=5)


@interpreted
def test_the_interpreter_leaves_triton_language_as_it_found_it():
    """Triton's library functions run interpreted patch triton.language and never undo it: every
    later compile in the process failed (a CPU test, then a GPU or sm_90 compile)."""
    import triton.language as tl
    from triton.runtime import interpreter

    owners = [tl, tl.core, tl.math, tl.core.tensor]
    before = [dict(vars(owner)) for owner in owners]
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    q, k, v, e = (x.requires_grad_() for x in _inputs(1, 2, 1, 20, 20, 16, 16, 16, seed=3))
    o, oe = fused_attention(q.float(), k.float(), v.float(), e.float())
    (o.sum() + oe.sum()).backward()
    assert getattr(interpreter, "_patch_lang_tensor", None) is patch_tensor  # our shim is undone too
    for owner, attrs in zip(owners, before):
        changed = sorted(n for n in set(attrs) | set(vars(owner)) if vars(owner).get(n) is not attrs.get(n))
        assert not changed, f"{owner.__name__}: {changed[:5]}"


@interpreted
def test_a_float32_e_beside_bf16_inputs_is_saved_not_copied():
    _wide_e_run("cpu", torch.bfloat16)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backward_delta_kernel_is_both_paths_row_sums(dtype):
    """Δ = rowsum(dO ∘ O) + rowsum(dO_e ∘ O_e) in float32, rows past a block's end masked."""
    import tape.kernels.triton_attention as kernels

    gen = torch.Generator().manual_seed(3)
    o, do = (torch.randn(2, 3, 37, 16, generator=gen).to(dtype) for _ in range(2))
    oe, doe = (torch.randn(2, 3, 37, 8, generator=gen).to(dtype) for _ in range(2))
    delta = torch.full((2, 3, 37), float("nan"))
    kernels._run(kernels._bwd_delta, (3, 6), True, o, oe, do, doe, delta,
                 *(s for t in (o, oe, do, doe) for s in t.stride()[:3]), 3, 37, 16, 8,
                 BLOCK_M=kernels.DELTA_ROWS, BLOCK_DV=16, BLOCK_DE=16)
    expected = (do.double() * o.double()).sum(-1) + (doe.double() * oe.double()).sum(-1)
    torch.testing.assert_close(delta.double(), expected, rtol=1e-6, atol=1e-5)


def test_only_dense_layouts_count_as_dense():
    from tape.kernels.triton_attention import _dense

    x = torch.zeros(2, 5, 3, 4)
    assert _dense(x) and _dense(x.transpose(1, 2)) and _dense(x[:1]) and _dense(x[:1, :1])
    for sliced in (x[:, :1], x[:, 1:], x[..., :2], x[:1].expand(2, 5, 3, 4)):
        assert not _dense(sliced), sliced.stride()


def test_host_side_block_arithmetic_equals_tritons():
    import triton

    from tape.kernels.triton_attention import _cdiv, _next_pow2

    for n in range(1, 5000):
        assert _next_pow2(n) == triton.next_power_of_2(n), n
        for block in (16, 32, 64, 128):
            assert _cdiv(n, block) == triton.cdiv(n, block), (n, block)


@interpreted
def test_the_backward_writes_gradients_in_their_inputs_layout():
    """A transposed projection's v (dense, not contiguous) gets dV in its own layout, no copy on
    the way in or out; an expanded e (layer 0's E) is copied and gets a dense dE. Same numbers."""
    q, k, v, e = (x.float() for x in _inputs(1, 4, 2, 21, 21, 16, 16, 8))
    v_t = v.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Hkv, N, d) over a (B, N, Hkv, d) buffer
    e_x = e[:, :1].expand_as(e)
    o, oe, lse = attention_forward(q, k, v_t, e_x, block=16)
    do, doe = torch.randn_like(o), torch.randn_like(oe)
    ours = attention_backward(q, k, v_t, e_x, o, oe, lse, do, doe, block=16)
    dense = attention_backward(q, k, v_t.contiguous(), e_x.contiguous(), o, oe, lse, do, doe, block=16)
    assert ours[2].stride() == v_t.stride() and ours[3].is_contiguous()
    for got, want in zip(ours, dense):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@interpreted
def test_the_outputs_are_token_major():
    """A·V and A·E come out laid out (B, Nq, H, ·) in memory, as SDPA's for token-major q: the
    output projection reads A·V's heads as a view of the same memory."""
    q, k, v, e = (x.float() for x in _inputs(2, 4, 2, 9, 9, 16, 16, 8))
    o, oe, _ = attention_forward(q, k, v, e)
    b, h, n, _ = o.shape
    for out in (o, oe):
        assert out.transpose(1, 2).is_contiguous()
    assert o.transpose(1, 2).reshape(b, n, -1).data_ptr() == o.data_ptr()


def test_a_wider_e_is_refused_by_the_plain_kernel_and_a_narrower_by_both():
    q, k, v, e = (x.to(torch.bfloat16) for x in _inputs(1, 2, 2, 4, 8, 16, 16, 16))
    check_inputs(q, k, v, e.float(), wide_e=True)
    with pytest.raises(ValueError, match="dtypes"):
        check_inputs(q, k, v, e.float())
    with pytest.raises(ValueError, match="e may be float32"):
        check_inputs(q.float(), k.float(), v.float(), e, wide_e=True)


# ---------------------------------------------------------------------------- compiled, on a GPU
CUDA_SHAPES = {
    "tails, head dim 64": (2, 4, 4, 100, 100, 64, 64, 64),
    "GQA 8/2, head dim 128": (1, 8, 2, 77, 77, 128, 128, 128),
    "prefill after a cache": (1, 4, 2, 40, 129, 64, 64, 64),
    "decode: one query": (2, 8, 2, 1, 300, 128, 128, 128),
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("shape", list(CUDA_SHAPES.values()), ids=list(CUDA_SHAPES))
def test_compiled_kernel_matches_float64_autograd(shape, dtype, tol):
    _compare(shape, dtype=dtype, tol=tol, block=None, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_kernel_saves_a_float32_e_not_a_copy(dtype):
    _wide_e_run("cuda", dtype)


# ---------------------------------------------------------------------------- GPU decisions, faked
def test_fp32_wide_heads_start_at_a_block_that_fits_a_gpu():
    from tape.kernels.triton_attention import default_block

    assert default_block("cuda", torch.float32, 128) == 32  # 246-312 KB at 64 > 227 KB on an H100
    assert default_block("cuda", torch.float32, 64) == 64
    assert default_block("cuda", torch.bfloat16, 128) == default_block("cuda", torch.float16, 128) == 64
    assert default_block("cpu", torch.float32, 128) == 16  # the interpreter


def test_the_backward_of_a_decode_step_uses_full_query_blocks(monkeypatch):
    """Compiled for an H100, dK of a one-query fp16/bf16 step was wrong with BLOCK_M 16 < BLOCK_N
    64 (relative error 0.22); the forward keeps its short query block, the backward does not."""
    import tape.kernels.triton_attention as kernels

    metas: dict[str, dict] = {}
    monkeypatch.setattr(kernels, "_launch", lambda fn, *args, by="BLOCK_M", **meta: metas.update({fn.__name__: meta}))
    q, k, v, e = [x.to(torch.bfloat16) for x in _inputs(1, 2, 1, 1, 300, 128, 128, 128)]
    kernels.attention_forward(q, k, v, e, block=64)
    assert (metas["_fwd"]["BLOCK_M"], metas["_fwd"]["BLOCK_N"]) == (16, 64)
    o, oe = q.new_zeros(1, 2, 1, 128), q.new_zeros(1, 2, 1, 128)
    kernels.attention_backward(q, k, v, e, o, oe, torch.zeros(1, 2, 1), o, oe, block=64)
    for name in ("_bwd_dkdvde", "_bwd_dq"):
        assert metas[name]["BLOCK_M"] == metas[name]["BLOCK_N"] == 64, name


def test_a_launch_out_of_shared_memory_retries_with_half_the_block(monkeypatch):
    """Compiled launches (faked: no GPU here) that need more shared memory than the device has
    are retried at half the block, and the block that fitted is used first next time."""
    from triton.runtime.errors import OutOfResources

    import tape.kernels.triton_attention as kernels

    tried: list[tuple[int, tuple[int, int]]] = []

    class Fake:
        def __getitem__(self, grid):
            def run(*args, **meta):
                tried.append((meta["BLOCK_M"], grid))
                if meta["BLOCK_M"] > limit:
                    raise OutOfResources(246016, 232448, "shared memory")
            return run

    monkeypatch.setattr(kernels, "_kernel", lambda fn, interpret: Fake())
    monkeypatch.setattr(kernels, "_FITTING", {})
    meta = dict(PREC="ieee", UPCAST=False, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128, BLOCK_DE=128)
    x = torch.zeros(1)
    limit = 32
    kernels._launch(kernels._fwd, 100, 4, False, x, **meta)
    assert tried == [(64, (2, 4)), (32, (4, 4))]
    tried.clear()
    kernels._launch(kernels._fwd, 100, 4, False, x, **meta)
    assert tried == [(32, (4, 4))]  # remembered: no second failed launch
    limit = 8  # not even the smallest block fits: the error surfaces
    monkeypatch.setattr(kernels, "_FITTING", {})
    with pytest.raises(OutOfResources):
        kernels._launch(kernels._fwd, 100, 4, False, x, **meta)
    assert [b for b, _ in tried[-3:]] == [64, 32, 16]


def test_a_decode_step_takes_a_short_query_block():
    from tape.kernels.triton_attention import _meta

    q, k, v, e = (x.float() for x in _inputs(1, 4, 2, 1, 300, 64, 64, 64))
    meta = _meta(q, k, v, e, block=64)
    assert (meta["BLOCK_M"], meta["BLOCK_N"]) == (16, 64)  # 16 query rows, not 64, for one query
    q_long = torch.zeros(1, 4, 200, 64)
    assert _meta(q_long, k, v, e, block=64)["BLOCK_M"] == 64


@interpreted
@pytest.mark.parametrize("shape", [(1, 4, 2, 1, 70, 16, 16, 16), (1, 2, 1, 5, 40, 16, 16, 8)],
                         ids=["decode", "short prefill"])
def test_query_blocks_shorter_than_key_blocks_match(shape):
    _compare(shape, block=32)  # BLOCK_M 16, BLOCK_N 32


# ---------------------------------------------------------------------------- measured launch configs
class _RecordingKernel:
    """Stands in for a compiled kernel (no GPU here): records each launch's grid and keywords,
    and runs out of shared memory above ``limit``."""

    def __init__(self, limit: int = 1024) -> None:
        self.launches: list[tuple[tuple[int, int], dict]] = []
        self.limit = limit

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.launches.append((grid, meta))
            if meta["BLOCK_N"] > self.limit:
                from triton.runtime.errors import OutOfResources
                raise OutOfResources(246016, 232448, "shared memory")
        return run


@pytest.fixture
def recorded(monkeypatch):
    import tape.kernels.triton_attention as kernels
    from tape.kernels import tuning

    fake = _RecordingKernel()
    monkeypatch.setattr(kernels, "_kernel", lambda fn, interpret: fake)
    monkeypatch.setattr(kernels, "_FITTING", {})
    monkeypatch.setattr(tuning, "TUNED", {("_fwd", "float32", 128): tuning.LaunchConfig(128, 32, 8, 2),
                                          ("_bwd_dq", "float32", 128): tuning.LaunchConfig(64, 32, 4, 2)})
    return kernels, tuning, fake


META = dict(PREC="ieee", UPCAST=False, BLOCK_M=32, BLOCK_N=32, BLOCK_D=128, BLOCK_DV=128, BLOCK_DE=128)


def test_a_tuned_launch_takes_the_measured_config(recorded):
    kernels, _, fake = recorded
    kernels._launch(kernels._fwd, 100, 4, False, torch.zeros(1), tuned=True, **META)
    grid, meta = fake.launches[-1]
    assert (meta["BLOCK_M"], meta["BLOCK_N"], meta["num_warps"], meta["num_stages"]) == (128, 32, 8, 2)
    assert grid == (1, 4)
    kernels._launch(kernels._fwd, 3, 4, False, torch.zeros(1), tuned=True, **META)  # decode: short query block
    assert fake.launches[-1][1]["BLOCK_M"] == 16
    kernels._launch(kernels._bwd_dq, 100, 4, False, torch.zeros(1), tuned=True, **META)
    assert (fake.launches[-1][1]["BLOCK_M"], fake.launches[-1][1]["BLOCK_N"]) == (32, 32)  # backward: M = N


def test_an_explicit_block_or_another_dtype_ignores_the_table(recorded):
    kernels, _, fake = recorded
    kernels._launch(kernels._fwd, 100, 4, False, torch.zeros(1), tuned=False, **META)
    kernels._launch(kernels._fwd, 100, 4, False, torch.zeros(1, dtype=torch.bfloat16), tuned=True, **META)
    for _, meta in fake.launches:
        assert (meta["BLOCK_M"], meta["BLOCK_N"]) == (32, 32) and "num_warps" not in meta


def test_a_scale_that_is_not_positive_is_refused():
    q, k, v, e = (x.float() for x in _inputs(1, 1, 1, 4, 4, 16, 16, 16))
    for bad in (0.0, -0.125, float("nan")):
        with pytest.raises(ValueError, match="positive scale"):
            attention_forward(q, k, v, e, scale=bad)


def test_fp16_takes_bf16s_measured_config_and_fp32_its_spill_free_one(monkeypatch):
    from tape.kernels import tuning

    monkeypatch.setattr(tuning, "TUNED", {("_bwd_dkdvde", "bfloat16", 128): tuning.LaunchConfig(64, 64, 8, 2)})
    assert tuning.config("_bwd_dkdvde", torch.float16, 128) == tuning.LaunchConfig(64, 64, 8, 2)
    assert tuning.config("_bwd_dkdvde", torch.float32, 128) == tuning.SPILL_FREE["_bwd_dkdvde", "float32", 128]
    assert tuning.config("_bwd_dkdvde", torch.float16, 64) is None
    monkeypatch.setattr(tuning, "TUNED", {("_bwd_dkdvde", "float32", 128): tuning.LaunchConfig(16, 16, 4, 3)})
    assert tuning.config("_bwd_dkdvde", torch.float32, 128) == tuning.LaunchConfig(16, 16, 4, 3)  # measured first


def test_a_forced_config_runs_as_given_without_fallback(recorded):
    kernels, tuning, fake = recorded
    from triton.runtime.errors import OutOfResources

    fake.limit = 32
    with tuning.forcing("_fwd", tuning.LaunchConfig(64, 64, 4, 3)), pytest.raises(OutOfResources):
        kernels._launch(kernels._fwd, 100, 4, False, torch.zeros(1), **META)
    assert len(fake.launches) == 1 and tuning.forced("_fwd") is None


def test_the_sweep_reports_every_kernel_at_a_tiny_shape():
    """The GPU sweep's code on the interpreter (where forcing has no effect: nothing is compiled)."""
    if INTERPRETER_PROBLEM:
        pytest.skip(INTERPRETER_PROBLEM)
    from tape.kernels import autotune, tuning

    one = (tuning.LaunchConfig(16, 16),)
    out = autotune.sweep(torch.float32, 16, batch=1, heads=1, n=16, device="cpu", forward=one, backward=one)
    assert set(out) == {"_fwd/float32/16", "_bwd_dkdvde/float32/16", "_bwd_dq/float32/16"}
    for row in out.values():
        assert row["best"] == {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 3}
        assert row["best_ms"] > 0 and row["default_ms"] > 0 and row["current_ms"] > 0
    with pytest.raises(SystemExit):  # interpreter times say nothing about launch configurations
        autotune.main(["--device", "cpu"])


def test_untuned_launches_ignore_the_tuned_configs():
    """The sweep's "default" was the TUNED entry once TUNED was filled: it compared the best
    with itself, not with the kernels' own defaults."""
    from tape.kernels import tuning

    assert tuning.config("_bwd_dkdvde", torch.bfloat16, 128) == tuning.LaunchConfig(64, 64, 8, 2)
    with tuning.untuned():
        assert tuning.config("_bwd_dkdvde", torch.bfloat16, 128) is None
        assert tuning.config("_bwd_dkdvde", torch.float32, 16) is None  # nor the spill-free ones
    assert tuning.config("_bwd_dkdvde", torch.bfloat16, 128) == tuning.LaunchConfig(64, 64, 8, 2)
