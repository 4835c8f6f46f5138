"""A dispatch mode recording the operators that make the host wait for a GPU (tests, on CPU)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING = ("nonzero", "masked_select", "_local_scalar_dense", "is_nonzero")


class HostSyncs(TorchDispatchMode):
    """Records, in ``found``, ops whose output shape or value must come back to the host: the
    syncing ops above and indexing by a boolean mask."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        name = func.overloadpacket.__name__
        flat = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
        if name in SYNCING or (name in ("index", "index_put", "index_put_") and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in flat[1:])):
            self.found.append(name)
        return func(*args, **(kwargs or {}))
