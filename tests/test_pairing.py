"""Paired seeds: one seed gives every PE the same shared initial weights and the same data order,
so TAPE and RoPE with one seed are the same function at step 0 (DESIGN.md "Evidence")."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipelines import tasks
from pipelines.train import build_module
from tape.model import DecoderLM
from tape.model.pairing import pair_initial_weights, reference_model

PES = ("rope", "tape", "alibi", "fire")


def shared(model: DecoderLM) -> dict[str, torch.Tensor]:
    """The parameters that are not a PE's own (names without '.pe.')."""
    return {k: v.detach().clone() for k, v in model.named_parameters() if ".pe." not in k}


def built(make_cfg, pe: str, seed: int, *extra: str) -> DecoderLM:
    torch.manual_seed(1234 + seed)  # whatever the global RNG holds must not matter
    return build_module(make_cfg(f"pe={pe}", f"seed={seed}", *extra)).model


@pytest.mark.parametrize("seed", [0, 3])
def test_same_seed_same_shared_weights_for_every_pe(make_cfg, seed: int) -> None:
    models = {pe: built(make_cfg, pe, seed) for pe in PES}
    rope = shared(models["rope"])
    for pe, model in models.items():
        mine = shared(model)
        assert mine.keys() == rope.keys(), pe
        for name in rope:
            assert torch.equal(mine[name], rope[name]), (pe, name)
    # RoPE's model is the reference itself: RoPE runs are what an unpaired RoPE run gave
    plain = reference_model(models["rope"].cfg, seed)
    for name, param in plain.named_parameters():
        assert torch.equal(param, dict(models["rope"].named_parameters())[name])


def test_tape_equals_rope_at_step_zero(make_cfg) -> None:
    rope, tape = built(make_cfg, "rope", 2), built(make_cfg, "tape", 2)
    ids = torch.randint(0, rope.cfg.vocab_size, (3, 12))
    with torch.no_grad():
        a, b = rope(ids).logits, tape(ids).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert not torch.equal(built(make_cfg, "tape", 3)(ids).logits, b)  # a seed is a real choice


def test_different_seeds_differ_and_the_hook_is_what_pairs(make_cfg) -> None:
    s0, s1 = shared(built(make_cfg, "tape", 0)), shared(built(make_cfg, "tape", 1))
    assert all(not torch.equal(s0[k], s1[k]) for k in s0 if "norm" not in k)
    # without pairing, TAPE draws its own weights between the shared ones: they no longer match
    torch.manual_seed(0)
    rope = shared(build_module(make_cfg("pe=rope", "paired_init=false")).model)
    torch.manual_seed(0)
    tape = shared(build_module(make_cfg("pe=tape", "paired_init=false")).model)
    assert any(not torch.equal(rope[k], tape[k]) for k in rope)


def test_pe_own_weights_are_kept() -> None:
    from tape.model import ModelConfig

    cfg = ModelConfig(vocab_size=16, n_layers=2, d_model=32, n_heads=2, pe="fire", max_seq_len=32)
    torch.manual_seed(5)
    model = DecoderLM(cfg)
    before = {k: v.clone() for k, v in model.named_parameters() if ".pe." in k}
    copied = pair_initial_weights(model, seed=0)
    assert copied and not any(".pe." in k for k in copied)
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters() if ".pe." in k)


@pytest.mark.parametrize("experiment", ["addition/smoke", "flipflop/smoke"])
def test_data_order_is_the_same_for_every_pe(make_cfg, experiment: str) -> None:
    def batches(pe: str, seed: int) -> list[dict[str, torch.Tensor]]:
        cfg = make_cfg(f"experiment={experiment}", f"pe={pe}", f"seed={seed}")
        dm = tasks.get(cfg.task.name).datamodule(cfg)
        return list(itertools.islice(iter(dm.train_dataloader()), 3))

    ref = batches("rope", 0)
    for pe in ("tape", "alibi"):
        for a, b in zip(ref, batches(pe, 0)):
            assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(ref[0]["input_ids"], batches("rope", 1)[0]["input_ids"])
