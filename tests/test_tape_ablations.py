"""Table 6's lower-half ablations (tape_equivariant, tape_tensorial): RoPE at initialisation,
which symmetries each keeps and breaks, their parameters, gradients and cached generation."""

import math

import pytest
import torch

from model_helpers import phase_rotate, randomize, tiny_config, tiny_model
from tape.errors import ConfigError
from tape.model import DecoderLM
from tape.pe.base import PositionState

ABLATIONS = [dict(tape_equivariant=False), dict(tape_tensorial=False),
             dict(tape_equivariant=False, tape_tensorial=False)]
IDS = ["no-eq", "vector", "vector-no-eq"]


def _layer_commutes(switches: dict, phase_of_block, seed: int = 0) -> bool:
    """Whether decoder layer 0 (random weights, arbitrary E) commutes with rotating E's pairs."""
    model = tiny_model("tape", dtype=torch.float64, seed=seed, n_layers=2, **switches)
    gen = torch.Generator().manual_seed(seed)
    n, d = 7, model.cfg.head_dim
    x = torch.randn(2, n, model.cfg.d_model, generator=gen, dtype=torch.float64)
    e = torch.randn(2, model.cfg.kv_heads, n, d, generator=gen, dtype=torch.float64)
    phase = phase_of_block(d // 2, gen)
    pos = torch.arange(n).expand(2, n)
    x1, s1 = model.layers[0](x, PositionState(pos, pos, rot=e), None, None, 0)
    x2, s2 = model.layers[0](x, PositionState(pos, pos, rot=phase_rotate(e, phase)), None, None, 0)
    assert (s1.rot - e).abs().max() > 1e-3  # the layer did update E
    return torch.allclose(x1, x2, atol=1e-10, rtol=0) and torch.allclose(
        phase_rotate(s1.rot, phase), s2.rot, atol=1e-10, rtol=0)


def _common(blocks: int, gen: torch.Generator) -> torch.Tensor:
    return torch.full((blocks,), float(torch.rand((), generator=gen, dtype=torch.float64)) * 2 * math.pi,
                      dtype=torch.float64)


def _per_block(blocks: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(blocks, generator=gen, dtype=torch.float64) * 2 * math.pi


@pytest.mark.parametrize("switches", ABLATIONS, ids=IDS)
def test_every_ablation_at_init_equals_rope(switches):
    torch.manual_seed(0)
    rope = randomize(DecoderLM(tiny_config("rope", n_layers=3)))
    ablated = DecoderLM(tiny_config("tape", n_layers=3, **switches))
    missing, _ = ablated.load_state_dict(rope.state_dict(), strict=False)
    assert missing and all(".pe." in k for k in missing)
    ids = torch.randint(0, 37, (3, 20))
    pos = torch.arange(20).expand(3, 20) + 5
    assert (rope(ids, position_ids=pos).logits - ablated(ids, position_ids=pos).logits).abs().max() <= 1e-5


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("switches,common,per_block", [
    (dict(), True, True),  # TAPE: every phase rotation commutes (so a position shift is a no-op)
    (dict(tape_tensorial=False), True, False),  # shares c/s weights, mixes frequencies
    (dict(tape_equivariant=False), False, False),
    (dict(tape_equivariant=False, tape_tensorial=False), False, False),
], ids=["tape", *IDS])
def test_which_rotations_each_layer_commutes_with(switches, common, per_block, seed):
    assert _layer_commutes(switches, _common, seed) is common
    assert _layer_commutes(switches, _per_block, seed) is per_block


@pytest.mark.parametrize("switches", ABLATIONS, ids=IDS)
def test_only_tape_is_invariant_to_a_position_shift(switches):
    """A shift rotates each frequency by its own phase: with random weights every ablation's
    logits move, TAPE's do not (tests/test_tape.py)."""
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(12).expand(2, 12)
    for model, moves in ((tiny_model("tape", dtype=torch.float64, n_layers=3, **switches), True),
                         (tiny_model("tape", dtype=torch.float64, n_layers=3), False)):
        with torch.no_grad():
            shift = float((model(ids, position_ids=pos).logits - model(ids, position_ids=pos + 321).logits).abs().max())
        assert (shift > 1e-7) is moves, shift


def test_the_ablated_maps_have_the_documented_shapes():
    """He = 4 heads, d = 8, I = 16 (4 x heads): the PE-MLP reads He·d, d/2 or d features."""
    shapes = {}
    for name, switches in zip(IDS, ABLATIONS):
        layer = DecoderLM(tiny_config("tape", **switches)).layers[0].pe
        shapes[name] = (tuple(layer.post_attn.weight.shape), tuple(layer.w1.weight.shape),
                        tuple(layer.w2.weight.shape))
    assert shapes == {"no-eq": ((4, 4), (16, 32), (32, 16)), "vector": ((4, 4), (16, 4), (4, 16)),
                      "vector-no-eq": ((8, 8), (16, 8), (8, 16))}


@pytest.mark.parametrize("switches", ABLATIONS, ids=IDS)
def test_every_ablated_map_gets_a_gradient(switches):
    model = tiny_model("tape", n_layers=3, **switches).train()
    ids = torch.randint(0, 37, (2, 10))
    model(ids).logits.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if ".pe." in n}
    assert grads and all(g is not None and g.abs().max() > 0 for g in grads.values()), [
        n for n, g in grads.items() if g is None or not g.abs().max() > 0]


@pytest.mark.parametrize("switches", ABLATIONS, ids=IDS)
def test_ablated_cached_generation_matches_recomputation(switches):
    model = tiny_model("tape", n_layers=3, **switches)
    prompt = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(2))
    ids_c, logits_c = model.generate(prompt, max_new_tokens=6, return_logits=True)
    ids_f, logits_f = model.generate(prompt, max_new_tokens=6, use_cache=False, return_logits=True)
    assert torch.equal(ids_c, ids_f)
    assert torch.allclose(logits_c, logits_f, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("switches", ABLATIONS, ids=IDS)
def test_ablated_e_stays_float32_under_bf16_autocast(switches):
    model = tiny_model("tape", n_layers=3, **switches)
    seen = []
    layer = model.layers[0].pe
    after_mlp = layer.after_mlp
    layer.after_mlp = lambda state, m: seen.append(after_mlp(state, m).rot) or after_mlp(state, m)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 37, (2, 9)))
    assert seen and seen[0].dtype == torch.float32


@pytest.mark.parametrize("overrides,key", [
    (dict(tape_tensorial=False, n_kv_heads=2), "model.n_kv_heads=null"),
    (dict(tape_tensorial=False, tape_post_attn="rowsum"), "set tape_post_attn=mix"),
])
def test_bad_ablation_settings_name_the_fix(overrides, key):
    with pytest.raises(ConfigError, match=key):
        DecoderLM(tiny_config("tape", **overrides))
