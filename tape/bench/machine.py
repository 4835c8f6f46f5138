"""Where and with what a benchmark ran: hardware, library versions, git state, peak FLOP/s."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

# Dense bf16 tensor-core peak per GPU (vendor datasheets). Anything not listed gets no MFU:
# a wrong peak would give a wrong MFU (ecosystem.md sections 10, 11).
_PEAK_BF16 = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100 80GB HBM3", 989.4e12),  # SXM
    ("A100", 312.0e12),
)


def peak_bf16_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak in FLOP/s, or None when unknown (CPUs, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in _PEAK_BF16 if key in name), None)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info(device: torch.device) -> dict[str, Any]:
    """CPU, cores, threads, memory, OS and, on CUDA, the GPU."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": _mem_total_gib(),
        "os": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
        info["cuda"] = torch.version.cuda
    return info


def library_versions() -> dict[str, str]:
    """Python and the libraries that shape the numbers (absent ones are left out)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("hydra-core", "omegaconf", "numpy", "flash-attn", "tape-repro"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine_summary() -> str:
    """One line naming the machine: CPU cores and model, the GPU when torch sees one, the OS."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = machine_info(device)
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ""
    return f"{info['cpu_count']} CPU cores, {info['cpu']}{gpu}, {platform.system()} {platform.machine()}"
