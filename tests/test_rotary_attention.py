"""TAPE's rotation inside the Triton kernel's autograd node (tape/model/rotary_attention.py):
the rotation's gradient by hand equals autograd's; the node equals rotating first and attending
after, in outputs and every gradient (E's through both the rotation and the values), against
float64; it keeps q and k unrotated for backward and no rotated copy."""

from __future__ import annotations

import pytest
import torch
from model_helpers import tiny_model, triton_interpreter_problem
from test_kernels import interpreted, reference

from tape.bench.memory import saved_tensor_bytes
from tape.pe.rope import broadcast_shape, rotate, rotate_backward, rotate_grouped

pytest.importorskip("triton")
from tape.kernels.triton_attention import fused_attention  # noqa: E402
from tape.model.rotary_attention import rotary_fused_attention  # noqa: E402


@pytest.mark.parametrize("shapes", [[(2, 3, 5, 8), (2, 1, 5, 8)], [(1, 1, 5, 8), (2, 3, 1, 8), (3, 1, 8)],
                                    [(2, 0, 5, 8), (1, 1, 5, 8)], [(4,), (2, 1, 4)]])
def test_broadcast_shape_is_torchs(shapes):
    assert broadcast_shape(*map(torch.Size, shapes)) == tuple(torch.broadcast_shapes(*shapes))


def test_broadcast_shape_refuses_what_does_not_broadcast():
    with pytest.raises(RuntimeError, match="do not broadcast"):
        broadcast_shape(torch.Size((2, 3)), torch.Size((2, 4)))


@pytest.mark.parametrize("rot_shape", [(2, 3, 5, 8), (2, 1, 5, 8), (1, 1, 5, 8)])
def test_rotate_backward_is_the_vjp_of_rotate(rot_shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    rot = torch.randn(*rot_shape, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    want_x, want_rot = torch.autograd.grad(rotate(x, rot), (x, rot), grad)
    got_x, got_rot = rotate_backward(grad, x.detach(), rot.detach())
    dims = [i for i, n in enumerate(rot_shape) if n == 1]
    got_rot = got_rot.sum(dims, keepdim=True) if dims else got_rot
    torch.testing.assert_close(got_x, want_x, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got_rot, want_rot, atol=1e-12, rtol=1e-12)


ROTATIONS = [  # (query heads, key heads, rot heads, rot batch rows, joined)
    (4, 2, 2, 2, False), (4, 2, 1, 2, False), (4, 2, 1, 1, False),  # GQA, rot per E head or shared
    (4, 4, 4, 2, True), (4, 4, 4, 1, True), (4, 4, 1, 2, True), (4, 2, 1, 1, True)]


@pytest.mark.parametrize("heads,kv_heads,rot_heads,rot_batch,joined", ROTATIONS)
def test_the_rotation_nodes_equal_autograd_of_the_rotation(heads, kv_heads, rot_heads, rot_batch, joined):
    """``RotateQK`` (q with 4 heads over k's 2) and ``RotateJoined`` (q and k joined: as many
    heads, or one rot for all), rot per E head or shared over heads or batch rows: outputs and
    every gradient in float64 equal autograd's of ``rope.rotate_grouped``."""
    from tape.model.rotation import RotateJoined, RotateQK, join, joinable

    gen = torch.Generator().manual_seed(0)
    shapes = [(2, heads, 9, 16), (2, kv_heads, 9, 16), (rot_batch, rot_heads, 9, 16)]
    ours = [torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    ref = [x.detach().clone().requires_grad_() for x in ours]
    g_q, g_k = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes[:2])
    if joined:
        assert joinable(*ours)
        qr, kr = RotateJoined.apply(join(ours[0], ours[1]), ours[2], torch.float64, heads)
    else:
        qr, kr = RotateQK.apply(*ours, torch.float64)
    ((qr * g_q).sum() + (kr * g_k).sum()).backward()
    r_qr, r_kr = rotate_grouped(*ref)
    ((r_qr * g_q).sum() + (r_kr * g_k).sum()).backward()
    torch.testing.assert_close((qr, kr), (r_qr, r_kr), atol=1e-12, rtol=1e-12)
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-12, rtol=1e-12)


def test_grouped_queries_with_a_rotation_per_head_are_not_joined():
    from tape.model.rotation import joinable

    q, k, rot = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8)
    assert not joinable(q, k, rot) and joinable(q, k, rot[:, :1]) and joinable(q, q, q)


def _rotation_and_sdpa(joined: bool, monkeypatch: pytest.MonkeyPatch):
    """A projection, TAPE's rotation (with recipes) and SDPA: (loss, how often the rotation is rebuilt)."""
    import torch.nn.functional as F

    import tape.model.rotation as rotation
    from tape.model.recompute import recomputed_in_backward

    if not joined:
        monkeypatch.setattr(rotation, "joinable", lambda *a: False)
    rebuilt = []
    for name in ("rotate_joined", "rotate_q", "rotate_k"):
        real = getattr(rotation, name)
        monkeypatch.setattr(rotation, name, lambda *a, real=real: rebuilt.append(1) or real(*a))
    gen = torch.Generator().manual_seed(0)
    b, n, h, d = 2, 7, 4, 8
    x = torch.randn(b, n, 32, generator=gen, requires_grad=True)
    w = torch.randn(2 * h * d, 32, generator=gen, requires_grad=True)
    rot = torch.randn(b, h, n, d, generator=gen, requires_grad=True)
    q, k = F.linear(x, w).view(b, n, 2 * h, d).transpose(1, 2).chunk(2, dim=1)
    qr, kr, recipes = rotation.rotate_with_recipes(q, k, rot, torch.float32)
    with recomputed_in_backward(recipes):
        out = F.scaled_dot_product_attention(qr, kr, qr.detach(), is_causal=True)
    rebuilt.clear()
    return out.square().sum(), rebuilt, (x, w, rot)


def test_joined_q_and_k_rotate_with_fewer_operators_and_one_rebuild(monkeypatch):
    """The same gradients as rotating q and k apart; the rotated pair rebuilt once for backward
    (not once each); at least 12 device operators less in backward."""
    from tape.bench.dispatch_count import device_ops

    counts, grads = {}, {}
    for joined in (True, False):
        with monkeypatch.context() as m:
            loss, rebuilt, leaves = _rotation_and_sdpa(joined, m)
            counts[joined] = sum(device_ops(loss.backward).values())
            grads[joined] = [t.grad for t in leaves]
            assert len(rebuilt) == (1 if joined else 2)
    for got, want in zip(grads[True], grads[False]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert counts[True] + 12 <= counts[False], counts


def _case(b, h, hkv, n, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    k, v, e = (torch.randn(b, hkv, n, d, generator=gen, dtype=torch.float64) for _ in range(3))
    return q, k, v, e


CASES = [dict(b=1, h=4, hkv=2, n=13, d=16), dict(b=2, h=2, hkv=2, n=20, d=32)]
CUDA_CASES = [dict(b=2, h=4, hkv=4, n=100, d=64), dict(b=1, h=8, hkv=2, n=77, d=128)]
RUNS = [pytest.param("cpu", case, marks=interpreted) for case in CASES] + [
    pytest.param("cuda", case, marks=pytest.mark.cuda) for case in CUDA_CASES]


@pytest.mark.parametrize("device,case", RUNS, ids=lambda c: c if isinstance(c, str) else
                         f"h{c['h']}-hkv{c['hkv']}-n{c['n']}-d{c['d']}")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_the_node_equals_rotating_then_attending_against_float64(device, case, dtype, tol):
    """E (float32, as TAPE keeps it) is both the rotation and the extra values; q, k, v in dtype.
    On CPU under the Triton interpreter; marked cuda, compiled on a GPU (fp32 there: 1e-4, as the
    kernel's own test)."""
    tol = 1e-4 if device == "cuda" and dtype == torch.float32 else tol
    q, k, v, e = _case(**case)
    q, k, v = (x.to(dtype).double() for x in (q, k, v))  # the reference sees the rounded inputs
    e = e.float().double()
    ours = [x.to(device) for x in (q.to(dtype), k.to(dtype), v.to(dtype), e.float())]
    ref = [x.clone() for x in (q, k, v, e)]
    for x in (*ours, *ref):
        x.requires_grad_()
    o, oe = rotary_fused_attention(*ours, ours[3])
    qr, kr = rotate_grouped(ref[0], ref[1], ref[3])
    r_o, r_oe, _ = reference(qr, kr, ref[2], ref[3])
    gen = torch.Generator().manual_seed(1)
    g_o, g_oe = (torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (r_o, r_oe))
    ((o.double().cpu() * g_o).sum() + (oe.double().cpu() * g_oe).sum()).backward()
    ((r_o * g_o).sum() + (r_oe * g_oe).sum()).backward()
    pairs = {"o": (o, r_o), "oe": (oe, r_oe)}
    pairs.update({f"d{n}": (a.grad, r.grad) for n, a, r in zip("qkve", ours, ref)})
    assert ours[0].grad.dtype == dtype and ours[3].grad.dtype == torch.float32
    for name, (got, want) in pairs.items():
        err = (got.double().cpu() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.0e}"


@interpreted
def test_a_rotation_shared_over_heads_gets_its_summed_gradient():
    """rot (B, 1, N, d) broadcast over the heads, apart from E: its gradient is summed over them."""
    q, k, v, e = _case(b=1, h=4, hkv=2, n=9, d=16)
    rot = torch.randn(1, 1, 9, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ours = [x.float().requires_grad_() for x in (q, k, v, e, rot)]
    ref = [x.clone().requires_grad_() for x in (q, k, v, e, rot)]
    o, oe = rotary_fused_attention(*ours)
    qr, kr = rotate_grouped(ref[0], ref[1], ref[4])
    r_o, r_oe, _ = reference(qr, kr, ref[2], ref[3])
    (o.double().sum() + oe.double().square().sum()).backward()
    (r_o.sum() + r_oe.square().sum()).backward()
    for got, want in zip(ours, ref):
        assert got.grad.shape == want.shape
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(bool(triton_interpreter_problem()), reason=triton_interpreter_problem() or "runs")
def test_the_node_keeps_q_and_k_unrotated_and_no_rotated_copy():
    """Rotating apart keeps q, k (for E's gradient) and their rotated copies (for the
    attention's): the node keeps q and k only (under grouped-query attention too, with E
    broadcast over each query group)."""
    q, k, v, e = (x.float().requires_grad_() for x in _case(b=1, h=4, hkv=2, n=16, d=16))

    def apart():
        qr, kr = rotate_grouped(q, k, e)
        return fused_attention(qr, kr, v, e)

    def node():
        return rotary_fused_attention(q, k, v, e, e)

    assert saved_tensor_bytes(apart) - saved_tensor_bytes(node) == q.nbytes + k.nbytes


@pytest.mark.skipif(bool(triton_interpreter_problem()), reason=triton_interpreter_problem() or "runs")
def test_the_joined_node_keeps_q_and_k_unrotated_once():
    """As many query as key heads: the node keeps the joined q and k (their bytes once), not
    their rotated copies."""
    q, k, v, e = (x.float().requires_grad_() for x in _case(b=1, h=2, hkv=2, n=16, d=16))

    def apart():
        qr, kr = rotate_grouped(q, k, e)
        return fused_attention(qr, kr, v, e)

    assert saved_tensor_bytes(apart) - saved_tensor_bytes(lambda: rotary_fused_attention(q, k, v, e, e)) == (
        q.nbytes + k.nbytes)


@interpreted
def test_the_kernel_writes_dq_and_dk_into_given_buffers():
    """``attention_backward(into=...)`` fills the halves of a joined gradient with the same numbers;
    buffers laid out unlike q and k are refused."""
    from tape.kernels.triton_attention import attention_backward, attention_forward

    q, k, v, e = (x.float() for x in _case(b=1, h=2, hkv=2, n=20, d=16))
    qk = torch.cat([q.transpose(1, 2), k.transpose(1, 2)], dim=2).transpose(1, 2)  # token-major
    q_half, k_half = qk[:, :2], qk[:, 2:]
    o, oe, lse = attention_forward(q_half, k_half, v, e)
    gen = torch.Generator().manual_seed(2)
    do, doe = torch.randn(o.shape, generator=gen), torch.randn(oe.shape, generator=gen)
    want = attention_backward(q_half.contiguous(), k_half.contiguous(), v, e, o, oe, lse, do, doe)
    joined = torch.empty_like(qk)
    got = attention_backward(q_half, k_half, v, e, o, oe, lse, do, doe, into=(joined[:, :2], joined[:, 2:]))
    torch.testing.assert_close(joined, torch.cat(want[:2], dim=1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[2:], want[2:], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="into: buffers"):
        attention_backward(q_half, k_half, v, e, o, oe, lse, do, doe, into=(q.clone(), k.clone()))


@pytest.mark.skipif(bool(triton_interpreter_problem()), reason=triton_interpreter_problem() or "runs")
def test_the_decoder_hands_tape_rotation_to_the_kernel_node_only_without_a_cache(monkeypatch):
    """Calls without a cache (training) reach the node with q, k unrotated; with a cache
    (generation) the layer rotates them as before."""
    import tape.model.rotary_attention as rotary

    calls = []
    real = rotary.rotary_fused_attention
    monkeypatch.setattr(rotary, "rotary_fused_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = tiny_model("tape", n_layers=3, attn_backend="triton").eval()
    ids = torch.randint(0, 37, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
        assert len(calls) == 2  # the layers with E values (the last has none: SDPA, rotated in attend)
        model.generate(ids, max_new_tokens=2)
    assert len(calls) == 2
