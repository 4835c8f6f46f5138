"""Training of the context-extension stages through Lightning: bf16-mixed autocast trains every
trainable tensor of every recipe, FSDP wraps and steps with the preset's policy, a sharded
model's full weights come back through the checkpoint path."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

pytest.importorskip("transformers")
from conftest import compose_config  # noqa: E402
from pipelines.tasks.context_extension.stages import set_dtypes  # noqa: E402
from tape.hf.io import build_llama, load_model, save_model  # noqa: E402
from tape.hf.recipes import apply_recipe  # noqa: E402
from tape.lightning import HFCausalLMModule, IndexedBatchDataModule  # noqa: E402
from tape.lightning.distributed import trained_model  # noqa: E402

V, N = 64, 32
NAMED = {  # the presets' named recipes (conf/task/context_extension.yaml)
    "tape": ("tape", {"train_post_attn": False, "tape_options": {"post_attn": "rowsum"}}),
    "tape_mix": ("tape", {"train_post_attn": True, "tape_options": {"post_attn": "mix"}}),
    "lora": ("lora", {}),
    "longlora": ("longlora", {"s2attn_groups": 2}),
    "theta": ("theta", {}),
}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A tiny pretrained-looking base Llama saved as the recipe stage loads it."""
    path = tmp_path_factory.mktemp("base") / "base"
    model = build_llama(V, 32, 48, 2, 2, 2, context=16, seed=0)
    with torch.no_grad():  # norms away from 1 and weights away from init, as after pretraining
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model(model, path, {})
    return path


def build(base_dir: Path, name: str, frozen: torch.dtype, midway: bool = False) -> torch.nn.Module:
    """The recipe stage's model: loaded in the frozen dtype, recipe applied, trainables fp32.
    ``midway``: the zero-initialised maps (TAPE's W1 and post map, LoRA's B) are moved off zero,
    as some steps into training; at exactly zero they pass (almost) no gradient to the maps
    behind them, which is the recipe's design, not a precision effect."""
    recipe, options = NAMED[name]
    model = load_model(base_dir, frozen)
    torch.manual_seed(0)
    model = apply_recipe(model, recipe, target_context=N, original_context=16, **options)
    if midway:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.requires_grad and not p.any():
                    p.normal_(0.0, 0.02)
    return set_dtypes(model.train(), frozen)


def batches(index: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(index)
    ids = torch.randint(0, V, (4, N), generator=g)  # 128 tokens: nearly every row of the 64-row vocab
    return {"input_ids": ids, "labels": ids.clone(), "passkey": torch.zeros(4, dtype=torch.bool)}


def fit(model: torch.nn.Module, steps: int, lr: float, precision: str, root: Path) -> L.Trainer:
    module = HFCausalLMModule(model, stage="t", lr=lr, betas=(0.9, 0.999), weight_decay=0.0,
                              warmup_steps=0, schedule="constant", total_steps=steps)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, max_steps=steps,
                        gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                        limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=IndexedBatchDataModule(batches))
    return trainer


@pytest.mark.parametrize("name", list(NAMED))
def test_bf16_mixed_five_steps_at_lr_2e5_change_every_trainable_tensor(tmp_path, base_dir, name):
    """The audit's failure: bf16 weights under AdamW at lr 2e-5 kept norms, embeddings and TAPE's
    maps frozen. With fp32 trainables under bf16 autocast every trainable tensor moves, while
    the frozen weights stay bf16 and untouched."""
    model = build(base_dir, name, torch.bfloat16, midway=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    kinds = {"norm": False, "embed": False, "lora_A": False, "lora_B": False}
    fit(model, steps=5, lr=2e-5, precision="bf16-mixed", root=tmp_path)
    for n, p in model.named_parameters():
        if n in trainable:
            assert p.dtype == torch.float32, n
            changed = (p.detach() != before[n]).float().mean().item()
            # bf16 weights moved 0 %. TAPE's gate x_proj gets its gradient through W2·W1 (~0.02
            # each here): Adam's steps are ~1e-7 there, and the smallest round away (96 % moved
            # under torch 2.13, 84 % under torch 2.11's bf16 CPU kernels).
            floor = 0.75 if n.endswith("x_proj.weight") else 0.9
            assert changed > floor, f"{name}: only {changed:.0%} of {n} changed"
            for k in kinds:
                kinds[k] |= k in n
        else:
            assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), before[n]), n
    assert kinds["norm"] and kinds["embed"]
    if name.startswith("tape"):
        names = " ".join(trainable)
        assert all(f".pe.{m}.weight" in names for m in ("x_proj", "w1", "w2"))
        assert (".post_attn." in names) == (name == "tape_mix")  # the official variant freezes it
    else:
        assert kinds["lora_A"] and kinds["lora_B"]


@pytest.mark.parametrize("recipe", ["lora", "tape"])
def test_training_forward_keeps_no_kv_cache(base_dir, recipe):
    """A Llama's forward keeps a KV cache by default (4 GB at 7B and 8k tokens in fp16); the
    training forward asks for none."""
    module = HFCausalLMModule(build(base_dir, recipe, torch.float32))
    calls = []
    layer_model = module.model.get_base_model() if hasattr(module.model, "get_base_model") else module.model
    hook = layer_model.model.register_forward_hook(lambda m, args, kwargs, out: calls.append(out), with_kwargs=True)
    try:
        module(torch.randint(0, 50, (2, 16)))
    finally:
        hook.remove()
    assert len(calls) == 1 and calls[0].past_key_values is None


def test_low_precision_trainable_weights_are_refused(base_dir):
    model = build(base_dir, "lora", torch.float32)
    next(p for p in model.parameters() if p.requires_grad).data = torch.zeros(1, dtype=torch.bfloat16)
    module = HFCausalLMModule(model)
    with pytest.raises(ValueError, match="must be float32.*autocast"):
        module.configure_optimizers()


def test_fsdp_preset_wraps_decoder_blocks_and_steps(base_dir):
    """trainer=fsdp's policy, instantiated from the preset, wraps every HF decoder layer and every
    block of our decoder (one process, gloo: Lightning runs FSDP on GPUs only); one optimizer
    step changes the trainable weights, and the full state dict has every original key."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from tape.hf.llama import TapeDecoderLayer

    from tape.model import DecoderLM, ModelConfig
    from tape.model.decoder import Block

    strategy = instantiate(compose_config("config", ["trainer=fsdp"]).trainer.strategy)
    policy = strategy.kwargs["auto_wrap_policy"]
    assert callable(policy.__call__) and not isinstance(policy, (list, tuple))
    from lightning.pytorch.plugins.precision import FSDPPrecision

    strategy.precision_plugin = FSDPPrecision("bf16-mixed")  # as the Trainer sets it from the preset
    precision = strategy.mixed_precision_config  # what Lightning hands FSDP under trainer=fsdp
    assert (precision.param_dtype, precision.reduce_dtype, precision.buffer_dtype) == (torch.float32,) * 3
    store = tempfile.mktemp()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        ours = DecoderLM(ModelConfig(vocab_size=V, n_layers=3, d_model=32, n_heads=2, max_seq_len=N, pe="tape"))
        tape_llama, lora_llama = build(base_dir, "tape_mix", torch.float32), build(base_dir, "lora", torch.float32)
        for model, layer_type, n_layers in ((ours, Block, 3), (tape_llama, TapeDecoderLayer, 2),
                                            (lora_llama, LlamaDecoderLayer, 2)):
            keys = set(model.state_dict())
            wrapped = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"),
                           mixed_precision=precision)
            units = [m for m in wrapped.modules() if isinstance(m, FSDP)]
            assert len(units) == n_layers + 1  # one per block, plus the root
            assert all(isinstance(u.module, layer_type) for u in units[1:])
            params = [p for p in wrapped.parameters() if p.requires_grad]
            before = [p.detach().clone() for p in params]
            opt = torch.optim.AdamW(params, lr=1e-3)
            ids = batches(0)["input_ids"]
            with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16-mixed: autocast, as on GPU
                logits = wrapped(ids).logits if model is ours else wrapped(input_ids=ids).logits
            torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V).float(), ids[:, 1:].reshape(-1)).backward()
            assert {p.dtype for p in wrapped.parameters()} == {torch.float32}
            assert {b.dtype for b in wrapped.buffers() if b.is_floating_point()} <= {torch.float32}
            if model is not ours:  # HF Llama's rotary frequencies: bf16 would put radians of error at 8k
                assert any("inv_freq" in n for n, _ in wrapped.named_buffers())
            clip_under(strategy, wrapped, opt, 1e-3, None if model is ours else HFCausalLMModule)
            opt.step()
            assert all(not torch.equal(b, p.detach()) for b, p in zip(before, params) if p.grad is not None)
            assert sum(p.grad is not None for p in params) > 0.9 * len(params)
            cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
            with FSDP.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT, cfg):
                assert set(wrapped.state_dict()) == keys  # evaluation gets every full weight
    finally:
        dist.destroy_process_group()


def clip_under(strategy, wrapped, optimizer, value: float, module_class=None) -> None:
    """Norm clipping as Lightning asks a module for it under trainer=fsdp (the FSDP precision
    plugin, which refuses norm clipping, in place): FSDP's root module clips over every shard.
    ``module_class``: the Lightning module that trains this model (default CausalLMModule)."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import FSDPPrecision

    from tape.lightning import CausalLMModule

    module_class = module_class or CausalLMModule
    strategy.model = wrapped
    module = module_class.__new__(module_class)
    L.LightningModule.__init__(module)
    module._trainer = SimpleNamespace(strategy=strategy, precision_plugin=FSDPPrecision("bf16-mixed"),
                                      gradient_clip_val=None, gradient_clip_algorithm=None)
    module.configure_gradient_clipping(optimizer, gradient_clip_val=value, gradient_clip_algorithm="norm")
    grads = [p.grad for p in wrapped.parameters() if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= value * 1.0001


def test_full_weights_through_the_checkpoint_path_equal_the_trained_module(tmp_path, base_dir):
    """The path sharded strategies take after training (gather into a checkpoint, load into a
    rebuilt model) gives exactly the trained weights."""
    model = build(base_dir, "tape_mix", torch.float32)
    trainer = fit(model, steps=2, lr=1e-3, precision="32-true", root=tmp_path)
    module = trainer.lightning_module
    full = trained_model(trainer, module, lambda: build(base_dir, "tape_mix", torch.float32), tmp_path / "full.ckpt",
                         through_checkpoint=True)
    assert full is not module.model
    trained = module.model.state_dict()
    for k, v in full.state_dict().items():
        assert torch.equal(v, trained[k]), k


def _random_tape_llama() -> torch.nn.Module:
    """A 2-layer grouped-query TAPE Llama whose TAPE maps are random (E moves), seeded."""
    from tape.hf.llama import add_tape

    model = add_tape(build_llama(V, 32, 64, 2, 4, 2, N, seed=0))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".pe." in name:
                p.normal_(0, 0.1)
    return model


def _sharded_tape_llama(rank: int, world: int, store: str, out: str) -> None:
    """One process of a 2-process FSDP (gloo, FULL_SHARD, the trainer=fsdp wrap policy) run of a
    TAPE Llama with random TAPE maps: its logits and gradient norm, saved by rank 0."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model = _random_tape_llama()
        policy = instantiate(compose_config("config", ["trainer=fsdp"]).trainer.strategy.auto_wrap_policy)
        wrapped = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))
        ids = batches(0)["input_ids"]
        logits = wrapped(input_ids=ids).logits
        logits.float().square().mean().backward()
        norm = wrapped.clip_grad_norm_(1e9)
        if rank == 0:
            torch.save({"logits": logits.detach(), "norm": norm}, out)
    finally:
        dist.destroy_process_group()


def test_a_tape_llama_trains_sharded_over_two_processes(tmp_path):
    """TapeLlamaModel called the parts of each decoder layer (an FSDP unit) directly, so with
    weights sharded over two processes the TAPE recipe failed in its first step."""
    import torch.multiprocessing as mp

    out = tmp_path / "sharded.pt"
    mp.spawn(_sharded_tape_llama, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    model = _random_tape_llama()
    ids = batches(0)["input_ids"]
    logits = model(input_ids=ids).logits
    logits.float().square().mean().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    sharded = torch.load(out)
    torch.testing.assert_close(sharded["logits"], logits.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sharded["norm"], norm, atol=1e-5, rtol=1e-5)


def test_a_resumed_stage_keeps_its_training_curve_from_step_one(tmp_path, base_dir):
    """A stage stopped after step 2 and resumed from that step's checkpoint logs the same curve
    points (steps, losses, lr) as one that ran through (the curve goes into stage.json)."""
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    class StopAfter(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 2:
                raise KeyboardInterrupt  # Lightning ends the fit as a Ctrl-C

    def run(root: Path, stop: bool = False, ckpt: Path | None = None) -> HFCausalLMModule:
        module = HFCausalLMModule(build(base_dir, "lora", torch.float32), stage="t", lr=1e-3, warmup_steps=1,
                                  schedule="cosine", total_steps=4, log_every=1)
        callbacks = [ModelCheckpoint(dirpath=root / "ck", save_last=True, save_top_k=0, every_n_train_steps=1)]
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=root, limit_val_batches=0,
                            num_sanity_val_steps=0, callbacks=callbacks + ([StopAfter()] if stop else []))
        with pytest.raises(SystemExit) if stop else contextlib.nullcontext():
            trainer.fit(module, datamodule=IndexedBatchDataModule(batches), ckpt_path=ckpt)
        return module

    through = run(tmp_path / "a")
    run(tmp_path / "b", stop=True)
    resumed = run(tmp_path / "c", ckpt=tmp_path / "b" / "ck" / "last.ckpt")
    assert [p["step"] for p in through.history] == [1, 2, 3, 4]
    assert len(resumed.history) == 4
    for got, want in zip(resumed.history, through.history):
        assert got.keys() == want.keys() and got == pytest.approx(want)


def test_the_logged_losses_are_the_steps_mean_over_its_accumulated_batches(base_dir, tmp_path):
    """Lightning logs a step's last micro-batch only: the curve showed 1/A of each step's data."""
    module = HFCausalLMModule(build(base_dir, "lora", torch.float32), stage="t", lr=1e-3, total_steps=1)
    seen: list[float] = []
    step = module.training_step

    def spy(batch, batch_idx):  # noqa: ANN001, ANN202
        loss = step(batch, batch_idx)
        seen.append(float(loss))
        return loss

    module.training_step = spy  # type: ignore[method-assign]
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, accumulate_grad_batches=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=IndexedBatchDataModule(batches))
    assert len(seen) == 3 and len(set(seen)) == 3
    assert float(trainer.callback_metrics["t/loss"]) == pytest.approx(sum(seen) / 3, rel=1e-6)
    assert float(trainer.callback_metrics["t/loss_text"]) == pytest.approx(sum(seen) / 3, rel=1e-6)
    assert module.history[-1]["loss"] == pytest.approx(sum(seen) / 3, rel=1e-6)
