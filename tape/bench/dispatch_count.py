"""Count the aten operators a piece of eager PyTorch dispatches that would each launch a device
kernel: no views, no allocations. A CPU stand-in for a GPU's kernel launches per step, where a
host-bound step's time follows them (CPU kernels add casts of their own inside mixed-dtype
operators, which the profiler counts and a GPU does not launch; this counts above them). A launch
of our Triton kernel counts once, whatever the interpreter does for it on a CPU."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator

from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh",
                       "detach", "alias", "_unsafe_view", "_local_scalar_dense", "promote_types", "result_type"})
"""Operators that allocate, reinterpret or read a scalar on the host: no kernel of their own."""


class DeviceOpCounter(TorchDispatchMode):
    """``with DeviceOpCounter() as count: ...``; then ``count.ops``: operator name -> calls."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self._paused = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.__name__.split(".")[0]
        is_view = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
        if not (is_view or name in NO_KERNEL or self._paused):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def one_launch(self, name: str) -> Iterator[None]:
        """Count ``name`` once and nothing the block dispatches (a kernel launch)."""
        self.ops[name] += 1
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


def device_ops(fn: Callable[[], Any]) -> Counter[str]:
    """The device operators ``fn()`` dispatches, by name (``triton:<kernel>`` for our kernels)."""
    counter = DeviceOpCounter()
    with _triton_launches_counted(counter), counter:
        fn()
    return counter.ops


@contextlib.contextmanager
def _triton_launches_counted(counter: DeviceOpCounter) -> Iterator[None]:
    """Route our Triton kernels' launches through ``counter.one_launch`` while the block runs."""
    from tape.kernels import triton_available

    if not triton_available():
        yield
        return
    from tape.kernels import triton_attention

    run = triton_attention._run

    def counted(fn: Any, *args: Any, **meta: Any) -> None:
        with counter.one_launch(f"triton:{getattr(fn, '__name__', 'kernel')}"):
            run(fn, *args, **meta)

    triton_attention._run = counted
    try:
        yield
    finally:
        triton_attention._run = run
