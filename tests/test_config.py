"""ModelConfig and the encodings reject what cannot work, naming the field and the fix."""

import pytest

from model_helpers import config
from tape.model import ConfigError, DecoderLM, ModelConfig
import tape.pe


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        (dict(pe="sinusoid"), ["pe='sinusoid'", "choose one of", "rope"]),
        (dict(d_model=30, n_heads=4), ["d_model=30", "n_heads=4", "multiple"]),
        (dict(d_model=36, n_heads=4, pe="rope"), ["head dim", "odd", "even"]),
        (dict(d_model=36, n_heads=4, pe="tape"), ["head dim", "odd", "even"]),
        (dict(n_heads=4, n_kv_heads=3), ["n_kv_heads=3", "divisor"]),
        (dict(pe="tape", tape_post_attn="sum"), ["tape_post_attn", "'mix'"]),
        (dict(pe="tape", pe_options=dict(tape_post_atn="mix")), ["'tape_post_atn'", "did you mean 'tape_post_attn'"]),
        (dict(attn_backend="cuda"), ["attn_backend", "'sdpa'"]),
        (dict(pe="randpe", randpe_max_position=8, max_seq_len=32), ["randpe_max_position=8", "max_seq_len"]),
        (dict(pe="rope", rope_theta="abc"), ["rope_theta='abc' (str) is not one of: float (pe='rope')"]),
        (dict(pe="tape", rope_theta=-5), ["rope_theta=-5 must be > 0"]),
        (dict(pe="xpos", rope_theta=0.0), ["rope_theta=0.0 must be > 0"]),
        (dict(pe="tape", rope_yarn_factor=2.0), ["rope_yarn_factor=2.0 needs rope_yarn_original_length",
                                                 "pe.rope_yarn_original_length=1024"]),
        (dict(pe="rope", rope_yarn_factor=0.5), ["rope_yarn_factor=0.5 must be >= 1"]),
        (dict(pe="rope", rope_yarn_factor=2.0, rope_yarn_original_length=64, rope_scaling=2.0),
         ["YaRN replaces linear interpolation; set rope_scaling=1"]),
        (dict(pe="prope", rope_yarn_original_length=0), ["rope_yarn_original_length=0 must be a positive"]),
        (dict(pe="tape", tape_attn_update=1), ["tape_attn_update=1 (int) is not one of: bool"]),
        (dict(pe="tape", tape_position_size=2.5), ["tape_position_size=2.5 (float) is not one of: int, null"]),
        (dict(pe="tape", tape_fused="yes"), ["tape_fused='yes'", "bool, 'two_calls', 'concat', 'padded', null"]),
        (dict(pe="cope", cope_npos="8"), ["cope_npos='8' (str) is not one of: int, null"]),
        (dict(abacus="no"), ["abacus='no' (str) is not one of: bool"]),  # was taken as true
        (dict(d_model="abc"), ["d_model='abc' (str) is not one of: int"]),  # was int()'s traceback
        (dict(n_kv_heads=1.5), ["n_kv_heads=1.5 (float) is not one of: int, null"]),
    ],
)
def test_bad_config_names_field_and_fix(kwargs, fragments):
    values = dict(vocab_size=16, n_layers=1, d_model=32, n_heads=4)
    values.update(kwargs)
    with pytest.raises(ConfigError) as err:
        DecoderLM(config(**values))
    for fragment in fragments:
        assert fragment in str(err.value)


def test_odd_head_dim_is_fine_without_rotation():
    cfg = ModelConfig(vocab_size=16, n_layers=1, d_model=36, n_heads=4, pe="alibi")
    assert cfg.head_dim == 9
    DecoderLM(cfg)


def test_all_problems_reported_at_once():
    """Sizes are ModelConfig's to check, options the encoding's: each reports all of its own."""
    with pytest.raises(ConfigError) as err:
        ModelConfig(vocab_size=16, n_layers=1, d_model=30, n_heads=4, n_kv_heads=3, pe="nope-ish")
    assert "n_kv_heads=3" in str(err.value) and "d_model=30" in str(err.value)
    with pytest.raises(ConfigError) as err:
        tape.pe.check(config(vocab_size=16, n_layers=1, d_model=32, n_heads=4, pe="tape",
                             tape_post_attn="sum", tape_zero_init="w3"))
    assert "tape_post_attn='sum'" in str(err.value) and "tape_zero_init='w3'" in str(err.value)


def test_old_flat_layout_loads_through_legacy_options():
    old = {**ModelConfig(vocab_size=16, n_layers=1, d_model=32, n_heads=4, max_seq_len=32).to_dict(), "pe": "randpe",
           "rope_theta": 500.0, "tape_post_attn": "mix", "randpe_max_position": 64}
    del old["pe_options"]
    with pytest.raises(ConfigError, match="legacy_options"):
        ModelConfig.from_dict(old)
    cfg = ModelConfig.from_dict(tape.pe.legacy_options(old))
    assert cfg.pe_options == {"rope_theta": 500.0, "randpe_max_position": 64}
    DecoderLM(cfg)


def test_from_groups_ignores_other_encodings_presets_but_not_typos():
    model = dict(vocab_size=16, n_layers=1, d_model=32, n_heads=4, randpe_max_position=64)
    rope = ModelConfig.from_groups(model, {"name": "rope", "rope_theta": 10.0}, tape.pe.option_names())
    assert rope.pe_options == {"rope_theta": 10.0}
    randpe = ModelConfig.from_groups(model, {"name": "randpe", "randpe_max_position": None},
                                     tape.pe.option_names())
    assert randpe.pe_options == {"randpe_max_position": 64}
    with pytest.raises(ConfigError, match="n_layer"):
        ModelConfig.from_groups({**model, "n_layer": 2}, {"name": "rope"}, tape.pe.option_names())


def test_from_dict_round_trip_and_unknown_field():
    cfg = ModelConfig(vocab_size=16, n_layers=1, d_model=32, n_heads=4, pe="tape")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown ModelConfig field"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_layer": 3})


def test_paper_155m_parameter_counts():
    """RoPE 155M = 162,417,408 params = 154.89 * 2^20 (tape-spec A.4). TAPE adds 38,160 a layer
    except the last, whose E updates would never be read (the official code keeps them: +457,920)."""
    import torch

    with torch.device("meta"):
        rope = DecoderLM(ModelConfig(pe="rope"))
        tape_model = DecoderLM(ModelConfig(pe="tape"))
    assert rope.num_parameters() == 162_417_408
    assert tape_model.num_parameters() - rope.num_parameters() == 11 * 38_160
