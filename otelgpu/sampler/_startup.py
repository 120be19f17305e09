"""GPU discovery, inventory and sampler start-up off the application's thread.

``instrument()`` must return promptly even when the driver is slow: discovery and the
inventory make a few NVML calls per GPU (about 200 on an 8-GPU node), and a degraded
driver can take 50-500 ms per call. :class:`DeferredSampler` runs that work on a daemon
thread; ``instrument()`` waits for it at most a bound, and the GPU metrics appear when
it finishes (:meth:`DeferredSampler.when_ready`).

Until then a :class:`DeferredSampler` reads like a sampler with no devices (no windows,
no events); afterwards it delegates to the started ``GpuSampler``. GPUs that were
already lost at start (NVML enumerates them, but their handle answers ``GPU_IS_LOST``)
are reported as ``device_lost`` events under the identifier ``nvml-index-<n>``, so
the health signal exists although the GPU cannot be sampled.

Thread-safety: every method may be called from any thread. ``close()`` is
deterministic: it waits (bounded) for the start-up thread, and a sampler that
finishes starting after a timed-out ``close()`` is closed by that thread itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from otelgpu.nvml._node import LostGpu, NodeInventory, read_node
from otelgpu.sampler._records import RawSummary
from otelgpu.sampler._sampler import BaseGpuSampler, SamplerStats, _validate
from otelgpu.sampler._types import GpuEvent, GpuSample, WindowStats

_logger = logging.getLogger(__name__)

ReadyCallback = Callable[[BaseGpuSampler], None]
_NO_STATS = SamplerStats(0, 0, 0, 0, 0, 0.0)


class DeferredSampler:
    """A ``GpuSampler`` built, opened and started on a background thread.

    Args:
        build: makes the (not yet started) sampler; may raise ``ConfigurationError``
            (kept in :attr:`error` for the caller to re-raise if it is still waiting).
        library: NVML library for the node inventory (default: the sampler's rule).
        report_lost_gpus: report GPUs lost before start as health events (the process
            samples the whole node, or is local rank 0).
    """

    def __init__(
        self,
        build: Callable[[], BaseGpuSampler],
        *,
        library: str | None = None,
        report_lost_gpus: bool = True,
    ) -> None:
        self._build = build
        self._library = library
        self._report_lost = report_lost_gpus
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._sampler: BaseGpuSampler | None = None
        self._node = NodeInventory()
        self._error: BaseException | None = None
        self._closed = False
        self._detached = False
        self._callbacks: list[ReadyCallback] = []
        self._lost_events: tuple[GpuEvent, ...] = ()
        self._thread: threading.Thread | None = None
        self.startup_s: float | None = None

    # ---- start-up -------------------------------------------------------------

    def start(self) -> DeferredSampler:
        """Start the background thread (once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="otelgpu-gpu-startup", daemon=True
                )
                self._thread.start()
        return self

    def _run(self) -> None:
        begin = time.monotonic()
        sampler: BaseGpuSampler | None = None
        node = NodeInventory()
        error: BaseException | None = None
        try:
            sampler = self._build()
            node = read_node(self._library)
            if sampler.devices:
                sampler.start()
            else:
                sampler.close()
                sampler = None
        except BaseException as exc:  # noqa: BLE001 - kept for the caller; never raised here
            error = exc
            if sampler is not None:
                sampler.close()
                sampler = None
        with self._lock:
            self.startup_s = time.monotonic() - begin
            if self._closed and sampler is not None:
                sampler.close()  # shutdown() came first: release NVML now
                sampler = None
            self._sampler, self._node, self._error = sampler, node, error
            if self._report_lost and error is None:
                self._lost_events = tuple(_lost_event(g) for g in node.lost)
            callbacks = [] if self._closed or sampler is None else list(self._callbacks)
            self._callbacks = []
            self._done.set()
            unclaimed = self._detached and error is not None
        if unclaimed:  # instrument() stopped waiting: nobody else reports it
            _logger.warning("otelgpu: GPU sampling disabled: %s", error)
        for g in node.lost if self._report_lost else ():
            _logger.warning(
                "otelgpu: GPU at NVML index %d is lost (%s); sampling the others",
                g.nvml_index,
                g.error,
            )
        for callback in callbacks:
            self._call(callback, sampler)

    @staticmethod
    def _call(callback: ReadyCallback, sampler: BaseGpuSampler | None) -> None:
        if sampler is None:
            return
        try:
            callback(sampler)
        except Exception:  # a failing consumer must not stop the others
            _logger.warning("otelgpu: GPU start-up callback failed", exc_info=True)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for start-up to finish; True when it has."""
        return self._done.wait(timeout_s)

    def wait_or_detach(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s``; True when start-up finished (the caller then handles
        :attr:`error`), else False and a later error is logged by the start-up thread."""
        if self._done.wait(timeout_s):
            return True
        with self._lock:
            if self._done.is_set():
                return True
            self._detached = True
            return False

    @property
    def done(self) -> bool:
        """True once discovery finished (successfully or not)."""
        return self._done.is_set()

    @property
    def error(self) -> BaseException | None:
        """The exception discovery raised (e.g. a ``ConfigurationError``), else ``None``."""
        return self._error

    @property
    def node(self) -> NodeInventory:
        """The node inventory (empty until :attr:`done`)."""
        return self._node

    @property
    def sampler(self) -> BaseGpuSampler | None:
        """The started sampler, or ``None`` (not ready, no GPU, or failed)."""
        return self._sampler

    @property
    def lost_at_start(self) -> tuple[str, ...]:
        """Identifiers (``nvml-index-<n>``) of the GPUs this process reports lost before
        start (empty when another local rank reports them, or while start-up runs)."""
        return tuple(e.uuid for e in self._lost_events)

    @property
    def has_gpus(self) -> bool:
        """False once start-up found neither a GPU to sample nor a lost one."""
        return not self.done or self._sampler is not None or bool(self._lost_events)

    def when_ready(self, callback: ReadyCallback) -> None:
        """Call ``callback(sampler)`` once the sampler runs (now, if it already does)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
            sampler = None if self._closed else self._sampler
        self._call(callback, sampler)

    # ---- life cycle -------------------------------------------------------------

    def stop(self, timeout_s: float = 2.0) -> bool:
        sampler = self._sampler
        return sampler.stop(timeout_s) if sampler is not None else True

    def close(self, timeout_s: float = 2.0) -> None:
        """Close the sampler (NVML released); waits up to ``timeout_s`` in all for the
        start-up and its thread (which logs and runs callbacks after waking waiters)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closed = True
            self._callbacks = []
        self._done.wait(timeout_s)
        with self._lock:
            sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def running(self) -> bool:
        sampler = self._sampler
        return sampler is not None and sampler.running

    # ---- reading (empty until ready) -----------------------------------------------

    @property
    def devices(self) -> tuple[Any, ...]:
        sampler = self._sampler
        return sampler.devices if sampler is not None else ()

    @property
    def implementation(self) -> str:
        sampler = self._sampler
        return sampler.implementation if sampler is not None else "pending"

    @property
    def dropped(self) -> int:
        return self.stats().dropped

    def stats(self) -> SamplerStats:
        sampler = self._sampler
        return sampler.stats() if sampler is not None else _NO_STATS

    def now_ns(self) -> int:
        sampler = self._sampler
        return sampler.now_ns() if sampler is not None else time.time_ns()

    def latest(self, uuid: str) -> GpuSample | None:
        sampler = self._sampler
        return sampler.latest(uuid) if sampler is not None else None

    def window(self, uuid: str, start_ns: int, end_ns: int) -> WindowStats | None:
        sampler = self._sampler
        return sampler.window(uuid, start_ns, end_ns) if sampler is not None else None

    def windows(self, start_ns: int, end_ns: int) -> dict[str, WindowStats]:
        sampler = self._sampler
        return sampler.windows(start_ns, end_ns) if sampler is not None else {}

    def summary(
        self, start_ns: int, end_ns: int, uuids: Sequence[str] | None = None
    ) -> RawSummary | None:
        sampler = self._sampler
        return sampler.summary(start_ns, end_ns, uuids) if sampler is not None else None

    def summary_and_events(
        self, start_ns: int, end_ns: int, uuids: Sequence[str] | None = None
    ) -> tuple[RawSummary | None, list[GpuEvent]]:
        sampler = self._sampler
        if sampler is None:
            return None, self.events(start_ns, end_ns)
        raw, found = sampler.summary_and_events(start_ns, end_ns, uuids)
        if not self._lost_events:  # the common case
            return raw, found
        return raw, self.events(start_ns, end_ns)

    def event_count(self) -> int:
        sampler = self._sampler
        lost = len(self._lost_events)
        return sampler.event_count() + lost if sampler is not None else lost

    def events(self, start_ns: int, end_ns: int, uuid: str | None = None) -> list[GpuEvent]:
        sampler = self._sampler
        found = sampler.events(start_ns, end_ns, uuid) if sampler is not None else []
        if not self._lost_events:  # the common case
            return found
        lost = [
            e
            for e in self._lost_events
            if (uuid is None or e.uuid == uuid) and _within(e.time_ns, start_ns, end_ns)
        ]
        return sorted(found + lost, key=lambda e: e.time_ns) if lost else found

    def lost(self, uuid: str) -> bool:
        if any(e.uuid == uuid for e in self._lost_events):
            return True
        sampler = self._sampler
        return sampler.lost(uuid) if sampler is not None else False

    def supported_fields(self, uuid: str) -> list[str]:
        sampler = self._sampler
        return sampler.supported_fields(uuid) if sampler is not None else []

    def log_device_state(self) -> None:
        sampler = self._sampler
        if sampler is not None:
            sampler.log_device_state()

    def __getattr__(self, name: str) -> Any:
        # Anything else a GpuSampler offers, once there is one.
        if name.startswith("_"):
            raise AttributeError(name)
        sampler = self.__dict__.get("_sampler")
        if sampler is None:
            raise AttributeError(f"{name} (the GPU sampler is not started)")
        return getattr(sampler, name)

    def __repr__(self) -> str:
        state = "ready" if self.done else "starting"
        return f"<DeferredSampler {state} {self._sampler!r}>"


def _within(t: int, start_ns: object, end_ns: object) -> bool:
    try:
        return bool(int(start_ns) <= t <= int(end_ns))  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False


def _lost_event(gpu: LostGpu) -> GpuEvent:
    return GpuEvent(
        time.time_ns(),
        gpu.id,
        "device_lost",
        gpu.error_code,
        f"lost before start: {gpu.error}",
    )


def validate_sampling(interval_s: float, history_s: float) -> None:
    """Check the sampling settings on the caller's thread (``ConfigurationError``), so a
    bad value fails ``instrument()`` however long discovery takes."""
    _validate(interval_s, history_s)


def reports_lost_gpus(explicit_devices: bool, environ: Any = None) -> bool:
    """Whether this process reports GPUs lost before start: it samples the whole node
    (no explicit devices), and it is not a rank other than local rank 0."""
    env = os.environ if environ is None else environ
    return not explicit_devices and env.get("LOCAL_RANK", "0").strip() in ("", "0")


def gpu_inventory(deferred: DeferredSampler) -> Any:
    """The resource's ``GpuInventory`` from what start-up found (empty while it runs).

    The sampled GPUs only, in sampling order; a GPU lost at start never hides the others.
    """
    from otelgpu.otel.resource import GpuInventory

    sampler = deferred.sampler
    if not deferred.done or sampler is None:
        return GpuInventory()
    node = deferred.node
    uuids = tuple(d.uuid for d in sampler.devices)
    names = tuple(node.names.get(u) or d.name for u, d in zip(uuids, sampler.devices, strict=True))
    return GpuInventory(
        uuids=uuids,
        names=names,
        driver_version=node.driver_version,
        cuda_version=node.cuda_version,
        devices={u: node.devices[u] for u in uuids if u in node.devices},
    )
