"""The baseline encodings' formulas, pinned with hand-worked values (tape-spec D.4)."""

import math

import pytest
import torch

from model_helpers import tiny_model
from tape.pe.alibi import alibi_slopes
from tape.pe.base import PositionState
from tape.pe.rope import rope_table, rotate
from tape.pe.t5 import causal_bucket
from tape.pe.xpos import xpos_scale


def test_alibi_slopes_for_powers_of_two_and_twelve_heads():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    twelve = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve))


def test_alibi_bias_is_minus_slope_times_distance():
    model = tiny_model("alibi")
    pos = torch.arange(5)[None]
    bias = model.layers[0].pe.attn_bias(PositionState(pos, pos))
    slopes = alibi_slopes(4)
    assert bias.shape == (1, 4, 5, 5)
    assert torch.isclose(bias[0, 2, 4, 1], -slopes[2] * 3)
    assert torch.all(bias[0, :, torch.arange(5), torch.arange(5)] == 0)


@pytest.mark.parametrize("cast", ["to_bf16", "half", "double"])
def test_alibi_slopes_keep_their_precision_when_the_model_is_cast(cast):
    """A bf16 slope 2^-0.5 is off by 7.6e-5, a bias error of 0.31 at distance 4096."""
    model = tiny_model("alibi", dtype=torch.float32)
    model = {"to_bf16": lambda m: m.to(torch.bfloat16), "half": lambda m: m.half(),
             "double": lambda m: m.double()}[cast](model)
    layer = model.layers[0].pe
    assert next(model.parameters()).dtype != torch.float32  # the weights did change dtype
    expected = torch.float64 if cast == "double" else torch.float32
    assert layer.slopes.dtype == expected
    torch.testing.assert_close(layer.slopes.float(), alibi_slopes(layer.slopes.numel()), rtol=0, atol=0)


def test_t5_buckets_exact_then_log_spaced_then_clamped():
    d = torch.arange(0, 400)
    b = causal_bucket(d, 64, 128)
    assert b[:32].tolist() == list(range(32))
    assert (b.diff() >= 0).all() and b.max() == 63
    assert b[100] == 58 and b[128] == 63 and b[399] == 63  # 32 + floor(log(100/32)/log(4)*32)
    assert causal_bucket(torch.tensor([-5]), 64, 128).item() == 0  # future keys: bucket 0 (masked anyway)
    # a log-spaced bucket by hand: 32 + floor(log(64/32)/log(128/32) * 32) = 48
    assert causal_bucket(torch.tensor([64]), 64, 128).item() == 48


def test_fire_bias_matches_its_formula():
    model = tiny_model("fire", fire_init_L=4.0)
    layer = model.layers[0].pe
    pos = torch.arange(8)[None]
    bias = layer.attn_bias(PositionState(pos, pos))  # (1, H, 8, 8)
    c = layer.c.item()
    psi = lambda x: math.log(abs(c * x) + 1)  # noqa: E731
    i, j = 6, 2
    L = abs(layer.L_mult.item() * 4.0)
    x = torch.tensor([[psi(i - j) / psi(max(i, L))]])
    expected = layer.mlp(x)[0]
    assert torch.allclose(bias[0, :, i, j], expected, atol=1e-6)


def test_rope_is_complex_multiplication_by_unit_phase():
    d = 8
    pos = torch.tensor([[0, 3, 1000]])
    table = rope_table(pos, d, 10000.0, 1.0, torch.float64)  # (1, 1, 3, d)
    x = torch.randn(1, 1, 3, d, dtype=torch.float64)
    out = rotate(x, table)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    freqs = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    phase = torch.polar(torch.ones(3, d // 2, dtype=torch.float64), pos[0, :, None] * freqs)
    expected = z * phase
    assert torch.allclose(out, torch.cat([expected.real, expected.imag], -1), atol=1e-12)


def test_rope_positions_and_angles_stay_exact_under_bf16():
    """The table is built in float64 and cast: consecutive positions above 256 stay distinct."""
    pos = torch.arange(2048, 2064)[None]
    table = rope_table(pos, 64, 10000.0, 1.0, torch.bfloat16)
    assert len({tuple(row.tolist()) for row in table[0, 0, :, :4]}) == 16


def test_xpos_decay_depends_on_distance_only():
    s = xpos_scale(torch.tensor([[10, 40, 1010, 1040]]), 8, 2048.0, 512, torch.float64)[0, 0]
    assert torch.allclose(s[1] / s[0], s[3] / s[2])  # same distance, same relative scale
    zeta = (torch.arange(0, 8, 2, dtype=torch.float64) + 3.2) / 11.2
    assert torch.allclose(s[1] / s[0], zeta ** (30 / 2048))


# ---------------------------------------------------------------------------- p-RoPE
def test_prope_at_one_is_rope_and_at_zero_is_nope() -> None:
    """p-RoPE's reductions (issue 25): p = 1 rotates every pair (RoPE), p = 0 none (NoPE)."""
    from model_helpers import tiny_model

    ids = torch.randint(0, 37, (2, 20), generator=torch.Generator().manual_seed(1))
    rope, nope = tiny_model("rope"), tiny_model("nope")
    full, none = tiny_model("prope", prope_fraction=1.0), tiny_model("prope", prope_fraction=0.0)
    with torch.no_grad():
        torch.testing.assert_close(full(ids).logits, rope(ids).logits, rtol=0, atol=0)
        torch.testing.assert_close(none(ids).logits, nope(ids).logits, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(tiny_model("prope")(ids).logits, rope(ids).logits, atol=1e-4)


def test_prope_keeps_ropes_highest_frequencies_unchanged() -> None:
    """Not a respaced spectrum (Hugging Face's partial_rotary_factor): the kept pairs rotate at
    exactly RoPE's frequencies, the lowest quarter not at all."""
    from tape.pe.rope import rope_table

    pos = torch.arange(50)[None]
    rope = rope_table(pos, 16, 10000.0, 1.0, torch.float64)  # (1, 1, 50, 16) = [cos | sin]
    prope = rope_table(pos, 16, 10000.0, 1.0, torch.float64, fraction=0.75)
    cos, sin = prope[..., :8], prope[..., 8:]
    torch.testing.assert_close(prope[..., :6], rope[..., :6])  # 6 of the 8 pairs kept, highest first
    torch.testing.assert_close(prope[..., 8:14], rope[..., 8:14])
    assert torch.all(cos[..., 6:] == 1) and torch.all(sin[..., 6:] == 0)


def test_prope_fraction_out_of_range_is_refused() -> None:
    import tape.pe
    from tape.model import ConfigError, ModelConfig

    with pytest.raises(ConfigError, match="prope_fraction=1.5 must be in"):
        tape.pe.check(ModelConfig(vocab_size=8, n_layers=1, d_model=16, n_heads=2, pe="prope",
                                  pe_options=dict(prope_fraction=1.5)))
