"""Which GPUs a training step is attributed to (setting ``step_devices``).

A step span carries the GPU context (utilization, memory, energy, throttling, XIDs) of
the GPUs the process trains on, not of every GPU the sampler sees: on an 8-GPU node a
rank uses one, and a CPU-only run uses none. The setting (``otelgpu.instrument(
step_devices=...)``, ``OTELGPU_STEP_DEVICES``):

* ``auto`` (default) -- the CUDA devices this process uses, by CUDA ordinal: those whose
  caching allocator holds memory (the devices of its tensors); when none does yet, torch's
  current device (``LOCAL_RANK``'s device under a distributed launcher, if it exists). No
  GPU at all while torch has not initialised CUDA (a CPU-only run, or a CPU build of torch).
* ``all`` -- every sampled GPU (the behaviour before this setting existed).
* ``none`` -- no GPU context on step spans.
* a list of CUDA ordinals or GPU UUIDs (prefixes allowed) -- exactly those.

CUDA ordinals map to sampled GPUs through their ``cuda_index`` (``CUDA_VISIBLE_DEVICES``
applied by discovery). ``auto`` is re-read on each of the first :data:`EARLY_STEPS` steps,
then every :data:`REFRESH_EVERY` steps (device placement rarely changes), off the training
thread; each read is one host-side allocator query per device, no CUDA call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["StepDevices", "cuda_devices_in_use"]

EARLY_STEPS = 10
REFRESH_EVERY = 100


def _local_rank() -> int | None:
    raw = os.environ.get("LOCAL_RANK", "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _reserved(torch: Any, index: int) -> int:
    """Bytes the caching allocator reserves on device ``index`` (host-side read)."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return int(raw(index)["reserved_bytes"]["all"]["current"])
    return int(torch.cuda.memory_stats(index).get("reserved_bytes.all.current", 0))


def cuda_devices_in_use() -> set[int]:
    """CUDA ordinals this process trains on (see the module docstring); empty without CUDA."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return set()
    cuda = torch.cuda
    if not cuda.is_initialized():
        return set()
    count = int(cuda.device_count())
    used = {i for i in range(count) if _reserved(torch, i) > 0}
    if used:
        return used
    rank = _local_rank()
    return {rank if rank is not None and rank < count else int(cuda.current_device())}


class StepDevices:
    """Resolves the ``step_devices`` setting against the sampled GPUs.

    Args:
        setting: ``auto``, ``all``, ``none`` or a tuple of ordinals/UUIDs.
        devices: the sampler's devices (``DeviceInfo``: ``uuid``, ``cuda_index``).
        report: called once with an error message for an entry that matches no GPU.
        in_use: the ``auto`` probe (CUDA ordinals in use).

    :meth:`for_step` returns ``None`` (every sampled GPU) or a list of UUIDs (maybe empty).
    Not thread-safe: called from the telemetry's drain, under its lock.
    """

    def __init__(
        self,
        setting: str | Sequence[str],
        devices: Sequence[Any],
        report: Callable[[str], None] | None = None,
        in_use: Callable[[], set[int]] = cuda_devices_in_use,
    ) -> None:
        self.setting = setting
        self._by_index = {d.cuda_index: d.uuid for d in devices if d.cuda_index is not None}
        self._uuids = [d.uuid for d in devices]
        self._in_use = in_use
        self._auto: list[str] | None = None
        self._explicit: list[str] | None = None
        if not isinstance(setting, str):
            self._explicit = self._match(setting, report)

    def _match(self, entries: Sequence[str], report: Callable[[str], None] | None) -> list[str]:
        found: list[str] = []
        for entry in entries:
            token = str(entry).strip()
            if token.isdigit():
                uuid = self._by_index.get(int(token))
            else:
                hits = [u for u in self._uuids if u.lower().startswith(token.lower())]
                uuid = hits[0] if len(hits) == 1 else None
            if uuid is None:
                if report is not None:
                    report(f"step_devices entry {token!r} matches no sampled GPU")
            elif uuid not in found:
                found.append(uuid)
        return found

    def for_step(self, step: int) -> list[str] | None:
        """The UUIDs step number ``step`` is attributed to (None: all sampled GPUs)."""
        setting = self.setting
        if self._explicit is not None:
            return self._explicit
        if setting == "all":
            return None
        if setting == "none":
            return []
        if self._auto is None or step <= EARLY_STEPS or step % REFRESH_EVERY == 0:
            in_use = self._in_use()
            self._auto = [self._by_index[i] for i in sorted(in_use) if i in self._by_index]
        return self._auto
