"""Properties every positional encoding must have, checked on tiny random models:
causality, finite gradients, KV-cache parity, bf16, left-padding parity, shift invariance
(for the relative encodings) and checkpoint compatibility with RoPE."""

import pytest
import torch

import tape.pe
from model_helpers import ALL_PES, SHIFT_INVARIANT_PES, tiny_config, tiny_model
from tape.model import DecoderLM

POSITION_FREE_PES = {name for name in ALL_PES if not tape.pe.get(name).reads_positions}
SHAPES = [dict(), dict(n_kv_heads=2), dict(n_kv_heads=1, n_layers=3)]
SHAPE_IDS = ["mha", "gqa2", "mqa-3layers"]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("pe", ALL_PES)
def test_causality(pe, shape):
    model = tiny_model(pe, dtype=torch.float64, **shape)
    ids = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 5) % 37
    a, b = model(ids).logits, model(changed).logits
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-12, rtol=0)
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-3  # later logits do see the change


@pytest.mark.parametrize("pe", ALL_PES)
def test_finite_gradients_reach_every_parameter(pe):
    model = tiny_model(pe, n_kv_heads=2).train()
    ids = torch.randint(0, 37, (3, 16))
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 37), ids[:, 1:].reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("shape", SHAPES[:2], ids=SHAPE_IDS[:2])
@pytest.mark.parametrize("pe", ALL_PES)
def test_cached_generation_matches_recomputation(pe, shape):
    model = tiny_model(pe, **shape)
    prompt = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(2))
    ids_c, logits_c = model.generate(prompt, max_new_tokens=9, return_logits=True)
    ids_f, logits_f = model.generate(prompt, max_new_tokens=9, use_cache=False, return_logits=True)
    assert torch.equal(ids_c, ids_f)
    assert torch.allclose(logits_c, logits_f, atol=1e-5, rtol=1e-4)
    # and the cached step logits equal one full forward over the generated sequence
    full = model(ids_c[:, :-1]).logits[:, prompt.shape[1] - 1 :]
    assert torch.allclose(logits_c, full, atol=1e-5, rtol=1e-4)


def test_cached_fire_generation_in_its_absolute_regime_matches_a_full_forward() -> None:
    """FIRE with a small ``fire_init_L`` reads absolute positions: generation must count them
    from 0 as the full forward does (positions off by one show only here)."""
    model = tiny_model("fire", dtype=torch.float64, max_seq_len=64, fire_init_L=4.0)
    prompt = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(2))
    ids_c, logits_c = model.generate(prompt, max_new_tokens=9, return_logits=True)
    full = model(ids_c[:, :-1]).logits[:, prompt.shape[1] - 1 :]
    assert torch.allclose(logits_c, full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("pe", ALL_PES)
def test_chunked_prefill_with_cache(pe):
    """Feeding a sequence in chunks through the cache equals one full forward."""
    model = tiny_model(pe, dtype=torch.float64, n_kv_heads=2)
    ids = torch.randint(0, 37, (2, 15), generator=torch.Generator().manual_seed(3))
    full = model(ids).logits
    out = model(ids[:, :6], use_cache=True)
    mid = model(ids[:, 6:11], past_key_values=out.past_key_values, use_cache=True)
    last = model(ids[:, 11:], past_key_values=mid.past_key_values, use_cache=True)
    chunked = torch.cat([out.logits, mid.logits, last.logits], dim=1)
    assert torch.allclose(full, chunked, atol=1e-10, rtol=0)


@pytest.mark.parametrize("pe", ALL_PES)
def test_bf16_forward(pe):
    model = tiny_model(pe, dtype=torch.bfloat16)
    logits = model(torch.randint(0, 37, (2, 20))).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    ref = tiny_model(pe, dtype=torch.float32)(torch.randint(0, 37, (2, 20))).logits
    assert ref.shape == logits.shape


@pytest.mark.parametrize("pe", ALL_PES)
def test_attention_biases_stay_float32_under_autocast(pe):
    """LayerPE.attn_bias promises float32: under bf16 autocast FIRE's MLP ran in bf16 (173
    distinct bias values over 4,096 keys instead of 4,096)."""
    cfg = tiny_config(pe)
    encoding = tape.pe.build(cfg)
    layer = encoding.make_layer(0)
    layer.init_weights(cfg.init_std)
    pos = torch.arange(24).expand(2, 24)
    state = encoding.make_state(pos, pos, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        state = layer.before_attention(state, torch.randn(2, 24, cfg.d_model), None, 0)  # FoX's gates
        bias = layer.attn_bias(state)
    assert bias is None or bias.dtype == torch.float32


def test_fire_bias_is_finite_when_c_reaches_zero():
    encoding = tape.pe.build(tiny_config("fire"))
    layer = encoding.make_layer(0)
    with torch.no_grad():
        layer.c.zero_()
    pos = torch.arange(8).expand(1, 8)
    assert torch.isfinite(layer.attn_bias(encoding.make_state(pos, pos, torch.float32))).all()


@pytest.mark.parametrize("pe", ALL_PES)
def test_left_padding_parity(pe):
    """Each sequence of a left-padded batch gives the logits and generations of its own run."""
    model = tiny_model(pe, dtype=torch.float64, n_kv_heads=2)
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(1, 37, (n,), generator=gen) for n in (9, 5, 7)]
    width = max(len(s) for s in seqs)
    batch = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        batch[i, width - len(s):] = s
        mask[i, width - len(s):] = 1
    padded = model(batch, attention_mask=mask).logits
    generated = model.generate(batch, max_new_tokens=5, attention_mask=mask)
    for i, s in enumerate(seqs):
        alone = model(s[None]).logits[0]
        assert torch.allclose(padded[i, width - len(s):], alone, atol=1e-10, rtol=0)
        alone_gen = model.generate(s[None], max_new_tokens=5)[0, len(s):]
        assert torch.equal(generated[i, width:], alone_gen)


@pytest.mark.parametrize("pe", SHIFT_INVARIANT_PES)
def test_relative_encodings_are_shift_invariant(pe):
    model = tiny_model(pe, dtype=torch.float64)
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(12).expand(2, 12)
    base = model(ids, position_ids=pos).logits
    for offset in (1, 37, 1000):
        shifted = model(ids, position_ids=pos + offset).logits
        assert (base - shifted).abs().max() < 1e-9, offset
    if pe not in POSITION_FREE_PES:  # positions matter: stretching them changes the output
        assert (base - model(ids, position_ids=pos * 3).logits).abs().max() > 1e-3


@pytest.mark.parametrize("pe", ALL_PES)
def test_rope_checkpoint_loads_with_only_pe_parameters_missing(pe):
    rope = DecoderLM(tiny_config("rope"))
    other = DecoderLM(tiny_config(pe))
    missing, unexpected = other.load_state_dict(rope.state_dict(), strict=False)
    assert unexpected == []
    assert all(".pe." in key for key in missing), missing
    own = {k for k in other.state_dict() if ".pe." in k}
    assert set(missing) == own


def test_randpe_positions_random_in_training_contiguous_in_eval():
    model = tiny_model("randpe", randpe_max_position=200)
    ids = torch.randint(0, 37, (4, 16))
    pos = torch.arange(16).expand(4, 16)
    model.train()
    state = model.pe.make_state(pos, pos, torch.float32)
    p = state.query_pos
    assert p.shape == (4, 16) and (p.diff(dim=-1) > 0).all() and (p >= 0).all() and (p < 200).all()
    assert not torch.equal(p[0], p[1]) or not torch.equal(p[0], torch.arange(16))
    model.eval()
    assert torch.equal(model.pe.make_state(pos, pos, torch.float32).query_pos, pos)
    assert torch.equal(model(ids).logits, model(ids).logits)  # deterministic at evaluation


@pytest.mark.parametrize("name", ALL_PES)
def test_every_encoding_compiles_to_one_graph(name: str) -> None:
    """compile=true traces the model whole: no graph break in forward or backward (torch 2.11's
    dynamo broke TAPE's E update at an is_autocast_available call). Dynamo only (backend eager)."""
    import torch._dynamo as dynamo

    ids = torch.randint(0, 37, (2, 17), generator=torch.Generator().manual_seed(0))
    model = tiny_model(name).train()
    dynamo.reset()
    logits = torch.compile(model, backend="eager", fullgraph=True)(ids).logits  # a break raises
    logits.square().mean().backward()
    eager = tiny_model(name).train()
    torch.testing.assert_close(logits, eager(ids).logits)


def test_a_padded_cache_refuses_a_later_call_without_its_mask():
    """Positions of a call without attention_mask would count padding as tokens: refused, and
    the cache keeps working once the mask is passed."""
    model = tiny_model("tape", dtype=torch.float64)
    batch = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = (batch != 0).long()
    out = model(batch, attention_mask=mask, use_cache=True)
    cache, nxt = out.past_key_values, torch.tensor([[11], [12]])
    with pytest.raises(ValueError, match="attention_mask of shape \\(batch, cached \\+ new tokens\\) = \\(2, 5\\)"):
        model(nxt, past_key_values=cache)
    assert cache.length == 4  # nothing appended by the refused call
    step = model(nxt, attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1),
                 past_key_values=cache).logits[:, -1]
    full = model(torch.cat([batch, nxt], 1), attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1))
    assert torch.allclose(step, full.logits[:, -1], atol=1e-10, rtol=0)
    unpadded = model(batch[1:], use_cache=True).past_key_values
    model(nxt[1:], past_key_values=unpadded)  # a cache without padding needs no mask
