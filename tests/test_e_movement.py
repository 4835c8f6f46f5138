"""E movement (tape/metrics/e_movement.py): zero at TAPE's identity init, positive and
attributed to the right update once a map is non-zero, and the model's forward is untouched."""

import pytest
import torch

from tape.metrics.e_movement import e_movement
from tape.model import DecoderLM, ModelConfig
from tape.pe.tape import TAPELayer


def _model(**pe_options) -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, n_layers=3, d_model=32, n_heads=4, pe="tape", max_seq_len=24,
                      pe_options=pe_options)
    return DecoderLM(cfg)


def _ids() -> torch.Tensor:
    return torch.randint(0, 32, (2, 24), generator=torch.Generator().manual_seed(1))


def test_identity_at_init_means_no_movement():
    out = e_movement(_model(), _ids())
    assert set(out) >= {"e_move_layer1", "e_move_layer2", "e_move_last", "e_update_attn_mean",
                        "e_update_mlp_mean"}
    assert all(v == 0.0 for v in out.values()), out


@pytest.mark.parametrize("which", ["attn", "mlp"])
def test_movement_is_attributed_to_the_update_that_made_it(which):
    model = _model()
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, TAPELayer) and layer.post_attn is not None:
                if which == "attn":
                    layer.post_attn.weight.normal_(0, 0.5)
                else:
                    layer.w1.weight.normal_(0, 0.5)
                    layer.w2.weight.normal_(0, 0.5)
    ids = _ids()
    before = model(input_ids=ids).logits
    out = e_movement(model, ids)
    other = "mlp" if which == "attn" else "attn"
    assert out[f"e_update_{which}_mean"] > 1e-6
    assert out[f"e_update_{other}_mean"] == 0.0
    assert out["e_move_layer2"] > 0.0
    # the hooks are restored: the same forward, no instance attributes left behind
    assert torch.equal(model(input_ids=ids).logits, before)
    assert not any("rotate" in vars(m) for m in model.modules() if isinstance(m, TAPELayer))


def test_not_tape_gives_nothing():
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=32, n_layers=2, d_model=32, n_heads=4, pe="rope",
                                  max_seq_len=16))
    assert e_movement(model, _ids()[:, :16]) == {}


def test_ablation_without_attention_update_reports_zero_attention_share():
    model = _model(tape_attn_update=False)
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, TAPELayer) and layer.x_proj is not None:
                layer.w1.weight.normal_(0, 0.5)
    out = e_movement(model, _ids())
    assert out["e_update_attn_mean"] == 0.0 and out["e_update_mlp_mean"] > 0.0


def test_the_one_attention_update_of_two_layers_is_the_whole_movement():
    """Two layers, the MLP update off: only layer 0 updates E (the last layer's E is never read),
    so its attention share is the whole movement, not that over the layer count."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, n_layers=2, d_model=32, n_heads=4, pe="tape", max_seq_len=24,
                      pe_options=dict(tape_mlp_update=False))
    model = DecoderLM(cfg)
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, TAPELayer) and layer.post_attn is not None:
                layer.post_attn.weight.normal_(0, 0.5)
    out = e_movement(model, _ids())
    assert out["e_move_last"] == out["e_move_layer1"] > 1e-6
    assert out["e_update_mlp_mean"] == 0.0
    assert out["e_update_attn_mean"] == pytest.approx(out["e_move_layer1"], rel=1e-9)


@pytest.mark.parametrize("switches", [dict(tape_equivariant=False), dict(tape_tensorial=False)],
                         ids=["no-eq", "vector"])
def test_table6_ablations_report_both_shares_of_their_e_update(switches):
    """An ablated layer measures its attention and MLP updates apart, as TAPE's does."""
    model = _model(**switches)
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, TAPELayer) and layer.x_proj is not None:
                layer.post_attn.weight.normal_(0, 0.5)
                layer.w1.weight.normal_(0, 0.5)
    out = e_movement(model, _ids())
    assert out["e_update_attn_mean"] > 0.0 and out["e_update_mlp_mean"] > 0.0
