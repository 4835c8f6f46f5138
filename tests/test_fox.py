"""FoX (and its CABLE option): the bias is the cumulative sum of per-token log gates, reduces to
NoPE when every gate is 1, is non-positive and non-increasing in distance, continues from the KV
cache, and trains its gates. The generic properties run in tests/test_pe_properties.py."""

import pytest
import torch
import torch.nn.functional as F

import tape.pe
from model_helpers import tiny_config, tiny_model
from tape.errors import ConfigError
from tape.model import DecoderLM
from tape.pe.fox import FoXState, initial_gate_bias

GATES = ["fox", "cable"]


def layer_bias(model: DecoderLM, x: torch.Tensor, layer: int = 0, cache=None) -> torch.Tensor:
    pe = model.layers[layer].pe
    b, n, _ = x.shape
    pos = torch.arange(n).expand(b, n)
    state = pe.before_attention(model.pe.make_state(pos, pos, x.dtype), x, cache, layer)
    return pe.attn_bias(state)


@pytest.mark.parametrize("gate", GATES)
def test_bias_is_the_sum_of_log_gates_between_key_and_query(gate):
    model = tiny_model("fox", dtype=torch.float64, fox_gate=gate)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    bias = layer_bias(model, x)  # (B, H, N, N)
    lin = model.layers[0].pe.gate
    z = (x @ lin.weight.T + lin.bias).transpose(1, 2)  # (B, H, N)
    term = F.logsigmoid(z) if gate == "fox" else -F.softplus(z)
    for i in range(9):
        for j in range(i + 1):
            want = term[..., j + 1 : i + 1].sum(-1)
            assert torch.allclose(bias[..., i, j], want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("gate", GATES)
def test_bias_is_non_positive_and_non_increasing_in_distance(gate):
    model = tiny_model("fox", fox_gate=gate)
    bias = layer_bias(model, torch.randn(3, 17, 32))
    assert bias.dtype == torch.float32 and bias.shape == (3, 4, 17, 17)
    causal = torch.ones(17, 17, dtype=torch.bool).tril()
    assert (bias[..., causal] <= 0).all()
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    lower = bias.masked_fill(~causal, 0.0)
    # along a query row, moving the key one token further back never raises the bias
    step = lower[..., :, :-1] - lower[..., :, 1:]  # bias(i, j) - bias(i, j + 1)
    assert (step[..., causal[:, 1:]] <= 1e-6).all()


def test_every_gate_at_one_is_nope():
    nope = tiny_model("nope", dtype=torch.float64)
    fox = DecoderLM(tiny_config("fox")).to(torch.float64).eval()
    missing, unexpected = fox.load_state_dict(nope.state_dict(), strict=False)
    assert unexpected == [] and all(".pe." in k for k in missing)
    with torch.no_grad():
        for block in fox.layers:
            block.pe.gate.weight.zero_()
            block.pe.gate.bias.fill_(1e4)  # log sigmoid(1e4) == 0 exactly in float64
    ids = torch.randint(0, 37, (2, 14), generator=torch.Generator().manual_seed(7))
    assert torch.allclose(fox(ids).logits, nope(ids).logits, atol=1e-12, rtol=0)
    assert torch.equal(fox.generate(ids, max_new_tokens=6), nope.generate(ids, max_new_tokens=6))


def test_gates_matter():
    model = tiny_model("fox", dtype=torch.float64)
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(8))
    base = model(ids).logits
    with torch.no_grad():
        model.layers[0].pe.gate.bias.sub_(2.0)
    assert (model(ids).logits - base).abs().max() > 1e-3


@pytest.mark.parametrize("gate", GATES)
def test_cache_continues_the_cumulative_gates(gate):
    model = tiny_model("fox", dtype=torch.float64, fox_gate=gate)
    ids = torch.randint(0, 37, (2, 15), generator=torch.Generator().manual_seed(3))
    full = model(ids, use_cache=True).past_key_values
    out = model(ids[:, :4], use_cache=True)
    out = model(ids[:, 4:9], past_key_values=out.past_key_values, use_cache=True)
    for t in range(9, 15):
        out = model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
    for layer in range(model.cfg.n_layers):
        cum = out.past_key_values.pe_rows[layer]
        assert cum.shape == (2, 4, 15)
        assert torch.allclose(cum, full.pe_rows[layer], atol=1e-12, rtol=0)


@pytest.mark.parametrize("gate", GATES)
def test_cable_and_fox_generate_the_same_with_and_without_cache(gate):
    model = tiny_model("fox", fox_gate=gate, n_kv_heads=2)
    prompt = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(2))
    ids_c, logits_c = model.generate(prompt, max_new_tokens=8, return_logits=True)
    ids_f, logits_f = model.generate(prompt, max_new_tokens=8, use_cache=False, return_logits=True)
    assert torch.equal(ids_c, ids_f)
    assert torch.allclose(logits_c, logits_f, atol=1e-5, rtol=1e-4)


def test_cable_left_padding_parity():
    model = tiny_model("fox", dtype=torch.float64, fox_gate="cable")
    seqs = [torch.randint(1, 37, (n,), generator=torch.Generator().manual_seed(n)) for n in (8, 3)]
    batch = torch.zeros(2, 8, dtype=torch.long)
    mask = torch.zeros(2, 8, dtype=torch.long)
    for i, s in enumerate(seqs):
        batch[i, 8 - len(s):], mask[i, 8 - len(s):] = s, 1
    padded = model(batch, attention_mask=mask).logits
    for i, s in enumerate(seqs):
        assert torch.allclose(padded[i, 8 - len(s):], model(s[None]).logits[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize("gate", GATES)
def test_gradients_reach_the_gate_weights(gate):
    model = tiny_model("fox", fox_gate=gate).train()
    ids = torch.randint(0, 37, (2, 12))
    logits = model(ids).logits
    F.cross_entropy(logits[:, :-1].reshape(-1, 37), ids[:, 1:].reshape(-1)).backward()
    for block in model.layers:
        for p in (block.pe.gate.weight, block.pe.gate.bias):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_gates_and_bias_stay_float32_in_bf16_and_under_autocast():
    model = tiny_model("fox", dtype=torch.bfloat16)
    x = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    assert layer_bias(model, x).dtype == torch.float32
    model = tiny_model("fox")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer_bias(model, torch.randn(2, 7, 32)).dtype == torch.float32
        assert torch.isfinite(model(torch.randint(0, 37, (2, 7))).logits).all()


@pytest.mark.parametrize("gate", GATES)
def test_init_sets_log_spaced_decay_times(gate):
    model = DecoderLM(tiny_config("fox", fox_gate=gate, fox_decay_min=4.0, fox_decay_max=256.0))
    pe = model.layers[1].pe
    z = pe.gate.bias.double()
    term = F.logsigmoid(z) if gate == "fox" else -F.softplus(z)
    assert torch.allclose(-1 / term, torch.tensor([4.0, 16.0, 64.0, 256.0], dtype=torch.float64), rtol=1e-5)
    assert pe.gate.weight.std() < 0.1  # N(0, init_std): gates start near their bias, near 1
    assert torch.allclose(initial_gate_bias(3, 8.0, 8.0, "fox"), -initial_gate_bias(3, 8.0, 8.0, "cable"))


def test_attn_bias_without_before_attention_is_an_error():
    model = tiny_model("fox")
    pos = torch.arange(5).expand(1, 5)
    with pytest.raises(RuntimeError, match="before_attention"):
        model.layers[0].pe.attn_bias(model.pe.make_state(pos, pos, torch.float32))
    assert isinstance(model.pe.make_state(pos, pos, torch.float32), FoXState)


@pytest.mark.parametrize("options, message", [
    ({"fox_gate": "lstm"}, "fox_gate='lstm' must be one of"),
    ({"fox_decay_min": 0.0}, "decay times must satisfy"),
    ({"fox_decay_min": 64.0, "fox_decay_max": 8.0}, "decay times must satisfy"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ConfigError, match=message):
        tape.pe.check(tiny_config("fox", pe_options=options))
