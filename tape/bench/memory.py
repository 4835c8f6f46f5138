"""Memory measures. CPU has no allocator statistics in torch, so on CPU we report
(1) the bytes autograd saves for backward during the forward pass (activation memory: exact,
deterministic, parameters and autocast's copies of them excluded), and (2) the peak RSS of a
fresh process during one training step above its RSS just before it. On CUDA we report
torch.cuda.max_memory_allocated during one training step above what was allocated before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from tape.bench.timing import synchronize
from tape.model.recompute import observing_saves


def _identity(t: Tensor) -> Tensor:
    return t


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves while ``fn`` runs, without ``exclude``
    (weights) and their copies (autocast's half-precision casts of them, their transposes).

    Views and expanded tensors share a storage and are counted once; the result of ``fn`` is
    dropped afterwards, so its graph is freed.
    """
    return sum(nbytes for _, nbytes in _saved_storages(fn, exclude).values())


def saved_tensors_by_shape(fn: Callable[[], Any], exclude: Iterable[Tensor] = ()) -> dict[str, dict[str, int]]:
    """``saved_tensor_bytes`` broken down: "shape dtype" of the first tensor saved on each distinct
    storage -> {"count", "bytes"} (largest first), to see which tensors make a memory gap."""
    groups: dict[str, dict[str, int]] = {}
    for name, nbytes in _saved_storages(fn, exclude).values():
        g = groups.setdefault(name, {"count": 0, "bytes": 0})
        g["count"] += 1
        g["bytes"] += nbytes
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]["bytes"]))


WEIGHT_COPIES = frozenset({"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
                           "ViewBackward0", "ExpandBackward0", "UnsafeViewBackward0"})
"""Autograd nodes between a saved tensor and a weight it merely recasts or reshapes."""


def _copy_of(t: Tensor, leaves: set[int]) -> bool:
    """Whether ``t`` is one of ``leaves`` cast or reshaped (autocast's bf16 copy of a weight)."""
    node = t.grad_fn
    while node is not None and type(node).__name__ in WEIGHT_COPIES:
        node = node.next_functions[0][0] if node.next_functions else None
        if node is not None and type(node).__name__ == "AccumulateGrad":
            return id(node.variable) in leaves
    return False


def _saved_storages(fn: Callable[[], Any], exclude: Iterable[Tensor]) -> dict[int, tuple[str, int]]:
    """Storage address -> ("shape dtype" of the first tensor saved on it, its bytes) of what
    autograd saves while ``fn`` runs, ``exclude`` and their copies left out."""
    exclude = list(exclude)
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    leaves = {id(t) for t in exclude}
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and not (leaves and _copy_of(t, leaves)):
            name = f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            old = seen.get(ptr)
            seen[ptr] = (old[0] if old else name, max(old[1] if old else 0, storage.nbytes()))
        return t

    with observing_saves(pack, _identity):
        out = fn()
    del out
    return seen


def cuda_peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated by ``fn`` on ``device`` above what was allocated before it."""
    return cuda_peaks(fn, device)["cuda_peak_bytes"]


def cuda_peaks(fn: Callable[[], Any], device: torch.device) -> dict[str, int]:
    """Peak bytes allocated on ``device`` while ``fn`` runs: above what was allocated before it
    (``cuda_peak_bytes``: a step's activations and transients) and in all
    (``cuda_total_peak_bytes``: with the weights and optimizer state already there)."""
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"cuda_peak_bytes": peak - base, "cuda_total_peak_bytes": peak}


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now, VmHWM: peak since start or reset)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def rss_step_peak(step: Callable[[], Any]) -> dict[str, Any]:
    """Run ``step`` once and return the process's peak RSS during it above the RSS before it.

    Linux only: writing 5 to /proc/self/clear_refs resets the peak (VmHWM) to the current RSS.
    """
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    step()
    peak = _status_kib("VmHWM")
    return {"rss_before_bytes": base * 1024, "rss_peak_bytes": peak * 1024,
            "rss_step_peak_bytes": (peak - base) * 1024}


def rss_in_subprocess(spec: dict[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
    """Run ``tape.bench.rss_probe`` with ``spec`` in a fresh interpreter; return its JSON (or an error)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    proc = subprocess.run(
        [sys.executable, "-m", "tape.bench.rss_probe", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout_s, env=env,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
