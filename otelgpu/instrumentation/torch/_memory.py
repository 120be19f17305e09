"""CUDA caching-allocator statistics, read once per step without touching the GPU.

``torch._C._cuda_memoryStats(device)`` returns the allocator's nested statistics dict,
built on the host under the allocator mutex: no CUDA call, no synchronisation. The public
``memory_allocated()``/``max_memory_allocated()``… each rebuild *and flatten* the whole
dict, so they are never called here (tens of µs each). Nothing is read until CUDA is
initialised by the program (``torch.cuda.is_initialized()``), which is False in forked
children and on CPU-only builds — there this module reports nothing.

OOMs: the per-step delta of ``num_ooms`` is authoritative (it also catches OOMs that a
retry loop swallowed); where torch offers the private OOM observer it adds the allocator
state at the moment of the OOM as a span event. The observer cannot be detached, so it
checks the gate and becomes a no-op after ``uninstrument()``.

Thread-safety: :meth:`CudaMemory.read` runs on the thread that ends a step; the observer
may run on an autograd device thread and only calls a thread-safe callback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otelgpu.instrumentation.torch._gate import GATE

__all__ = ["CudaMemory", "MemorySnapshot", "parse_stats"]


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """Allocator state of one device (bytes; counters are process-lifetime totals)."""

    device: int
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    inactive_split_bytes: int
    num_ooms: int
    num_alloc_retries: int


def _get(stats: Mapping[str, Any], *path: str) -> int:
    """``stats[a][b][c]`` for the nested dict, or ``stats["a.b.c"]`` for the flat one."""
    flat = stats.get(".".join(path))
    if isinstance(flat, int):
        return flat
    node: Any = stats
    for key in path:
        if not isinstance(node, Mapping):
            return 0
        node = node.get(key)
    return int(node) if isinstance(node, int) else 0


def parse_stats(device: int, stats: Mapping[str, Any]) -> MemorySnapshot:
    """Reads the fields otelgpu reports from a nested (``_C``) or flat stats dict."""
    return MemorySnapshot(
        device=device,
        allocated_bytes=_get(stats, "allocated_bytes", "all", "current"),
        reserved_bytes=_get(stats, "reserved_bytes", "all", "current"),
        peak_allocated_bytes=_get(stats, "allocated_bytes", "all", "peak"),
        peak_reserved_bytes=_get(stats, "reserved_bytes", "all", "peak"),
        inactive_split_bytes=_get(stats, "inactive_split_bytes", "all", "current"),
        num_ooms=_get(stats, "num_ooms"),
        num_alloc_retries=_get(stats, "num_alloc_retries"),
    )


OomCallback = Callable[[dict[str, object]], None]


class CudaMemory:
    """Per-step allocator statistics of the current CUDA device.

    Args:
        torch: the imported torch module.
        on_oom: called with event attributes when the OOM observer fires.
        reset_peak: reset the allocator's peak after each read, so ``peak`` is per
            step. Off by default: the peak is process-global and other tools (HF
            ``TrainerMemoryTracker``, Lightning ``DeviceStatsMonitor``) read it.
    """

    def __init__(self, torch: Any, on_oom: OomCallback, *, reset_peak: bool = False) -> None:
        cuda = getattr(torch, "cuda", None)
        c = getattr(torch, "_C", None)
        self._initialized: Callable[[], bool] | None = getattr(cuda, "is_initialized", None)
        self._stats: Callable[[int], Mapping[str, Any]] | None = getattr(
            c, "_cuda_memoryStats", None
        )
        self._device: Callable[[], int] | None = getattr(cuda, "current_device", None)
        self._attach: Callable[[Callable[..., None]], None] | None = getattr(
            c, "_cuda_attach_out_of_memory_observer", None
        )
        self._reset: Callable[[int], None] | None = (
            getattr(c, "_cuda_resetPeakMemoryStats", None) if reset_peak else None
        )
        self._on_oom = on_oom
        self._attached = False
        self._last: dict[int, MemorySnapshot] = {}

    @property
    def available(self) -> bool:
        """True when this torch build can report CUDA allocator statistics."""
        return self._stats is not None and self._initialized is not None

    def read(self) -> tuple[MemorySnapshot, int, int] | None:
        """Returns ``(snapshot, new_ooms, new_alloc_retries)`` or None (no CUDA yet).

        Deltas are relative to the previous read of the same device.
        """
        if self._stats is None or self._initialized is None or self._device is None:
            return None
        if not self._initialized():
            return None
        if not self._attached:
            self._attach_observer()
        device = self._device()
        snap = parse_stats(device, self._stats(device))
        if self._reset is not None:
            self._reset(device)
        prev = self._last.get(device)
        self._last[device] = snap
        if prev is None:
            return snap, snap.num_ooms, 0
        return snap, snap.num_ooms - prev.num_ooms, snap.num_alloc_retries - prev.num_alloc_retries

    def _attach_observer(self) -> None:
        self._attached = True
        if self._attach is None:
            return
        on_oom = self._on_oom

        def observer(device: int, allocated: int, device_total: int, device_free: int) -> None:
            # Runs before the allocator raises, possibly on an autograd thread.
            if not GATE.on:
                return
            try:
                on_oom(
                    {
                        "device": int(device),
                        "allocated_bytes": int(allocated),
                        "device_total_bytes": int(device_total),
                        "device_free_bytes": int(device_free),
                    }
                )
            except Exception:  # noqa: BLE001 -never raise into the allocator
                return

        self._attach(observer)
