"""torch.compile for training steps, with a guard for a PyTorch CPU code-generation bug.

Under torch 2.11, inductor's vectorised CPU code for TAPE's E update (``_UpdateE``, forward and
backward compiled) wrote past its buffers: glibc aborted with "corrupted size vs. prev_size" or
"free(): invalid next size", in ``compile=true`` training too. Scalar CPU code (``simdlen = 1``)
ran it right, and torch 2.13 did as well. So on a CPU, before ``FIXED_IN``, compiling turns
vectorisation off (slower CPU kernels, never corrupt memory) and says so. GPUs are not affected:
their kernels are Triton's.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

FIXED_IN = (2, 13)
"""The first torch release seen to run the compiled E update right with vectorised CPU code."""


def cpu_vectorization_is_unsafe(device_type: str, version: str | None = None) -> bool:
    """Whether inductor's vectorised CPU code must be avoided for this device and torch release."""
    return device_type == "cpu" and torch.torch_version.TorchVersion(version or torch.__version__) < FIXED_IN


def compile_model(model: nn.Module, mode: str = "default") -> Any:
    """``torch.compile(model, mode=mode)``; on a CPU under an affected torch, scalar CPU code."""
    device = next(model.parameters()).device.type
    if cpu_vectorization_is_unsafe(device):
        import torch._inductor.config as inductor_config

        if inductor_config.cpp.simdlen != 1:
            warnings.warn(f"torch {torch.__version__}: inductor's vectorised CPU code corrupted memory in TAPE's "
                          "compiled E update; compiling with scalar CPU code (torch._inductor.config.cpp.simdlen = 1). "
                          f"torch >= {'.'.join(map(str, FIXED_IN))} needs no such guard", stacklevel=2)
            inductor_config.cpp.simdlen = 1
    return torch.compile(model, mode=mode)
