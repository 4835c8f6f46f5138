"""CausalLMModule's per-step work: the masked loss and validation metrics without boolean
indexing (which waits for the GPU every step), the batch index kept on the host, and the
tokens-per-second callback reading the device once per log interval."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from host_syncs import HostSyncs
from tape.data.labels import IGNORE_INDEX
from tape.lightning import CausalLMModule
from tape.lightning.callbacks import TokensPerSecond

V = 18


def module() -> CausalLMModule:
    return CausalLMModule(dict(vocab_size=V, n_layers=1, d_model=32, n_heads=2, max_seq_len=16, pe="tape"))


def batch(seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (6, 12), generator=gen)
    labels = ids.clone()
    labels[:, :7] = IGNORE_INDEX  # the prompt is not scored
    labels[0, 7:] = IGNORE_INDEX  # a row with nothing scored
    return {"input_ids": ids.to(device), "labels": labels.to(device), "batch_index": torch.tensor(3)}


def test_loss_and_metrics_equal_the_masked_selection() -> None:
    m = module().eval()
    b = batch()
    logits, targets, mask = m._scored(b)
    assert logits.shape == (6, 11, V) and mask.sum() == 5 * 5
    picked_logits, picked_targets = logits[mask], targets[mask]  # what the step used to compute
    logged: dict[str, torch.Tensor] = {}
    m.log = lambda name, value, **_: logged.__setitem__(name, value)  # type: ignore[method-assign]
    expected = F.cross_entropy(picked_logits.float(), picked_targets)
    torch.testing.assert_close(m.training_step(b, 0), expected)  # a batch outside a Trainer: its own step
    torch.testing.assert_close(logged.pop("train/loss"), expected)
    m.on_validation_epoch_start()
    m.validation_step(b, 0)
    right = picked_logits.argmax(-1) == picked_targets
    assert m._val_sums[1].item() == right.sum().item() and m._val_sums[2].item() == 25
    per_row = torch.ones_like(mask).masked_scatter(mask, right).all(dim=1).float().mean()
    assert logged["val/exact_match"].item() == pytest.approx(per_row.item())


def test_validation_loss_and_token_accuracy_pool_the_scored_tokens() -> None:
    """Through Lightning's validate: batches scoring 25, 5 and 0 tokens give the token means
    over all of them, not the mean of the batch means (a batch scoring nothing adds nothing)."""
    import lightning as L

    m = module().eval()
    batches = [batch(0), batch(1), batch(2)]
    batches[1]["labels"][2:] = IGNORE_INDEX  # row 1 only: 5 scored tokens
    batches[2]["labels"][:] = IGNORE_INDEX  # none
    nll, hits, tokens = 0.0, 0, 0
    with torch.no_grad():
        for b in batches:
            logits, targets, mask = m._scored(b)
            nll += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
            hits += int(((logits.argmax(-1) == targets) & mask).sum())
            tokens += int(mask.sum())
    assert tokens == 30
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    (got,) = trainer.validate(m, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)
    assert got["val/loss"] == pytest.approx(nll / tokens, rel=1e-5)
    assert got["val/token_accuracy"] == pytest.approx(hits / tokens)


def test_the_batch_index_stays_on_the_host() -> None:
    moved = module().on_before_batch_transfer(batch(), 0)
    assert moved["batch_index"] == 3 and type(moved["batch_index"]) is int


def test_each_batch_index_reseeds_its_own_randomness() -> None:
    """``_reseed`` draws from (seed, rank, batch index): the same index replays the same draws
    (exact resume), another index draws anew (RandPE's positions change from step to step)."""
    m = module()
    draws = {}
    for index in (3, 4, 3):
        m._reseed(index)
        draws.setdefault(index, []).append(torch.rand(8))
    torch.testing.assert_close(draws[3][0], draws[3][1], rtol=0, atol=0)
    assert not torch.equal(draws[3][0], draws[4][0])
    randpe = CausalLMModule(dict(vocab_size=V, n_layers=1, d_model=32, n_heads=2, max_seq_len=16, pe="randpe")).train()
    randpe.log = lambda *a, **k: None  # type: ignore[method-assign]
    losses = {}
    with torch.no_grad():
        for index in (3, 4, 3):
            step = {**batch(), "batch_index": torch.tensor(index)}
            losses.setdefault(index, []).append(randpe.training_step(step, 0))
    torch.testing.assert_close(losses[3][0], losses[3][1], rtol=0, atol=0)
    assert not torch.equal(losses[3][0], losses[4][0])


def test_tokens_per_second_counts_on_the_device_and_reads_once_per_log() -> None:
    callback = TokensPerSecond(pad_id=0)
    trainer = SimpleNamespace(log_every_n_steps=2, world_size=1)
    logged: list[float] = []
    pl_module = SimpleNamespace(log=lambda name, value, **_: logged.append(value))
    ids = torch.tensor([[0, 5, 6], [7, 8, 0]])  # 4 non-padding tokens
    callback.on_train_batch_start(trainer, pl_module, {"input_ids": ids}, 0)
    callback.on_train_batch_end(trainer, pl_module, None, {"input_ids": ids}, 0)
    assert isinstance(callback._tokens, torch.Tensor) and not logged  # no read-back between logs
    callback.on_train_batch_end(trainer, pl_module, None, {"input_ids": ids}, 1)
    assert len(logged) == 1 and logged[0] > 0 and callback._tokens == 0


@pytest.mark.cuda
def test_a_training_step_never_waits_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two layers: TAPE's last layer carries no E and goes to SDPA, so one layer never reached
    the Triton kernel this step is meant to cover."""
    import tape.model.attention as attention

    used: list[str] = []
    dispatch = attention._dispatch
    monkeypatch.setattr(attention, "_dispatch", lambda plan, *a: used.append(plan.backend) or dispatch(plan, *a))
    m = CausalLMModule(dict(vocab_size=V, n_layers=2, d_model=32, n_heads=2, max_seq_len=16, pe="tape")).cuda().train()
    b = m.on_before_batch_transfer(batch(device="cuda"), 0)
    m.log = lambda *a, **k: None  # type: ignore[method-assign]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = m.training_step(b, 0)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert "triton" in used, used


def test_compiled_training_steps_match_eager_and_validation_stays_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_model=True trains through torch.compile (here its aot_eager backend: the captured
    graph with eager kernels, seconds instead of inductor's minutes) and evaluates eagerly."""
    real_compile, compiled = torch.compile, []

    def spy(model: torch.nn.Module, mode: str = "default") -> torch.nn.Module:
        compiled.append(model)
        return real_compile(model, backend="aot_eager")

    monkeypatch.setattr(torch, "compile", spy)
    torch._dynamo.reset()
    eager = CausalLMModule(dict(vocab_size=V, n_layers=2, d_model=32, n_heads=2, max_seq_len=16, pe="tape")).train()
    with torch.no_grad():  # TAPE's maps start at zero: give them values so every E path matters
        for name, p in eager.named_parameters():
            if ".pe." in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    fast = CausalLMModule(eager.hparams["model"], compile_model=True).train()
    fast.load_state_dict(eager.state_dict())
    for m in (eager, fast):
        m.log = lambda *a, **k: None  # type: ignore[method-assign]
    b = eager.on_before_batch_transfer(batch(), 0)
    losses = [m.training_step(b, 0) for m in (eager, fast)]
    for loss in losses:
        loss.backward()
    assert compiled == [fast.model]  # built once, at the first training step
    torch.testing.assert_close(losses[1], losses[0])
    for p_fast, p_eager in zip(fast.parameters(), eager.parameters()):
        torch.testing.assert_close(p_fast.grad, p_eager.grad)
    assert set(fast.state_dict()) == set(eager.state_dict())  # no compiled wrapper in checkpoints
    fast.eval()
    assert fast._model_for_step() is fast.model  # validation and evaluation run eagerly


def test_the_loss_asks_nothing_that_would_wait_for_the_gpu() -> None:
    """Issue 21.7: ``logits[mask]`` made every step wait for the GPU to count the mask. Ops whose
    output shape or value must come back to the host, recorded on CPU at the dispatcher."""
    m = module().train()
    m.log = lambda *a, **k: None  # type: ignore[method-assign]
    b = m.on_before_batch_transfer(batch(), 0)
    with HostSyncs() as syncs:
        m.training_step(b, 0).backward()
    assert syncs.found == []


def test_training_batches_are_pinned_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from tape.data.addition import AdditionStream
    from tape.lightning.datamodule import loader

    stream = AdditionStream(seed=0, max_digits=3, batch_size=2)
    assert not loader(stream).pin_memory  # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert loader(stream).pin_memory


def test_scored_targets_counts_the_predicted_positions() -> None:
    """A batch's scored targets are labels 1..N-1 (position t predicts t + 1), not 0..N-2."""
    from tape.lightning.datamodule import scored_targets

    labels = batch()["labels"]
    assert int((labels[:, 1:] != IGNORE_INDEX).sum()) != int((labels[:, :-1] != IGNORE_INDEX).sum())
    assert scored_targets(labels) == int((labels[:, 1:] != IGNORE_INDEX).sum()) == 25


def test_a_loader_batch_trains_on_the_mean_nll_of_its_scored_targets() -> None:
    """Through the training loader (``step_scored`` set by StepWindows), the returned and the
    logged loss are the cross entropy over the scored positions, not a sum over a wrong count."""
    from tape.lightning.datamodule import loader

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):  # noqa: ANN204
            yield batch()

    (b,) = list(loader(Batches()))
    m = module().eval()
    logged: dict[str, torch.Tensor] = {}
    m.log = lambda name, value, **_: logged.__setitem__(name, value)  # type: ignore[method-assign]
    with torch.no_grad():
        logits, targets, mask = m._scored(b)
        expected = F.cross_entropy(logits[mask].float(), targets[mask])
        loss = m.training_step(b, 0)
    assert int(b["step_scored"]) == int(mask.sum()) == 25
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logged["train/loss"], expected)


def test_accumulated_batches_train_as_one_large_batch() -> None:
    """Two accumulated halves scoring 10 and 15 targets give the gradient and the logged
    train/loss of the whole batch (a mean of the halves' means would weigh the 10 like the 15)."""
    import lightning as L
    from torch.utils.data import IterableDataset

    from tape.lightning.datamodule import loader

    class Batches(IterableDataset):
        def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
            super().__init__()
            self.batches = batches

        def __iter__(self):  # noqa: ANN204
            yield from self.batches

    class Data(L.LightningDataModule):
        def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
            super().__init__()
            self.batches = batches

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            return loader(Batches(self.batches), self.trainer)

    class Grads(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:  # noqa: ANN001
            self.grads = [p.grad.clone() for p in pl_module.parameters()]

    whole = batch(0)
    halves = [{k: v[rows] if v.dim() else torch.tensor(i) for k, v in whole.items()}
              for i, rows in enumerate((slice(0, 3), slice(3, 6)))]
    assert [int((h["labels"][:, 1:] != IGNORE_INDEX).sum()) for h in halves] == [10, 15]
    results = []
    for batches, accumulate in (([whole], 1), (halves, 2)):
        torch.manual_seed(0)
        m, grads = module(), Grads()
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, accumulate_grad_batches=accumulate,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, limit_val_batches=0, callbacks=[grads])
        trainer.fit(m, datamodule=Data(batches))
        results.append((grads.grads, float(trainer.callback_metrics["train/loss"])))
    (big, big_loss), (accumulated, accumulated_loss) = results
    assert accumulated_loss == pytest.approx(big_loss, rel=1e-6)
    for a, b in zip(accumulated, big):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
