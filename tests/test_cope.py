"""CoPE (tape/pe/cope.py) against its definition: gates count keys, positions are reverse
cumulative sums of gates, the table is interpolated linearly; the decoder hook sees every
cached key and the padding mask. The shared properties are in test_pe_properties.py."""

from __future__ import annotations

import math

import pytest
import torch

from model_helpers import tiny_model
from tape.model.attention import causal_mask
from tape.pe.cope import CoPELayer, contextual_positions, interpolate
from tape.pe.base import PositionState


def layer_with_table(head_dim: int = 8, npos: int = 40, seed: int = 0) -> CoPELayer:
    layer = CoPELayer(head_dim, npos).double()
    with torch.no_grad():
        layer.table.copy_(torch.randn(npos, head_dim, generator=torch.Generator().manual_seed(seed)))
    return layer


def no_state(b: int, n: int, t: int) -> PositionState:
    """CoPE never reads positions: a state of zeros."""
    return PositionState(query_pos=torch.zeros(b, n, dtype=torch.long),
                         key_pos=torch.zeros(b, t, dtype=torch.long))


def reference_bias(q, k, table, valid=None):
    """Loops over the definition: p_ij = sum_{t=j..i} sigmoid(q_i·k_t/√d) over valid keys t,
    clamped; e[p] interpolated; logit q_i·e[p]/√d. Queries are the last Nq of the Nk keys."""
    b, h, nq, d = q.shape
    nk, npos = k.shape[2], table.shape[0]
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    out = torch.zeros(b, h, nq, nk, dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for qi in range(nq):
                i = nk - nq + qi
                for j in range(i + 1):
                    p = sum(torch.sigmoid(q[bi, hi, qi] @ k[bi, hi, t] / math.sqrt(d))
                            for t in range(j, i + 1) if valid is None or valid[bi, t] or t == i)
                    p = min(float(p), npos - 1)
                    lo, hi_ = math.floor(p), math.ceil(p)
                    e = table[lo] + (p - lo) * (table[hi_] - table[lo])
                    out[bi, hi, qi, j] = q[bi, hi, qi] @ e / math.sqrt(d)
    return out


def test_with_every_gate_at_one_the_position_counts_the_keys_from_j_to_i():
    gates = torch.tril(torch.ones(5, 5))  # causal: keys j > i do not count
    p = contextual_positions(gates, max_position=100)
    i, j = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    assert torch.equal(p, torch.where(j <= i, (i - j + 1).float(), torch.zeros(())))
    assert contextual_positions(gates, max_position=3).max() == 3  # clamped to npos - 1


def test_forced_gates_give_the_table_row_of_the_token_count(monkeypatch):
    """Gates at 1 through the test seam: the logit for (i, j) is q_i · e[i - j + 1] / √d (no
    interpolation weight left: up to rounding of the product), and padded keys are not counted."""
    layer = layer_with_table()
    monkeypatch.setattr(layer, "gate", lambda logits: torch.ones_like(logits))
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 6, 8, generator=gen, dtype=torch.float64)
    bias = layer.score_bias(q, k, no_state(1, 6, 6), None)
    for i in range(6):
        for j in range(i + 1):
            want = q[0, :, i] @ layer.table[i - j + 1] / math.sqrt(8)
            torch.testing.assert_close(bias[0, :, i, j], want, rtol=1e-14, atol=1e-14)
    valid = torch.tensor([[False, False, True, True, True, True]])  # two left-padding keys
    padded = layer.score_bias(q, k, no_state(1, 6, 6), causal_mask(6, valid, 6, q.device))
    for i in range(2, 6):
        for j in range(i + 1):
            count = i - max(j, 2) + 1  # only real keys from j to i count
            want = q[0, :, i] @ layer.table[count] / math.sqrt(8)
            torch.testing.assert_close(padded[0, :, i, j], want, rtol=1e-14, atol=1e-14)


def test_interpolation_is_exact_at_integers_and_linear_between():
    z = torch.randn(3, 10, dtype=torch.float64)
    p = torch.tensor([[0.0, 4.0, 9.0], [2.0, 2.25, 2.5], [7.0, 7.75, 8.0]], dtype=torch.float64)
    got = interpolate(z, p)
    assert torch.equal(got[0], z[0, [0, 4, 9]])
    assert torch.allclose(got[1], torch.stack([z[1, 2], 0.75 * z[1, 2] + 0.25 * z[1, 3], 0.5 * (z[1, 2] + z[1, 3])]))
    assert torch.allclose(got[2], torch.stack([z[2, 7], 0.25 * z[2, 7] + 0.75 * z[2, 8], z[2, 8]]))


@pytest.mark.parametrize("nq", [7, 3, 1])  # a full forward, a cached chunk, one decoding step
@pytest.mark.parametrize("npos", [40, 4])  # 4: positions clamp
def test_score_bias_matches_the_definition(nq, npos):
    layer = layer_with_table(npos=npos)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, nq, 8, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64) * 2  # GQA: 2 kv heads
    valid = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    for mask, v in ((None if nq in (7, 1) else causal_mask(nq, None, 7, q.device), None),
                    (causal_mask(nq, valid, 7, q.device), valid)):
        got = layer.score_bias(q, k, no_state(2, nq, 7), mask)
        want = reference_bias(q, k, layer.table.detach(), v)
        allowed = causal_mask(nq, None, 7, q.device).expand_as(got)
        torch.testing.assert_close(got[allowed], want[allowed], rtol=1e-12, atol=1e-12)


def test_gradients_reach_q_k_and_the_table():
    layer = layer_with_table()
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = layer.score_bias(q, k, no_state(2, 6, 6), None)
    (bias * torch.randn(bias.shape, generator=gen, dtype=torch.float64)).sum().backward()
    for name, g in (("q", q.grad), ("k", k.grad), ("table", layer.table.grad)):
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name
    assert torch.autograd.gradcheck(lambda q_, k_: layer.score_bias(q_, k_, no_state(2, 6, 6), None),
                                    (q.detach()[:1, :2, :4].requires_grad_(), k.detach()[:1, :1, :4].requires_grad_()))


def test_cache_matches_recomputation_when_positions_clamp():
    model = tiny_model("cope", dtype=torch.float64, n_kv_heads=2, cope_npos=5)
    ids = torch.randint(0, 37, (2, 15), generator=torch.Generator().manual_seed(6))
    full = model(ids).logits
    out = model(ids[:, :9], use_cache=True)
    step = [model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True).logits for t in range(9, 15)]
    assert torch.allclose(full, torch.cat([out.logits, *step], dim=1), atol=1e-10, rtol=0)


def test_the_bias_is_materialised_and_backends_agree():
    sdpa = tiny_model("cope", dtype=torch.float64, attn_backend="sdpa")
    eager = tiny_model("cope", dtype=torch.float64, attn_backend="eager")
    ids = torch.randint(0, 37, (2, 11), generator=torch.Generator().manual_seed(7))
    assert torch.allclose(sdpa(ids).logits, eager(ids).logits, atol=1e-10, rtol=0)
    assert tiny_model("cope").pe.materialises_bias


def test_zero_table_at_init_is_nope():
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(8))
    cope, nope = tiny_model("cope", random_pe=False), tiny_model("nope", random_pe=False)
    assert torch.allclose(cope(ids).logits, nope(ids).logits, atol=1e-6, rtol=0)
