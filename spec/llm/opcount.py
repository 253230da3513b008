"""Count the torch operations a decode loop dispatches outside its models' forwards.

On a GPU the forwards of :mod:`spec.llm.static_cache` replay captured CUDA
graphs: one launch each, whatever the model.  Every other torch operation of a
step (drawing the draft tokens, processing rows, the verifier, the caches'
inputs) is dispatched from Python and, unless it only makes a view, launches
its own kernel.  When a step's rows stay on the device, that host work, not
the arithmetic, is what its builder and verifier cost, so the number of such
operations per step measures it on any machine (a host builder's numpy work
is not counted; time it instead): the same code dispatches
nearly the same operations on the CPU as on CUDA with the static cache (CUDA
adds the copies of host-made tensors, e.g. the uniforms, to the device, which
are no-ops on the CPU, and the pinning of each upload), and the count needs
no GPU and no timer.

:func:`count_ops` runs a callable under a ``TorchDispatchMode`` that counts
every aten operation, split into those dispatched inside a forward of one of
the given models (their ``forward`` hooks bracket it) and all others.  View
operations (``select``, ``slice``, ``view``…) are counted too: they launch
nothing but cost a dispatch; :attr:`OpCount.kernels` leaves them out, which is
what a captured CUDA graph holds (one node per kernel).  A CUDA graph replay dispatches no aten operation,
so on CUDA the replayed forwards count nothing, inside or out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCount", "count_ops"]

R = TypeVar("R")


@dataclass
class OpCount:
    """Operations dispatched while :func:`count_ops` ran its callable."""

    outside: int = 0  # outside every forward of the given models
    inside: int = 0  # inside one
    by_name: Counter[str] = field(default_factory=Counter)  # the outside ones, by aten name
    views: int = 0  # the outside ones that only make a view (is_view, or _unsafe_view): they launch no kernel

    @property
    def kernels(self) -> int:
        """The outside operations that are not views: on a GPU each launches a kernel (one node of a CUDA graph)."""
        return self.outside - self.views

    def per(self, steps: int, kernels: bool = False) -> float:
        """``outside`` (or :attr:`kernels`) per step (``steps`` ≥ 1)."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return (self.kernels if kernels else self.outside) / steps


def _is_view(func: Any) -> bool:
    """Whether an aten overload only makes a view of its input (its schema aliases the output to it)."""
    return bool(getattr(func, "is_view", False)) or func is torch.ops.aten._unsafe_view.default


class _Counting(TorchDispatchMode):
    def __init__(self, count: OpCount, depth: list[int]) -> None:
        super().__init__()
        self.count, self.depth = count, depth

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.depth[0]:
            self.count.inside += 1
        else:
            self.count.outside += 1
            self.count.views += _is_view(func)
            self.count.by_name[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], R], models: Sequence[torch.nn.Module] = ()) -> tuple[R, OpCount]:
    """``fn()`` and the operations it dispatched, those inside a forward of ``models`` apart.

    A forward that calls another model (or itself, nested) counts as inside
    until the outermost one returns.  The hooks are removed afterwards, also
    when ``fn`` raises.
    """
    for m in models:
        if not isinstance(m, torch.nn.Module):
            raise ValueError(f"models must be torch modules, got {type(m).__name__}")
    count, depth = OpCount(), [0]

    def enter(*_: Any) -> None:
        depth[0] += 1

    def leave(*_: Any) -> None:
        depth[0] -= 1

    handles = []
    try:
        for m in models:
            handles.append(m.register_forward_pre_hook(enter))
            handles.append(m.register_forward_hook(leave, always_call=True))
        with _Counting(count, depth):
            result = fn()
    finally:
        for h in handles:
            h.remove()
    return result, count
