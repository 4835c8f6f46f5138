"""The training-step profile (tape/bench/step_profile.py) on CPU at a tiny shape."""

from __future__ import annotations

import json

import pytest

from tape.bench import step_profile


def test_busy_time_is_the_union_of_kernel_intervals() -> None:
    assert step_profile._busy_us([(0, 10), (5, 12), (20, 25)]) == 17  # overlap counted once, gap not
    assert step_profile._busy_us([(3, 4)]) == 1 and step_profile._busy_us([]) == 0


def test_profiler_annotations_are_not_counted_as_kernels() -> None:
    """torch >= 2.2 reports ``Optimizer.step#AdamW.step`` as a CUDA event spanning the whole
    optimizer step (host gaps included): it is no kernel."""
    from types import SimpleNamespace

    import torch

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(device_type=cuda, is_user_annotation=False, name="gemm"),
              SimpleNamespace(device_type=cuda, is_user_annotation=True, name="Optimizer.step#AdamW.step"),
              SimpleNamespace(device_type=cpu, is_user_annotation=False, name="aten::mm")]
    assert [e.name for e in step_profile.device_kernels(events)] == ["gemm"]


def test_a_cpu_profile_counts_operators_and_tapes_extra_work(capsys: pytest.CaptureFixture) -> None:
    assert step_profile.main(["--device", "cpu", "--batches", "1,2", "--seq-len", "16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 * len(step_profile.VARIANTS)  # a line after each variant: a cut run keeps them
    first = json.loads(lines[0])
    assert set(first["batch_1"]) == {"rope"} and "batch_2" not in first
    out = json.loads(lines[-1])
    assert out["device"] == "cpu" and set(out) == {"device", "seq_len", "compiled", "batch_1", "batch_2"}
    for batch in ("batch_1", "batch_2"):
        rows = out[batch]
        assert set(rows) == set(step_profile.VARIANTS)
        assert all(row["wall_ms"] > 0 for row in rows.values())
        # TAPE's per-layer maps dispatch more operators than RoPE's rotation alone
        assert rows["tape_fused"]["ops_per_step"] > rows["rope"]["ops_per_step"] > 0
        assert rows["tape_fused"]["ops_per_step_vs_rope"] == pytest.approx(
            rows["tape_fused"]["ops_per_step"] / rows["rope"]["ops_per_step"])


def test_compile_runs_every_model_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wiring only: inductor takes over a minute per model on a CPU (the GPU check compiles for real)."""
    import torch

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, mode: compiled.append((type(model).__name__, mode)) or model)
    out = step_profile.step_profile("cpu", [1], 8, warmup=1, timed=1, profiled=1, compile_model=True)
    assert out["compiled"] is True and out["compile_mode"] == "default" and compiled == [("DecoderLM", "default")] * 2
    assert set(out["batch_1"]) == set(step_profile.COMPILED_VARIANTS) == {"rope", "tape_fused"}


def test_compile_mode_reaches_torch_compile_and_cuda_graphs_only_on_cuda(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--compile-mode implies --compile and is passed to torch.compile; a CPU step never marks a
    CUDA graph step (CUDA graphs replay CUDA launches only)."""
    import torch

    from tape.bench.train_step import TrainStep
    from tape.model import ModelConfig

    compiled, marks = [], []
    monkeypatch.setattr(torch, "compile", lambda model, mode: compiled.append(mode) or model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    assert step_profile.main(["--device", "cpu", "--batches", "1", "--seq-len", "8",
                              "--compile-mode", "reduce-overhead"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["compiled"] is True and out["compile_mode"] == "reduce-overhead"
    assert compiled == ["reduce-overhead"] * 2 and marks == []
    assert all(row["cudagraph_skips"] == 0 for row in out["batch_1"].values())  # recorded: a skip only warns
    cfg = ModelConfig(**step_profile.TINY_SHAPE)
    step = TrainStep(cfg, 1, 8, torch.device("cpu"), compile_model=True, compile_mode="reduce-overhead")
    step.cuda_graphs = True  # as on CUDA: every step starts a new graph generation
    step()
    step()
    assert marks == [1, 1]
    with pytest.raises(SystemExit):
        step_profile.main(["--compile-mode", "fastest"])


def test_device_ops_count_kernels_not_views_or_allocations() -> None:
    import torch

    from tape.bench.dispatch_count import device_ops

    x = torch.randn(4, 6)
    ops = device_ops(lambda: (x.t().reshape(24)[4:] * 2).view(4, -1).sum())
    assert ops == {"clone": 1, "mul": 1, "sum": 1}  # flattening the transposed copies; views do not


def test_a_triton_launch_counts_once_whatever_the_interpreter_dispatches() -> None:
    from model_helpers import triton_interpreter_problem

    if triton_interpreter_problem():
        pytest.skip(triton_interpreter_problem())
    import torch

    from tape.bench.dispatch_count import device_ops
    from tape.kernels.triton_attention import attention_forward

    q, k, v, e = (torch.randn(1, 2, 16, 16) for _ in range(4))
    ops = device_ops(lambda: attention_forward(q, k, v, e))
    assert ops["triton:_fwd"] == 1 and "copy_" not in ops  # the interpreter's copies are its own


def test_variants_and_layers_reach_the_profile(capsys: pytest.CaptureFixture) -> None:
    """--variants picks the models (rope first; tape_unfused here), --layers the depth, --bf16
    autocast; TAPE's operators grow faster with the layers than RoPE's (the E updates; at 2
    layers, one updating E, TAPE's joined rotation may dispatch fewer than RoPE's)."""
    counts = {}
    for layers in (2, 4):
        assert step_profile.main(["--device", "cpu", "--batches", "1", "--seq-len", "8", "--bf16",
                                  "--layers", str(layers), "--variants", "rope,tape_unfused"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["autocast"] == "bfloat16" and set(out["batch_1"]) == {"rope", "tape_unfused"}
        rows = out["batch_1"]
        counts[layers] = rows["tape_unfused"]["ops_per_step"] - rows["rope"]["ops_per_step"]
    assert counts[4] > counts[2]
    with pytest.raises(ValueError, match="start with rope"):
        step_profile.step_profile("cpu", [1], 8, labels=["tape_unfused", "rope"])
