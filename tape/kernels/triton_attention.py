"""Fused causal attention for [V | E] in Triton: one QKᵀ, one online softmax, two accumulators.

Forward (per query block): S = q kᵀ · scale over the visible key blocks, a running max m and sum
l shared by both value tensors, acc_v += P·V and acc_e += P·E with the same rescaling, then
O = acc_v / l, O_e = acc_e / l and LSE = m + log(l) (natural log, float32).
Backward recomputes P = exp(S - LSE) and sums both paths in dS = P ∘ (dO·Vᵀ + dO_e·Eᵀ - Δ),
Δ = rowsum(dO ∘ O) + rowsum(dO_e ∘ O_e), so dq and dk carry the gradient of the A·E path
(the official kernel drops it, tape-spec C.1). dk, dV and dE are summed over each key/value
head's query group inside one program (no atomics), so grouped-query attention is exact.

Causal masking is lower-right aligned (query i sees keys j <= i + Nk - Nq, as for a KV cache);
blocks every row of a tile sees run without the mask (dK/dV/dE: at head dims up to 64).
Softmax runs in base 2 (exp2 of S · scale · log2(e)); LSE is stored as a natural log.
Inputs may be float32, float16 or bfloat16 (products accumulate in float32); head dims up to 128
and any lengths (tails are masked). CUDA tensors run compiled; CPU tensors run under the Triton
interpreter (slow: for tests and for proving the kernel on machines without a GPU).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from tape.kernels import tuning

MAX_HEAD_DIM = 128
MIN_BLOCK = 16
# Compiled for sm_90 with triton 3.6, fp32 tiles of head dim 128 need 246-312 KB of shared memory
# at BLOCK 64 (an H100 allows 227 KB) and 118-152 KB at BLOCK 32; bf16/fp16 fit at 64.
FP32_WIDE = 64  # fp32 with a head dim above this starts at BLOCK 32 on a GPU
DELTA_ROWS = 16  # query rows per program of the backward's Δ kernel
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E): the kernels exponentiate in base 2
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _mm(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in float32. UPCAST (interpreter only): multiply bfloat16 tiles as exact
    float32 copies, since the interpreter's dot cannot take bfloat16; compiled kernels never set it."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _load(base, rows, stride, n_rows, width, BLOCK_W: tl.constexpr):
    """Tile (rows, BLOCK_W) of a row-major (n_rows, width) matrix; masked entries are 0."""
    cols = tl.arange(0, BLOCK_W)
    return tl.load(base + rows[:, None] * stride + cols[None, :],
                   mask=(rows[:, None] < n_rows) & (cols[None, :] < width), other=0.0)


@triton.jit
def _store(base, rows, stride, n_rows, width, value, BLOCK_W: tl.constexpr):
    """Write ``value`` (rows, BLOCK_W) into a row-major (n_rows, width) matrix, masked."""
    cols = tl.arange(0, BLOCK_W)
    tl.store(base + rows[:, None] * stride + cols[None, :], value.to(base.dtype.element_ty),
             mask=(rows[:, None] < n_rows) & (cols[None, :] < width))


@triton.jit
def _visible(rows, cols, NQ, NK):
    """(M, N) lower-right causal mask of query rows by key cols; keys from NK on are hidden."""
    return (cols[None, :] < NK) & (cols[None, :] <= rows[:, None] + NK - NQ)


@triton.jit
def _key_blocks(pid_m, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key range of query block pid_m: every one of its rows sees the keys before ``full`` (a
    multiple of BLOCK_N), none sees a key from ``end`` on."""
    end = tl.minimum(NK, (pid_m + 1) * BLOCK_M + NK - NQ)
    full = tl.minimum(pid_m * BLOCK_M + NK - NQ + 1, NK) // BLOCK_N * BLOCK_N
    return full, end


@triton.jit
def _fwd_keys(acc_v, acc_e, l_i, m_i, q, K, V, E, sk_n, sv_n, se_n, rows, start, end, NQ, NK, D, DV, DE, qk_scale,
              MASKED: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr):
    """The online softmax of one query block over key blocks [start, end), in base 2 (m_i is
    the running max of S · scale · log2(e), qk_scale = scale · log2(e)); MASKED applies the
    causal and length masks, which key blocks every row sees need not pay for."""
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load(K, cols, sk_n, NK, D, BLOCK_D)  # (N, D)
        v = _load(V, cols, sv_n, NK, DV, BLOCK_DV)  # (N, DV)
        e = _load(E, cols, se_n, NK, DE, BLOCK_DE)  # (N, DE)
        s = _mm(q, tl.trans(k), PREC, UPCAST)  # (M, N) float32, unscaled
        if MASKED:
            s = tl.where(_visible(rows, cols, NQ, NK), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # finite: key 0 (first block) is visible to every row
        p = tl.exp2(s * qk_scale - m_new[:, None])  # one fused multiply-add and exp2 an element
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc_v = acc_v * alpha[:, None] + _mm(p.to(v.dtype), v, PREC, UPCAST)
        acc_e = acc_e * alpha[:, None] + _mm(p.to(e.dtype), e, PREC, UPCAST)
        m_i = m_new
    return acc_v, acc_e, l_i, m_i


def _fwd(
    Q, K, V, E, O, OE, LSE,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, se_b, se_h, se_n,
    so_b, so_h, so_n, soe_b, soe_h, soe_n,
    H, GROUPS, NQ, NK, D, DV, DE, scale,
    PREC: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr,
):
    """One query block of one query head: O, O_e and LSE."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // H, pid_bh % H
    hk = h // GROUPS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load(Q + b * sq_b + h * sq_h, rows, sq_n, NQ, D, BLOCK_D)  # (M, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_v = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    acc_e = tl.zeros([BLOCK_M, BLOCK_DE], tl.float32)
    k_ptr, v_ptr, e_ptr = K + b * sk_b + hk * sk_h, V + b * sv_b + hk * sv_h, E + b * se_b + hk * se_h
    full, end = _key_blocks(pid_m, NQ, NK, BLOCK_M, BLOCK_N)
    start = 0  # without SPLIT one masked loop takes every block
    if SPLIT:
        acc_v, acc_e, l_i, m_i = _fwd_keys(acc_v, acc_e, l_i, m_i, q, k_ptr, v_ptr, e_ptr, sk_n, sv_n, se_n, rows,
                                           0, full, NQ, NK, D, DV, DE, scale * LOG2E,
                                           False, PREC, UPCAST, BLOCK_N, BLOCK_D, BLOCK_DV, BLOCK_DE)
        start = full
    acc_v, acc_e, l_i, m_i = _fwd_keys(acc_v, acc_e, l_i, m_i, q, k_ptr, v_ptr, e_ptr, sk_n, sv_n, se_n, rows,
                                       start, end, NQ, NK, D, DV, DE, scale * LOG2E,
                                       True, PREC, UPCAST, BLOCK_N, BLOCK_D, BLOCK_DV, BLOCK_DE)
    _store(O + b * so_b + h * so_h, rows, so_n, NQ, DV, acc_v / l_i[:, None], BLOCK_DV)
    _store(OE + b * soe_b + h * soe_h, rows, soe_n, NQ, DE, acc_e / l_i[:, None], BLOCK_DE)
    tl.store(LSE + pid_bh * NQ + rows, (m_i + tl.log2(l_i)) * LN2, mask=rows < NQ)  # natural log


@triton.jit
def _dkdvde_queries(dk, dv, de, k, v, e, Q, DO, DOE, LSE, DELTA, sq_n, sdo_n, sdoe_n, cols, start, end,
                    NQ, NK, D, DV, DE, qk_scale, MASKED: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr):
    """dK / scale, dV, dE of one key block summed over query blocks [start, end) of one query head.

    Transposed tiles, keys by queries (N, M): k, v and e are the left operands of every product
    (loaded once), q, dO and dO_e enter as right operands read in place, and Pᵀ, dSᵀ come out of
    the products in the orientation dK, dV and dE need (no transposes of P or dS). MASKED as in
    ``_fwd_keys``; unmasked, rows past NQ add nothing (their q, dO, dO_e, LSE and Δ load as 0).
    """
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = _load(Q, rows, sq_n, NQ, D, BLOCK_D)  # (M, D)
        do = _load(DO, rows, sdo_n, NQ, DV, BLOCK_DV)  # (M, DV)
        doe = _load(DOE, rows, sdoe_n, NQ, DE, BLOCK_DE)  # (M, DE)
        lse2 = tl.load(LSE + rows, mask=rows < NQ, other=0.0) * LOG2E
        delta = tl.load(DELTA + rows, mask=rows < NQ, other=0.0)
        p_t = tl.exp2(_mm(k, tl.trans(q), PREC, UPCAST) * qk_scale - lse2[None, :])  # Pᵀ (N, M) float32
        if MASKED:
            visible = (rows[None, :] < NQ) & (cols[:, None] < NK) & (cols[:, None] <= rows[None, :] + NK - NQ)
            p_t = tl.where(visible, p_t, 0.0)
        dv += _mm(p_t.to(do.dtype), do, PREC, UPCAST)
        de += _mm(p_t.to(doe.dtype), doe, PREC, UPCAST)
        dp_t = _mm(v, tl.trans(do), PREC, UPCAST) + _mm(e, tl.trans(doe), PREC, UPCAST)  # dPᵀ
        ds_t = p_t * (dp_t - delta[None, :])  # (N, M): both value paths
        dk += _mm(ds_t.to(q.dtype), q, PREC, UPCAST)
    return dk, dv, de


def _bwd_dkdvde(
    Q, K, V, E, DO, DOE, LSE, DELTA, DK, DV_, DE_,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, se_b, se_h, se_n,
    sdo_b, sdo_h, sdo_n, sdoe_b, sdoe_h, sdoe_n,
    H, HKV, GROUPS, NQ, NK, D, DV, DE, scale,
    PREC: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr,
):
    """One key block of one key/value head: dK, dV, dE summed over its query heads and blocks."""
    pid_n, pid_bk = tl.program_id(0), tl.program_id(1)
    b, hk = pid_bk // HKV, pid_bk % HKV
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = _load(K + b * sk_b + hk * sk_h, cols, sk_n, NK, D, BLOCK_D)  # (N, D)
    v = _load(V + b * sv_b + hk * sv_h, cols, sv_n, NK, DV, BLOCK_DV)  # (N, DV)
    e = _load(E + b * se_b + hk * se_h, cols, se_n, NK, DE, BLOCK_DE)  # (N, DE)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    de = tl.zeros([BLOCK_N, BLOCK_DE], tl.float32)
    # The first query that sees key j is j - (NK - NQ): start at its block. Rows from ``full`` on
    # (the first block whose rows all reach the key block's last key) need no mask; with heads
    # wider than 64, one masked loop takes them all (split, it spilled registers inside its loops
    # at head dim 128, sm_90, triton 3.6), as without SPLIT.
    lo = tl.maximum(pid_n * BLOCK_N - (NK - NQ), 0) // BLOCK_M * BLOCK_M
    past = tl.maximum(pid_n * BLOCK_N + BLOCK_N - 1 - (NK - NQ) - lo, 0)
    full = tl.minimum(lo + (past + BLOCK_M - 1) // BLOCK_M * BLOCK_M, NQ)
    SPLIT_ROWS: tl.constexpr = SPLIT and BLOCK_D <= 64 and BLOCK_DV <= 64 and BLOCK_DE <= 64
    if not SPLIT_ROWS:
        full = NQ
    qk_scale = scale * LOG2E  # Pᵀ = exp2(Sᵀ · scale · log2(e) - LSE · log2(e))
    for g in range(0, GROUPS):
        h = hk * GROUPS + g
        q_ptr, do_ptr, doe_ptr = Q + b * sq_b + h * sq_h, DO + b * sdo_b + h * sdo_h, DOE + b * sdoe_b + h * sdoe_h
        stats = (b * H + h) * NQ
        dk, dv, de = _dkdvde_queries(dk, dv, de, k, v, e, q_ptr, do_ptr, doe_ptr, LSE + stats, DELTA + stats,
                                     sq_n, sdo_n, sdoe_n, cols, lo, full, NQ, NK, D, DV, DE, qk_scale,
                                     True, PREC, UPCAST, BLOCK_M, BLOCK_D, BLOCK_DV, BLOCK_DE)
        if SPLIT_ROWS:
            dk, dv, de = _dkdvde_queries(dk, dv, de, k, v, e, q_ptr, do_ptr, doe_ptr, LSE + stats, DELTA + stats,
                                         sq_n, sdo_n, sdoe_n, cols, full, NQ, NQ, NK, D, DV, DE, qk_scale,
                                         False, PREC, UPCAST, BLOCK_M, BLOCK_D, BLOCK_DV, BLOCK_DE)
    _store(DK + b * sk_b + hk * sk_h, cols, sk_n, NK, D, dk * scale, BLOCK_D)
    _store(DV_ + b * sv_b + hk * sv_h, cols, sv_n, NK, DV, dv, BLOCK_DV)
    _store(DE_ + b * se_b + hk * se_h, cols, se_n, NK, DE, de, BLOCK_DE)


@triton.jit
def _dq_keys(dq, q, do, doe, lse2, delta, K, V, E, sk_n, sv_n, se_n, rows, start, end, NQ, NK, D, DV, DE, qk_scale,
             MASKED: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr):
    """dQ / scale of one query block over key blocks [start, end), with LSE and the scale in
    base 2 as in ``_fwd_keys``; MASKED as there. Unmasked, rows past NQ add only to rows of dQ
    that are never stored."""
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load(K, cols, sk_n, NK, D, BLOCK_D)  # (N, D)
        v = _load(V, cols, sv_n, NK, DV, BLOCK_DV)
        e = _load(E, cols, se_n, NK, DE, BLOCK_DE)
        p = tl.exp2(_mm(q, tl.trans(k), PREC, UPCAST) * qk_scale - lse2[:, None])  # (M, N) float32
        if MASKED:
            p = tl.where(_visible(rows, cols, NQ, NK) & (rows[:, None] < NQ), p, 0.0)
        dp = _mm(do, tl.trans(v), PREC, UPCAST) + _mm(doe, tl.trans(e), PREC, UPCAST)
        ds = p * (dp - delta[:, None])
        dq += _mm(ds.to(k.dtype), k, PREC, UPCAST)
    return dq


def _bwd_dq(
    Q, K, V, E, DO, DOE, LSE, DELTA, DQ,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, se_b, se_h, se_n,
    sdo_b, sdo_h, sdo_n, sdoe_b, sdoe_h, sdoe_n,
    H, GROUPS, NQ, NK, D, DV, DE, scale,
    PREC: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr,
):
    """One query block of one query head: dQ over its visible key blocks."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // H, pid_bh % H
    hk = h // GROUPS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load(Q + b * sq_b + h * sq_h, rows, sq_n, NQ, D, BLOCK_D)
    do = _load(DO + b * sdo_b + h * sdo_h, rows, sdo_n, NQ, DV, BLOCK_DV)
    doe = _load(DOE + b * sdoe_b + h * sdoe_h, rows, sdoe_n, NQ, DE, BLOCK_DE)
    lse2 = tl.load(LSE + pid_bh * NQ + rows, mask=rows < NQ, other=0.0) * LOG2E
    delta = tl.load(DELTA + pid_bh * NQ + rows, mask=rows < NQ, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_ptr, v_ptr, e_ptr = K + b * sk_b + hk * sk_h, V + b * sv_b + hk * sv_h, E + b * se_b + hk * se_h
    full, end = _key_blocks(pid_m, NQ, NK, BLOCK_M, BLOCK_N)
    start = 0  # without SPLIT one masked loop takes every block
    if SPLIT:
        dq = _dq_keys(dq, q, do, doe, lse2, delta, k_ptr, v_ptr, e_ptr, sk_n, sv_n, se_n, rows, 0, full,
                      NQ, NK, D, DV, DE, scale * LOG2E, False, PREC, UPCAST, BLOCK_N, BLOCK_D, BLOCK_DV, BLOCK_DE)
        start = full
    dq = _dq_keys(dq, q, do, doe, lse2, delta, k_ptr, v_ptr, e_ptr, sk_n, sv_n, se_n, rows, start, end,
                  NQ, NK, D, DV, DE, scale * LOG2E, True, PREC, UPCAST, BLOCK_N, BLOCK_D, BLOCK_DV, BLOCK_DE)
    _store(DQ + b * sq_b + h * sq_h, rows, sq_n, NQ, D, dq * scale, BLOCK_D)


def _bwd_delta(
    O, OE, DO, DOE, DELTA,
    so_b, so_h, so_n, soe_b, soe_h, soe_n, sdo_b, sdo_h, sdo_n, sdoe_b, sdoe_h, sdoe_n,
    H, NQ, DV, DE,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DE: tl.constexpr,
):
    """One query block of one query head: Δ = rowsum(dO ∘ O) + rowsum(dO_e ∘ O_e) in float32."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // H, pid_bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o = _load(O + b * so_b + h * so_h, rows, so_n, NQ, DV, BLOCK_DV).to(tl.float32)
    do = _load(DO + b * sdo_b + h * sdo_h, rows, sdo_n, NQ, DV, BLOCK_DV).to(tl.float32)
    oe = _load(OE + b * soe_b + h * soe_h, rows, soe_n, NQ, DE, BLOCK_DE).to(tl.float32)
    doe = _load(DOE + b * sdoe_b + h * sdoe_h, rows, sdoe_n, NQ, DE, BLOCK_DE).to(tl.float32)
    tl.store(DELTA + pid_bh * NQ + rows, tl.sum(o * do, 1) + tl.sum(oe * doe, 1), mask=rows < NQ)


_CACHE: dict[tuple[str, bool], object] = {}


def _kernel(fn, interpret: bool):
    """``fn`` compiled by Triton (CUDA) or wrapped for the Triton interpreter (CPU tensors)."""
    key = (fn.__name__, interpret)
    if key not in _CACHE:
        _CACHE[key] = InterpretedFunction(fn) if interpret else triton.jit(fn)
    return _CACHE[key]


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    """Let Triton's own library functions (tl.zeros, tl.max, ...) run inside an interpreted kernel.

    With TRITON_INTERPRET=1 set before triton is imported they are interpreted functions already;
    otherwise (triton imported earlier, e.g. by Lightning) they are compiled-only JITFunctions, so
    for the duration of the launch a call to one runs its Python body as the interpreter does.
    Such a call patches ``triton.language`` for the interpreter and never undoes it, which broke
    every later compile in the process; the patched modules and classes are put back here.
    """
    original = JITFunction.__call__
    saved = [(owner, dict(vars(owner))) for owner in _language_owners()]
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)

    def call(self, *args, **kwargs):
        return _kernel(self.fn, True)(*args, **kwargs)

    def patch_tensor_with_scalar_index(tensor, scope) -> None:
        """Triton 3.6's interpreter reads a loop bound with ``int(array)``, which numpy >= 2.4
        refuses for a one-element array; triton 3.9 squeezes it first, as here."""
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    JITFunction.__call__ = call
    if patch_tensor is not None:
        interpreter._patch_lang_tensor = patch_tensor_with_scalar_index
    try:
        yield
    finally:
        JITFunction.__call__ = original
        if patch_tensor is not None:
            interpreter._patch_lang_tensor = patch_tensor
        for owner, attrs in saved:
            _restore_attrs(owner, attrs)


def _language_owners() -> list:
    """The modules and classes of ``triton.language`` the interpreter patches."""
    core = tl.core
    owners = [tl, core, tl.math, core.tensor, getattr(core, "tensor_descriptor_base", None)]
    return list({id(o): o for o in owners if o is not None}.values())


def _restore_attrs(owner, attrs: dict) -> None:
    """Give ``owner`` back exactly the attributes ``attrs`` held."""
    for name in [n for n in vars(owner) if n not in attrs]:
        delattr(owner, name)
    for name, value in attrs.items():
        if vars(owner).get(name) is not value:
            setattr(owner, name, value)


def _run(fn, grid: tuple[int, int], interpret: bool, *args, **meta) -> None:
    """Launch ``fn`` on ``grid`` as it is: compiled, or under the interpreter for CPU tensors."""
    if interpret:
        with _interpreting():
            _kernel(fn, True)[grid](*args, **meta)
    else:
        _kernel(fn, False)[grid](*args, **meta)


_FITTING: dict[tuple, int] = {}  # (kernel, dtype, tile widths) -> the largest block that launched


def _launch(fn, rows: int, programs: int, interpret: bool, *args, by: str = "BLOCK_M", tuned: bool = False,
            **meta) -> None:
    """Run ``fn`` on a (cdiv(rows, meta[by]), programs) grid. Compiled, ``tuned`` launches take
    the measured configuration of ``tuning.TUNED`` when there is one; a launch that needs more
    shared memory than the device has is retried with half the key block (down to MIN_BLOCK),
    and the block that fits is remembered for the kernel, dtype and tile widths. A
    configuration forced by ``tuning.forcing`` (the sweep) runs as given, without retries."""
    if interpret:
        _run(fn, (_cdiv(rows, meta[by]), programs), True, *args, **meta)
        return
    forced = tuning.forced(fn.__name__)
    chosen = forced or (tuning.config(fn.__name__, args[0].dtype, meta["BLOCK_D"]) if tuned else None)
    launch = {}
    if chosen is not None:
        # Backward kernels keep BLOCK_M = BLOCK_N (see attention_backward); the forward caps its
        # query block at the query count, as _meta does.
        short = max(MIN_BLOCK, _next_pow2(rows))
        block_m = min(chosen.block_m, short) if fn.__name__ == "_fwd" else chosen.block_n
        meta = {**meta, "BLOCK_M": block_m, "BLOCK_N": chosen.block_n}
        launch = dict(num_warps=chosen.num_warps, num_stages=chosen.num_stages)
    if forced is not None:
        _run(fn, (_cdiv(rows, meta[by]), programs), False, *args, **meta, **launch)
        return
    key = (fn.__name__, args[0].dtype, meta["BLOCK_D"], meta["BLOCK_DV"], meta["BLOCK_DE"])
    block = min(meta["BLOCK_N"], _FITTING.get(key, meta["BLOCK_N"]))
    ratio = max(1, meta["BLOCK_M"] // meta["BLOCK_N"])  # a tuned forward may take more query rows than keys
    while True:
        sized = {**meta, "BLOCK_M": min(meta["BLOCK_M"], block * ratio), "BLOCK_N": block}
        try:
            _run(fn, (_cdiv(rows, sized[by]), programs), False, *args, **sized, **launch)
        except OutOfResources:
            if block <= MIN_BLOCK:
                raise
            block //= 2
            continue
        _FITTING[key] = block
        return


def default_block(device_type: str, dtype: torch.dtype, width: int) -> int:
    """The first block size to try: 16 under the interpreter; on a GPU 64, or 32 for fp32 tiles
    wider than FP32_WIDE (see MIN_BLOCK / _launch for what happens when even that does not fit)."""
    if device_type == "cpu":
        return MIN_BLOCK
    return 32 if dtype == torch.float32 and width > FP32_WIDE else 64


def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host: ``triton.cdiv`` is a constexpr function, several us a call."""
    return -(-a // b)


def _next_pow2(n: int) -> int:
    """The least power of two >= n (n >= 1), as ``triton.next_power_of_2`` without its call cost."""
    return 1 << (n - 1).bit_length()


def _block(width: int) -> int:
    return max(16, _next_pow2(width))


def _strides(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _unit_last(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _lendable(x: Tensor) -> Tensor:
    """x as it is where its layout can lend a gradient buffer (dense, unit last stride), else a copy."""
    return _unit_last(x) if _dense(x) else x.contiguous()


def _dense(x: Tensor) -> bool:
    """Every element of x's storage span belongs to x exactly once (contiguous up to a
    permutation of its dims): a buffer with x's strides can hold a tensor of x's shape."""
    span = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz > 1):
        if stride != span:
            return False
        span *= size
    return True


def takes_wide(e: Tensor, v: Tensor) -> bool:
    """``fused_attention`` takes this e as it is, wider than v (TAPE's float32 E beside half
    values), casting it inside and saving it uncast."""
    return e.dtype in (torch.float32, torch.float64) and e.dtype.itemsize >= v.dtype.itemsize


def check_inputs(q: Tensor, k: Tensor, v: Tensor, e: Tensor, wide_e: bool = False) -> None:
    """Raise ValueError naming what this kernel cannot take. wide_e: e may also be a wider float
    than q, k, v (``fused_attention`` casts it)."""
    (b, h, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if (bk, dk) != (b, d) or v.shape[:3] != k.shape[:3] or e.shape[:3] != k.shape[:3]:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"e {tuple(e.shape)} do not fit (B, H, Nq, d) / (B, Hkv, Nk, *)")
    if h % hkv:
        raise ValueError(f"{h} query heads are not a multiple of {hkv} key/value heads")
    if nq > nk:
        raise ValueError(f"{nq} queries but only {nk} keys: lower-right causal needs Nq <= Nk")
    if max(d, v.shape[-1], e.shape[-1]) > MAX_HEAD_DIM:
        raise ValueError(f"head dims {d}, {v.shape[-1]}, {e.shape[-1]}: at most {MAX_HEAD_DIM}")
    dtypes = {q.dtype, k.dtype, v.dtype, e.dtype}
    if wide_e and takes_wide(e, v):
        dtypes.discard(e.dtype)
        dtypes.add(v.dtype)
    if len(dtypes) != 1 or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtypes {sorted(map(str, dtypes))}: pass q, k, v, e in one of "
                         "float32, float16, bfloat16" + (" (e may be float32 or float64)" if wide_e else ""))


def _scale(head_dim: int, scale: float | None) -> float:
    """The logits' scale: 1/sqrt(d) by default. It must be positive: the kernels take the row max
    of the unscaled logits and scale it."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not scale > 0:
        raise ValueError(f"scale={scale}: the kernel takes a positive scale (default 1/sqrt(head dim))")
    return float(scale)


def _meta(q: Tensor, k: Tensor, v: Tensor, e: Tensor, block: int | None) -> dict:
    """Tile sizes: BLOCK_N keys per step; BLOCK_M query rows, fewer for a short query block (a
    one-token decode step fills 16 rows, not 64)."""
    widths = dict(BLOCK_D=_block(q.shape[-1]), BLOCK_DV=_block(v.shape[-1]), BLOCK_DE=_block(e.shape[-1]))
    bn = block or default_block(q.device.type, q.dtype, max(widths.values()))
    bm = min(bn, max(MIN_BLOCK, _next_pow2(q.shape[-2])))
    upcast = q.device.type == "cpu" and q.dtype == torch.bfloat16
    return dict(PREC="ieee" if q.dtype == torch.float32 else "tf32", UPCAST=upcast, SPLIT=splits(q),
                BLOCK_M=bm, BLOCK_N=bn, **widths)


def splits(q: Tensor) -> bool:
    """Whether the kernels run the blocks every row sees in a loop without the causal mask. Not
    for compiled fp32 (ieee FMA products): there the second loop doubled the compiled code
    (cold compiles 1.5-2x, spills inside the loops) for a path that is slow whatever it does.
    The interpreter always splits, so the CPU tests cover both loops."""
    return q.dtype != torch.float32 or q.device.type == "cpu"


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, e: Tensor, scale: float | None = None, block: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, H, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv), e (B, Hkv, Nk, de) ->
    (A·V (B, H, Nq, dv), A·E (B, H, Nq, de), LSE (B, H, Nq) float32). No autograd."""
    check_inputs(q, k, v, e)
    return _forward(q, k, v, e, scale, block)


def _forward(q: Tensor, k: Tensor, v: Tensor, e: Tensor, scale: float | None, block: int | None,
             ) -> tuple[Tensor, Tensor, Tensor]:
    """``attention_forward`` on inputs already checked."""
    q, k, v, e = map(_unit_last, (q, k, v, e))
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = _scale(d, scale)
    # token-major outputs (B, Nq, H, ·) in memory, as SDPA's for such q: the output projection
    # reads A·V's heads as one (B, Nq, H·dv) view, and TAPE's head map A·E per token, no copies
    o = q.new_empty(b, nq, h, v.shape[-1]).transpose(1, 2)
    oe = q.new_empty(b, nq, h, e.shape[-1]).transpose(1, 2)
    lse = torch.empty(b, h, nq, device=q.device, dtype=torch.float32)
    meta = _meta(q, k, v, e, block)
    _launch(
        _fwd, nq, b * h, q.device.type == "cpu", q, k, v, e, o, oe, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(e),
        *_strides(o), *_strides(oe), h, h // hkv, nq, nk, d, v.shape[-1], e.shape[-1], scale,
        tuned=block is None, **meta,
    )
    return o, oe, lse


def attention_backward(
    q: Tensor, k: Tensor, v: Tensor, e: Tensor, o: Tensor, oe: Tensor, lse: Tensor,
    do: Tensor, doe: Tensor, scale: float | None = None, block: int | None = None,
    into: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv, de) of ``attention_forward`` given dO (B, H, Nq, dv), dO_e (.., de).
    A wider e than v (``takes_wide``) is multiplied in v's dtype and gets its gradient in its own
    dtype, written from the kernel's float32 sums (no half-precision rounding on the way).
    ``into``: buffers for dq and dk with q's and k's strides (the halves of a joined q and k's
    gradient), written and returned."""
    grad_dtype = e.dtype
    # The gradient buffers below are written through q's, k's, v's and e's strides: an input
    # that is dense (a transposed projection too) lends them its layout, and the gradient leaves
    # in the layout its input came in; a sliced or expanded one (layer 0's E) is copied first,
    # unless ``into`` brings buffers of its layout.
    if into is None:
        q, k = map(_lendable, (q, k))
    elif any(t.stride() != buf.stride() or t.stride(-1) != 1 for t, buf in zip((q, k), into)):
        raise ValueError(f"into: buffers of strides {[b.stride() for b in into]} for q {q.stride()} "
                         f"and k {k.stride()}; pass buffers laid out as q and k (unit last stride)")
    v, e = _lendable(v), _lendable(e.to(v.dtype))
    do, doe = _unit_last(do.to(v.dtype)), _unit_last(doe.to(v.dtype))  # only read
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = _scale(d, scale)
    interpret = q.device.type == "cpu"
    meta = _meta(q, k, v, e, block)
    # Δ_i = Σ_j P_ij dP_ij = dO_i·O_i + dO_e,i·O_e,i (both value paths), float32 (B, H, Nq): one
    # kernel instead of casts, products and sums; 16 rows a program keep its four tiles in
    # registers at head dim 128.
    delta = torch.empty(b, h, nq, device=q.device, dtype=torch.float32)
    _run(_bwd_delta, (_cdiv(nq, DELTA_ROWS), b * h), interpret, o, oe, do, doe, delta,
         *_strides(o), *_strides(oe), *_strides(do), *_strides(doe), h, nq, v.shape[-1], e.shape[-1],
         BLOCK_M=DELTA_ROWS, BLOCK_DV=meta["BLOCK_DV"], BLOCK_DE=meta["BLOCK_DE"])
    dq, dk = into or (torch.empty_strided(t.shape, t.stride(), device=t.device, dtype=t.dtype) for t in (q, k))
    dv = torch.empty_strided(v.shape, v.stride(), device=v.device, dtype=v.dtype)
    de = torch.empty_strided(e.shape, e.stride(), device=e.device, dtype=grad_dtype)
    # Full query blocks: compiled for sm_90 (triton 3.6), dK of a one-query decode step in
    # fp16/bf16 came out wrong (relative error 0.22) with BLOCK_M 16 < BLOCK_N 64.
    meta["BLOCK_M"] = meta["BLOCK_N"]
    common = (*_strides(q), *_strides(k), *_strides(v), *_strides(e), *_strides(do), *_strides(doe))
    sizes = (nq, nk, d, v.shape[-1], e.shape[-1], scale)
    _launch(
        _bwd_dkdvde, nk, b * hkv, interpret, q, k, v, e, do, doe, lse, delta, dk, dv, de, *common, h, hkv, h // hkv,
        *sizes, by="BLOCK_N", tuned=block is None, **meta,
    )
    _launch(
        _bwd_dq, nq, b * h, interpret, q, k, v, e, do, doe, lse, delta, dq, *common, h, h // hkv, *sizes,
        tuned=block is None, **meta,
    )
    return dq, dk, dv, de


class FusedVEAttention(torch.autograd.Function):
    """Autograd wrapper: (q, k, v, e) -> (A·V, A·E) with the fused forward and summed backward.

    A wider e (TAPE's float32 E beside bf16 q, k, v) is cast to v's dtype for the kernel, and the
    caller's e, which TAPE keeps alive anyway, is saved instead of the cast copy (recast in
    backward): one (B, Hkv, Nk, de) half-precision tensor less per layer between the passes. Its
    gradient comes out in its own dtype from the kernel's float32 sums.
    """

    @staticmethod
    def forward(ctx, q, k, v, e, scale, block):  # noqa: D102
        o, oe, lse = _forward(q, k, v, e.to(v.dtype), scale, block)  # fused_attention checked them
        ctx.save_for_backward(q, k, v, e, o, oe, lse)
        ctx.scale, ctx.block = scale, block
        return o, oe

    @staticmethod
    def backward(ctx, do, doe):  # noqa: D102
        q, k, v, e, o, oe, lse = ctx.saved_tensors
        dq, dk, dv, de = attention_backward(q, k, v, e, o, oe, lse, do, doe, ctx.scale, ctx.block)
        return dq, dk, dv, de, None, None


def fused_attention(
    q: Tensor, k: Tensor, v: Tensor, e: Tensor, scale: float | None = None, block: int | None = None
) -> tuple[Tensor, Tensor]:
    """Causal (lower-right) softmax(q kᵀ · scale) applied to V and E with one QKᵀ; differentiable.

    q (B, H, Nq, d); k, v, e (B, Hkv, Nk, ·) with H a multiple of Hkv -> (B, H, Nq, dv), (B, H, Nq, de).
    e may be float32 or float64 beside half q, k, v: it is aggregated in v's dtype, A·E comes out
    in v's dtype and e's gradient in e's.
    """
    check_inputs(q, k, v, e, wide_e=True)
    return FusedVEAttention.apply(q, k, v, e, scale, block)
