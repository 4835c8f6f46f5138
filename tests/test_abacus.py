"""Abacus digit index embeddings (tape/model/abacus.py): the indices on written sums, the training
offset (training only, per example, from torch's RNG), cached decoding equal to uncached, paired
initial weights with and without Abacus, the config errors, and a TAPE + Abacus smoke run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.errors import PipelineConfigError
from pipelines.train import train
from tape.data.addition import DIGIT_IDS, EOS, VOCAB_SIZE, AdditionExample, encode
from tape.metrics.arithmetic import DigitsThenEos
from tape.model import ConfigError, DecoderLM, ModelConfig
from tape.model.abacus import AbacusEmbedding, digit_indices
from tape.model.generate import greedy_generate
from tape.model.pairing import pair_initial_weights

DIGITS = torch.tensor(DIGIT_IDS)


def small(pe: str = "rope", **kw) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB_SIZE, n_layers=2, d_model=32, n_heads=4, max_seq_len=64,
                       pe=pe, abacus=True, abacus_digit_ids=list(DIGIT_IDS), **kw)


def indices_of(text: str) -> list[int]:
    return digit_indices(torch.tensor([encode(text)]), DIGITS)[0].tolist()


def test_the_addition_task_gives_its_digits_to_abacus() -> None:
    from conftest import compose_config

    cfg = compose_config("config", ["experiment=addition_c1/smoke", "model.abacus=true"])
    assert tuple(cfg.model.abacus_digit_ids) == DIGIT_IDS  # conf/task/addition.yaml digit_ids
    other = compose_config("config", ["experiment=flipflop/smoke"])
    assert other.model.abacus_digit_ids is None  # a task without digits gives none


def test_indices_on_written_sums() -> None:
    assert indices_of("123+45=168") == [1, 2, 3, 0, 1, 2, 0, 1, 2, 3]
    assert indices_of("9+9=81") == [1, 0, 1, 0, 1, 2]
    assert indices_of("+=") == [0, 0]
    ids = torch.tensor([[2, 4, 5, 3, 0, 13]])  # BOS 0 1 EOS PAD 9: specials break a run
    assert digit_indices(ids, DIGITS)[0].tolist() == [0, 1, 2, 0, 0, 1]


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 10**14), b=st.integers(0, 10**14))
def test_indices_count_significance_in_reversed_sums(a: int, b: int) -> None:
    ex = AdditionExample(a, b)
    ids = torch.tensor([ex.token_ids()])  # reversed a, '+', reversed b, '=', reversed sum, EOS
    idx = digit_indices(ids, DIGITS)[0].tolist()
    c = a + b
    runs = [len(str(a)), len(str(b)), len(str(c))]
    assert idx == sum(([*range(1, n + 1), 0] for n in runs), [])
    # index i holds the digit of weight 10^(i-1) of its number: the units share index 1
    digits = [int(ch) for ch in ex.prompt + ex.answer if ch.isdigit()]
    numbers = [a] * runs[0] + [b] * runs[1] + [c] * runs[2]
    weights = [i for i in idx if i > 0]
    assert digits == [(n // 10 ** (i - 1)) % 10 for n, i in zip(numbers, weights)]


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.sampled_from([4, 7, 13, 14, 17, 3, 0]), min_size=1, max_size=30),
       cuts=st.lists(st.integers(1, 29), max_size=4))
def test_indices_continue_across_cached_calls(tokens: list[int], cuts: list[int]) -> None:
    ids = torch.tensor([tokens, tokens[::-1]])
    bounds = sorted({c for c in cuts if c < len(tokens)})
    pieces, run = [], None
    for lo, hi in zip([0, *bounds], [*bounds, len(tokens)]):
        part = digit_indices(ids[:, lo:hi], DIGITS, run)
        run = part[:, -1]
        pieces.append(part)
    assert torch.equal(torch.cat(pieces, dim=1), digit_indices(ids, DIGITS))


def test_offset_only_in_training_per_example_and_from_torch_rng() -> None:
    cfg = small(abacus_max_offset=6, abacus_max_index=24)
    emb = AbacusEmbedding(cfg)
    ids = torch.tensor([encode("123+45=168")] * 400)
    plain = digit_indices(ids, DIGITS)
    emb.eval()
    assert torch.equal(emb.indices(ids), plain)
    emb.train()
    torch.manual_seed(5)
    shifted = emb.indices(ids)
    shift = shifted - plain
    assert torch.equal(shift[plain == 0], torch.zeros_like(shift[plain == 0]))  # non-digits stay 0
    per_example = shift[:, :1]  # the first token is a digit
    assert torch.equal(shift, per_example.expand_as(shift) * (plain > 0))  # one k per example
    assert set(per_example.flatten().tolist()) == set(range(7))  # k in [0, 6], every value drawn
    torch.manual_seed(5)
    assert torch.equal(emb.indices(ids), shifted)  # reseeding replays it (exact resume)


def test_training_offset_changes_the_model_only_in_training() -> None:
    torch.manual_seed(0)
    model = DecoderLM(small("tape", abacus_max_offset=8))
    ids = torch.tensor([encode("1234+56=")] * 3)
    model.eval()
    with torch.no_grad():
        a, b = model(ids).logits, model(ids).logits
        model.train()
        torch.manual_seed(1)
        c = model(ids).logits
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("pe", ["rope", "tape", "nope"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cached_decoding_equals_uncached(pe: str, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    model = DecoderLM(small(pe)).to(dtype)
    prompts = torch.tensor([encode("9876+54="), encode("1+99999=")])
    outs = [greedy_generate(model, prompts, 9, eos_token_id=EOS, use_cache=cache, return_logits=True,
                            choose=DigitsThenEos(8)) for cache in (True, False)]
    (ids_c, logits_c), (ids_u, logits_u) = outs
    assert torch.equal(ids_c, ids_u)
    assert (ids_c[:, 8:12] != EOS).all()  # the answers are digit runs (indices 1.. across calls)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    assert torch.allclose(logits_c, logits_u, atol=tol), (logits_c - logits_u).abs().max()


def test_cached_forward_in_chunks_equals_one_forward() -> None:
    torch.manual_seed(4)
    model = DecoderLM(small("tape")).eval()
    ids = torch.tensor([encode("12345+678=13024")])
    with torch.no_grad():
        whole = model(ids).logits
        cache, parts = None, []
        for lo, hi in ((0, 3), (3, 4), (4, 12), (12, 15)):  # cuts inside digit runs
            out = model(ids[:, lo:hi], past_key_values=cache, use_cache=True)
            cache, parts = out.past_key_values, parts + [out.logits]
    assert torch.allclose(torch.cat(parts, dim=1), whole, atol=1e-5)


def test_abacus_is_paired_and_changes_the_function() -> None:
    on, off = DecoderLM(small("rope")), DecoderLM(small("rope").replace(abacus=False))
    pair_initial_weights(on, 7), pair_initial_weights(off, 7)
    shared = dict(off.named_parameters())
    for name, param in on.named_parameters():
        if name.startswith("abacus."):
            continue
        assert torch.equal(param, shared[name]), name  # same seed, same shared weights
    assert set(dict(on.named_parameters())) - set(shared) == {"abacus.table.weight"}
    ids = torch.tensor([encode("12+34=")])
    on.eval(), off.eval()
    with torch.no_grad():
        assert not torch.allclose(on(ids).logits, off(ids).logits)
        assert torch.equal(on(ids[:, 2:3]).logits, off(ids[:, 2:3]).logits)  # '+' alone: no digit
    tape = DecoderLM(small("tape"))
    pair_initial_weights(tape, 7)
    with torch.no_grad():  # TAPE + Abacus starts as RoPE + Abacus: the pair differs in the PE alone
        assert torch.allclose(tape.eval()(ids).logits, on(ids).logits, atol=1e-5)


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="abacus_max_offset=32 leaves no room in abacus_max_index=32"):
        small(abacus_max_offset=32)
    with pytest.raises(ConfigError, match="abacus_max_index=0 must be >= 1"):
        small(abacus_max_index=0)
    with pytest.raises(ConfigError, match="abacus_max_offset=-1 must be >= 0"):
        small(abacus_max_offset=-1)
    with pytest.raises(ConfigError, match=r"abacus_digit_ids=\[4, 12\] must be token ids .* out of range: \[12\]"):
        ModelConfig(vocab_size=10, n_layers=1, d_model=16, n_heads=2, abacus=True, abacus_digit_ids=[4, 12])
    with pytest.raises(ConfigError, match=r"abacus_digit_ids is empty but abacus=true: set it"):
        ModelConfig(vocab_size=10, n_layers=1, d_model=16, n_heads=2, abacus=True)
    ModelConfig(vocab_size=10, n_layers=1, d_model=16, n_heads=2, abacus=False)  # off: not checked
    model = DecoderLM(small(abacus_max_index=4, abacus_max_offset=0)).eval()
    with pytest.raises(ValueError, match=r"Abacus index 5 \(a run of 5 digits\) exceeds abacus_max_index=4; set model.abacus_max_index>=5"):
        model(torch.tensor([encode("12345+1=")]))
    model = DecoderLM(small(abacus_max_index=6, abacus_max_offset=5)).train()
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"a digit run plus a training offset of up to 5\) exceeds abacus_max_index=6"):
        model(torch.tensor([encode("12345+1=")] * 50))


def test_task_refuses_digits_beyond_the_index_table(make_cfg) -> None:
    too_long = make_cfg("experiment=addition_c1/smoke", "model.abacus=true", "task.eval_max_digits=20")
    with pytest.raises(PipelineConfigError, match=r"task.eval_max_digits=20 .* Abacus index 21 > "
                       r"model.abacus_max_index=16; set model.abacus_max_index>=21"):
        train(too_long)
    assert not Path(too_long.paths.output_dir).exists()  # refused before anything was written
    with pytest.raises(PipelineConfigError, match=r"task.max_digits=3 .* \+ model.abacus_max_offset=13: "
                       r"Abacus index 17 > model.abacus_max_index=16"):
        train(make_cfg("experiment=addition_c1/smoke", "model.abacus=true", "model.abacus_max_offset=13"))
    from pipelines.tasks.addition import validate

    validate(make_cfg("experiment=addition_c1/smoke", "model.abacus=false", "task.eval_max_digits=20"))


def test_smoke_run_tape_with_abacus(make_cfg) -> None:
    cfg = make_cfg("experiment=addition_c1/smoke", "pe=tape", "model.abacus=true")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["experiment"] == "addition_c1/smoke" and saved["pe"] == "tape"
    for key in ("ood_accuracy", "ood_digit_accuracy", "in_distribution_digit_accuracy"):
        assert 0.0 <= saved[key] <= 100.0 and saved[key] == metrics[key]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["abacus"] is True and config["model"]["abacus_max_offset"] == 4
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["state_dict"]["model.abacus.table.weight"].shape == (16, cfg.model.d_model)
    assert state["hyper_parameters"]["model"]["abacus_digit_ids"] == list(DIGIT_IDS)
    # a checkpoint from before the task gave the digits (null ids) loads with the addition digits
    from pipelines.run_source import open_run

    state["hyper_parameters"]["model"]["abacus_digit_ids"] = None
    torch.save(state, run / "checkpoints" / "last.ckpt")
    source = open_run(run)
    assert source.model_config().digit_token_ids == list(DIGIT_IDS)
    model, _ = source.load_model("cpu")
    assert model.abacus.digit_ids.tolist() == list(DIGIT_IDS)


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_c1_presets_fit_their_index_table(scale: str) -> None:
    from conftest import compose_config
    from pipelines.tasks.addition import validate

    cfg = compose_config("config", [f"experiment=addition_c1/{scale}", "logger=none", "model.abacus=true"])
    validate(cfg)  # training answers + offset and test answers fit model.abacus_max_index
    t, m = cfg.task, cfg.model
    assert cfg.experiment_name == f"addition_c1/{scale}" and m.abacus_max_offset > 0
    # the offset lets training answers reach every index the test answers use
    assert t.max_digits + 1 + m.abacus_max_offset >= t.eval_max_digits + 1
    if scale == "cpu":  # the sizing: 4 layers, d_model 128, 3000 steps, <= 5 / 10 x 10
        assert (cfg.model.n_layers, cfg.model.d_model, cfg.trainer.max_steps, cfg.optim.lr) == (4, 128, 2000, 3e-4)
        assert (t.max_digits, t.eval_max_digits, t.examples_per_cell) == (5, 10, 100)
        assert cfg.model.abacus_max_offset == 10
