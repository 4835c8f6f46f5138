"""ModelConfig rejects what cannot work, naming the field and the fix."""

import pytest

from tape.model import ConfigError, DecoderLM, ModelConfig
import tape.pe


def test_registry_has_the_eight_encodings():
    assert tape.pe.names() == ["alibi", "fire", "nope", "prope", "randpe", "rope", "t5", "tape", "xpos"]


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        (dict(pe="sinusoid"), ["pe='sinusoid'", "choose one of", "rope"]),
        (dict(d_model=30, n_heads=4), ["d_model=30", "n_heads=4", "multiple"]),
        (dict(d_model=36, n_heads=4, pe="rope"), ["head dim", "odd", "even"]),
        (dict(d_model=36, n_heads=4, pe="tape"), ["head dim", "odd", "even"]),
        (dict(n_heads=4, n_kv_heads=3), ["n_kv_heads=3", "divisor"]),
        (dict(tape_post_attn="sum"), ["tape_post_attn", "'mix'"]),
        (dict(attn_backend="cuda"), ["attn_backend", "'sdpa'"]),
        (dict(randpe_max_position=8, max_seq_len=32), ["randpe_max_position=8", "max_seq_len"]),
    ],
)
def test_bad_config_names_field_and_fix(kwargs, fragments):
    values = dict(vocab_size=16, n_layers=1, d_model=32, n_heads=4)
    values.update(kwargs)
    with pytest.raises(ConfigError) as err:
        ModelConfig(**values)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_odd_head_dim_is_fine_without_rotation():
    cfg = ModelConfig(vocab_size=16, n_layers=1, d_model=36, n_heads=4, pe="alibi")
    assert cfg.head_dim == 9
    DecoderLM(cfg)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as err:
        ModelConfig(vocab_size=16, n_layers=1, d_model=30, n_heads=4, pe="nope-ish")
    assert "pe='nope-ish'" in str(err.value) and "d_model=30" in str(err.value)


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
