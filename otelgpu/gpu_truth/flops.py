"""Model FLOPs of a training step, counted by torch's FLOP counter, measured once per shape.

``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of every matmul,
convolution and attention op dispatched inside it (forward and backward): 2·m·n·k per
matmul. Counting slows the counted call (a Python dispatch per op, roughly 1.5-3x a
normal step on CPU), so it is never on the hot path: :class:`StepFlops` counts **one**
step per distinct input-shape signature (the first step, and again when shapes change,
e.g. a new sequence length) and returns the cached figure otherwise. The cache is bounded
(:data:`MAX_SHAPES` signatures; beyond that the newest count is reused, not re-measured).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

R = TypeVar("R")

MAX_SHAPES = 64
"""Most input-shape signatures :class:`StepFlops` remembers (memory bound)."""


def count_flops(fn: Callable[[], R]) -> tuple[R, int]:
    """Run ``fn()`` under torch's FLOP counter: ``(its result, FLOPs counted)``."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        result = fn()
    return result, int(counter.get_total_flops())


def shape_signature(*tensors: Any) -> Hashable:
    """A hashable signature of the shapes and dtypes of ``tensors`` (nested lists ok).

    Compared within one process only (it keys counted FLOPs): a tensor's ``torch.Size``
    (a tuple) and ``torch.dtype`` are kept as they are, anything else made hashable.
    """
    out: list[Hashable] = []
    for t in tensors:
        shape = getattr(t, "shape", None)
        if shape is not None:
            dtype = getattr(t, "dtype", "")
            out.append(
                (
                    shape if isinstance(shape, tuple) else tuple(shape),
                    dtype if type(dtype).__module__ == "torch" else str(dtype),
                )
            )
        elif isinstance(t, list | tuple):
            out.append(shape_signature(*t))
        else:
            out.append(type(t).__name__)
    return tuple(out)


class StepFlops:
    """FLOPs per step, counted on the first step of each input-shape signature.

    ``step(fn, *inputs)`` runs ``fn()`` (the step: forward, backward, optimizer) and
    returns ``(result, flops)``; it counts FLOPs only when the shapes of ``inputs`` are
    new. Not thread-safe (one training loop). ``measured`` counts the counted steps.
    """

    def __init__(self) -> None:
        self._by_shape: dict[Hashable, int] = {}
        self._last: int | None = None
        self.measured = 0

    def step(self, fn: Callable[[], R], *inputs: Any) -> tuple[R, int]:
        key = shape_signature(*inputs)
        flops = self._by_shape.get(key)
        if flops is not None:
            return fn(), flops
        if len(self._by_shape) >= MAX_SHAPES and self._last is not None:
            return fn(), self._last
        result, flops = count_flops(fn)
        self.measured += 1
        self._by_shape[key] = flops
        self._last = flops
        return result, flops


__all__ = ["MAX_SHAPES", "StepFlops", "count_flops", "shape_signature"]
