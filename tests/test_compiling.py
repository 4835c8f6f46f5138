"""The guard around torch.compile (tape/model/compiling.py) for torch 2.11's CPU code bug."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

from tape.model import compiling


def test_only_a_cpu_under_an_affected_torch_is_guarded() -> None:
    assert compiling.cpu_vectorization_is_unsafe("cpu", "2.11.0+cu130")
    assert compiling.cpu_vectorization_is_unsafe("cpu", "2.12.1")
    assert not compiling.cpu_vectorization_is_unsafe("cpu", "2.13.0+cpu")
    assert not compiling.cpu_vectorization_is_unsafe("cuda", "2.11.0+cu130")  # Triton kernels there


@pytest.mark.parametrize("version, simdlen", [("2.11.0+cu130", 1), ("2.13.0", None)])
def test_compiling_on_an_affected_cpu_torch_turns_vectorisation_off(
        monkeypatch: pytest.MonkeyPatch, version: str, simdlen: int | None) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, mode: calls.append(mode) or model)
    model = torch.nn.Linear(2, 2)
    with inductor_config.patch({"cpp.simdlen": None}):  # restored on the way out
        if simdlen == 1:
            with pytest.warns(UserWarning, match="simdlen = 1"):
                assert compiling.compile_model(model, "reduce-overhead") is model
        else:
            assert compiling.compile_model(model) is model
        assert inductor_config.cpp.simdlen == simdlen and len(calls) == 1
