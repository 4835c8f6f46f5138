"""YaRN (Peng et al. 2023) on every rotary encoding: its frequencies equal transformers' own,
it is off at factor 1, and it keeps RoPE's properties (relative positions, TAPE = RoPE at init)."""

import math

import pytest
import torch

from model_helpers import randomize, tiny_config
from tape.model import DecoderLM
import tape.pe
from tape.pe.base import RotaryOptions, Yarn, inverse_frequencies
from tape.pe.rope import rope_table, yarn_frequencies, yarn_magnitude

CPU = torch.device("cpu")


@pytest.mark.parametrize("head_dim, theta, factor, length", [
    (64, 10000.0, 2.0, 1024), (128, 10000.0, 8.0, 4096), (32, 500.0, 4.0, 256),
    (16, 10000.0, 2.0, 20), (128, 500000.0, 16.0, 8192),
])
def test_frequencies_and_magnitude_equal_transformers(head_dim, theta, factor, length):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=int(length * factor),
                         rope_parameters={"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                                          "original_max_position_embeddings": length})
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, CPU)
    ours = yarn_frequencies(head_dim, theta, Yarn(factor, length), CPU)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-6, atol=0)
    assert yarn_magnitude(factor) == pytest.approx(attention_factor)


def test_fast_pairs_are_kept_and_slow_pairs_interpolated():
    yarn = Yarn(4.0, 4096)
    base = inverse_frequencies(128, 10000.0, CPU)
    ours = yarn_frequencies(128, 10000.0, yarn, CPU)
    turns = base * yarn.original_length / (2 * math.pi)
    assert torch.equal(ours[turns > 2 * yarn.beta_fast], base[turns > 2 * yarn.beta_fast])
    slow = turns < yarn.beta_slow / 2
    torch.testing.assert_close(ours[slow], base[slow] / 4, rtol=1e-12, atol=0)
    assert slow.any() and (turns > 2 * yarn.beta_fast).any()
    assert bool((ours <= base).all() and (ours >= base / 4).all())


def test_table_magnitude_and_factor_one_is_plain_rope():
    pos = torch.arange(50)[None]
    plain = rope_table(pos, 32, 10000.0, 1.0, torch.float64)
    yarn = rope_table(pos, 32, 10000.0, 1.0, torch.float64, yarn=Yarn(3.0, 16))
    c, s = yarn.chunk(2, dim=-1)
    torch.testing.assert_close((c**2 + s**2).sqrt(), torch.full_like(c, 0.1 * math.log(3.0) + 1))
    assert not torch.allclose(plain, yarn)
    rope = tiny_config("rope", rope_yarn_factor=1.0, rope_yarn_original_length=16)
    assert DecoderLM(rope).pe.opts.yarn() is None


ROTARY_OPTIONS = [pe for pe in tape.pe.names() if issubclass(tape.pe.get(pe).Options, RotaryOptions)]


def test_the_rotary_encodings_are_found():
    assert {"rope", "tape", "prope", "xpos", "randpe"} <= set(ROTARY_OPTIONS)


@pytest.mark.parametrize("pe", ROTARY_OPTIONS)
def test_every_rotary_encoding_reads_the_option(pe):
    """Every encoding that has the option uses it (none accepts it and ignores it)."""
    torch.manual_seed(0)
    model = randomize(DecoderLM(tiny_config(pe)), seed=1).eval()
    yarn = DecoderLM(tiny_config(pe, rope_yarn_factor=4.0, rope_yarn_original_length=8)).eval()
    yarn.load_state_dict(model.state_dict())
    ids = torch.randint(0, 37, (2, 20))
    with torch.no_grad():
        assert (model(ids).logits - yarn(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("pe", ["rope", "tape"])
def test_logits_depend_on_position_differences_only(pe):
    torch.manual_seed(0)
    model = randomize(DecoderLM(tiny_config(pe, rope_yarn_factor=2.0, rope_yarn_original_length=12)), seed=2).eval()
    ids = torch.randint(0, 37, (2, 24))
    pos = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        a, b = model(ids, position_ids=pos).logits, model(ids, position_ids=pos + 777).logits
    assert (a - b).abs().max() < 1e-4
