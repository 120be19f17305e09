"""``GpuSampler``: background NVML sampling into per-device ring buffers.

One class, two cores with one interface: the native core
(``otelgpu.sampler._sampler_c.NativeCore``, a C loop on a thread that never holds
the GIL) and the pure-Python core (``_core_py.PyCore``, pynvml on a daemon thread).
``otelgpu.sampler.GpuSampler`` is the native variant when it is built, else the pure
one; both give identical results for identical NVML readings.

Guarantees:

* **Clock.** Sample and event times are ``time.time_ns()``-compatible (comparable
  with OpenTelemetry span times) but come from the monotonic clock plus an offset
  captured when the sampler is created, so wall-clock jumps never reorder them.
* **Never raises into the application** after construction: NVML that cannot be
  loaded or initialised leaves a sampler with no devices and ``error`` set; a lost
  GPU (e.g. XID 79) is marked lost, an event is recorded and the others go on;
  failures are logged once.
* **Bounded:** fixed ring buffers (``history_s / interval_s + 1`` samples per device)
  and a fixed event ring; ``stop()`` returns within ``timeout_s``.
* **Fork-safe:** a forked child gets a stopped sampler with no samples, no events
  and no NVML state (``os.register_at_fork`` through a ``WeakMethod``, plus a PID
  check on every call); ``start()`` in the child begins afresh.
* **Thread-safety:** every method may be called from any thread.
"""

from __future__ import annotations

import atexit
import logging
import math
import operator
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from otelgpu._fork import after_fork_in_child
from otelgpu.errors import ConfigurationError
from otelgpu.nvml import DeviceInfo, DeviceSpec, NvmlUnavailableError, discover, library_path
from otelgpu.sampler import _fields as F
from otelgpu.sampler._core_py import PyCore
from otelgpu.sampler._records import RawSample, RawSummary, RawWindow
from otelgpu.sampler._types import (
    GpuEvent,
    GpuSample,
    WindowStats,
    event_from_raw,
    sample_from_raw,
    window_from_raw,
)

_logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.001
MAX_INTERVAL_S = 3600.0
MAX_RING_SAMPLES = 1 << 22  # per device; 4M x 200 bytes = 800 MiB is already absurd
DEFAULT_EVENT_CAPACITY = 4096
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _time_bound(value: object) -> int | None:
    """A window/event time bound as the cores take it, or ``None`` when it is no time.

    Both cores see the same C ``int64``: integers (numpy's too) as they are, finite
    floats truncated, both clamped to the int64 range (so the native core never meets an
    OverflowError); ``None``, strings, NaN and the like give ``None``. Query methods are
    on the application's hot path: they answer "nothing" instead of raising.
    """
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # the hot case: time_ns()
        return value
    if isinstance(value, float):
        return min(max(int(value), _INT64_MIN), _INT64_MAX) if math.isfinite(value) else None
    try:
        ns = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
    return min(max(ns, _INT64_MIN), _INT64_MAX)


class SamplerCore(Protocol):
    """What ``GpuSampler`` needs from a core (``PyCore`` and ``NativeCore`` implement it)."""

    kind: str

    def open(self, library: str) -> str | None: ...
    def probe(self) -> None: ...
    def events_open(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self, timeout_s: float) -> bool: ...
    @property
    def running(self) -> bool: ...
    def close(self) -> None: ...
    def after_fork_in_child(self) -> None: ...
    def sample_once(self, timestamp_ns: int = 0) -> None: ...
    def latest(self, i: int) -> RawSample | None: ...
    def window(self, i: int, s_ns: int, e_ns: int) -> RawWindow | None: ...
    def summary(
        self, s_ns: int, e_ns: int, devs: Sequence[int] | None = None
    ) -> RawSummary | None: ...
    def events(
        self, s_ns: int, e_ns: int, dev: int = -1, kind: int = -1
    ) -> list[tuple[int, ...]]: ...
    def device_state(self, i: int) -> tuple[int, int, bool, int, int, int, int]: ...
    def take_disabled(self, i: int) -> int: ...
    def field_off_codes(self, i: int) -> tuple[int, ...]: ...
    def event_count(self) -> int: ...
    def counters(self) -> tuple[int, int, int, int, int, int]: ...


@dataclass(frozen=True)
class SamplerStats:
    """The sampler's own health counters (since start or the last fork)."""

    ticks: int  # sampling rounds taken
    samples: int  # device samples stored
    dropped: int  # rounds skipped because a round overran its deadline
    overwritten: int  # samples aged out of a full ring (expected after history_s)
    events_dropped: int  # events aged out of the event ring
    busy_s: float  # time the loop thread spent sampling


_live: weakref.WeakSet[BaseGpuSampler] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    # Native threads must not be sampling while the interpreter finalises.
    for sampler in list(_live):
        sampler.stop(timeout_s=1.0)


atexit.register(_stop_all_at_exit)


def _finalize_core(core: SamplerCore) -> None:
    """Stop and close a core whose sampler was garbage-collected (or at exit)."""
    try:
        if core.stop(1.0):
            core.close()
    except Exception:  # runs from GC or atexit: never raise there
        _logger.debug("otelgpu: sampler finalizer failed", exc_info=True)


def _validate(interval_s: float, history_s: float) -> tuple[int, int]:
    try:
        interval = float(interval_s)
    except (TypeError, ValueError):
        interval = math.nan
    if not (MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S):
        raise ConfigurationError(
            "interval_s", interval_s, f"seconds between {MIN_INTERVAL_S} and {MAX_INTERVAL_S}"
        )
    try:
        history = float(history_s)
    except (TypeError, ValueError):
        history = math.nan
    capacity = math.ceil(history / interval) + 1 if math.isfinite(history) else 0
    if not (history >= interval and capacity <= MAX_RING_SAMPLES):
        raise ConfigurationError(
            "history_s",
            history_s,
            f"seconds from interval_s up to {MAX_RING_SAMPLES - 1} intervals",
        )
    return round(interval * 1e9), capacity


class BaseGpuSampler:
    """Samples NVML devices in the background; query samples, windows and events.

    Args:
        devices: UUIDs (or unique prefixes, or MIG UUIDs), CUDA ordinals or
            ``DeviceInfo`` objects to sample; ``None`` discovers them
            (``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK``; see ``otelgpu.nvml``).
        interval_s: sampling period, 0.001 to 3600 s (default 100 ms).
        history_s: how far back windows can reach; sets the ring size (default 10 min).
        nvml_library: NVML library path (default ``OTELGPU_NVML_LIBRARY``, else
            ``libnvidia-ml.so.1``).
        event_capacity: events retained (XIDs, ECC, loss, throttling), oldest dropped.

    Raises:
        ConfigurationError: a bad interval, history, library path or device.
    """

    _core_factory: ClassVar[Any] = PyCore
    implementation: ClassVar[str] = "python"

    def __init__(
        self,
        devices: Iterable[DeviceSpec] | None = None,
        *,
        interval_s: float = 0.1,
        history_s: float = 600.0,
        nvml_library: str | os.PathLike[str] | None = None,
        event_capacity: int = DEFAULT_EVENT_CAPACITY,
    ) -> None:
        self._interval_ns, self._capacity = _validate(interval_s, history_s)
        value: object = event_capacity
        if not isinstance(value, int) or not 16 <= value <= 1 << 20:
            raise ConfigurationError("event_capacity", value, "an int in 16..1048576")
        self._library = library_path(nvml_library)
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._error: str | None = None
        self._logged: set[tuple[str, str]] = set()
        try:
            found = discover(devices, library=self._library)
        except NvmlUnavailableError as exc:
            found = ()
            self._fail(str(exc))
        self._devices: tuple[DeviceInfo, ...] = found
        self._uuids = tuple(d.uuid for d in found)
        self._index = {u: i for i, u in enumerate(self._uuids)}
        self._core: SamplerCore = self._core_factory(
            self._uuids, self._interval_ns, self._capacity, self._offset_ns, event_capacity
        )
        self._opened = False
        self._events_ok = False
        _live.add(self)
        # A sampler dropped without close() must not leave its threads sampling forever;
        # the finalizer holds the core only (the threads reference the core, not self).
        self._finalizer = weakref.finalize(self, _finalize_core, self._core)
        after_fork_in_child(self._after_fork_in_child)

    # ---- configuration and state --------------------------------------------

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        """The sampled devices (UUID-keyed; empty when NVML is unavailable)."""
        return self._devices

    @property
    def interval_s(self) -> float:
        """Sampling period in seconds."""
        return self._interval_ns / 1e9

    @property
    def history_s(self) -> float:
        """How far back the ring buffers reach at the configured interval."""
        return (self._capacity - 1) * self._interval_ns / 1e9

    @property
    def running(self) -> bool:
        """True while the sampling thread runs."""
        self._check_fork()
        return self._core.running

    @property
    def error(self) -> str | None:
        """Why sampling is impossible (NVML missing or init failure), else ``None``."""
        return self._error

    @property
    def events_supported(self) -> bool:
        """True when XID events are delivered through the NVML event API."""
        return self._events_ok

    @property
    def dropped(self) -> int:
        """Sampling rounds skipped because a round overran its deadline (slow NVML)."""
        return self.stats().dropped

    def stats(self) -> SamplerStats:
        """The sampler's own counters."""
        self._check_fork()
        ticks, samples, dropped, overwritten, ev_dropped, busy_ns = self._core.counters()
        return SamplerStats(ticks, samples, dropped, overwritten, ev_dropped, busy_ns / 1e9)

    def lost(self, uuid: str) -> bool:
        """True once device ``uuid`` is lost (GPU_IS_LOST, XID 79, handle failure)."""
        i = self._index.get(uuid)
        if i is None:
            return False
        self._check_fork()
        return bool(self._core.device_state(i)[2])

    def supported_fields(self, uuid: str) -> list[str]:
        """Names of the fields still sampled for ``uuid`` (after capability probing)."""
        i = self._index.get(uuid)
        if i is None:
            return []
        self._check_fork()
        return F.field_names(self._core.device_state(i)[0])

    def unsupported_fields(self, uuid: str) -> dict[str, str]:
        """``{field: why it is not sampled}`` for ``uuid`` (after capability probing).

        E.g. ``{"gpm": "nvmlGpmQueryDeviceSupport: not supported on this GPU (…)"}`` on
        an A100, or ``{"memory_reserved": "…FUNCTION_NOT_FOUND…"}`` on a driver older
        than 515. Fields that merely failed once are not listed (they are retried).
        """
        i = self._index.get(uuid)
        if i is None:
            return {}
        self._check_fork()
        return F.off_reasons(self._core.field_off_codes(i))

    # ---- life cycle -----------------------------------------------------------

    def _fail(self, message: str) -> None:
        self._error = message
        if ("", message) not in self._logged:
            self._logged.add(("", message))
            _logger.warning("otelgpu: GPU sampling disabled: %s", message)

    def _ensure_open(self) -> bool:
        """Initialise NVML, resolve handles and probe capabilities once (lock held)."""
        if self._opened:
            return True
        if not self._devices:
            return False
        err = self._core.open(self._library)
        if err is not None:
            self._fail(err)
            return False
        self._error = None
        self._core.probe()
        self._events_ok = self._core.events_open()
        self._opened = True
        self.log_device_state()
        return True

    def start(self) -> None:
        """Start sampling (idempotent). Never raises; see ``error`` if nothing starts."""
        with self._lock:
            self._check_fork()
            if self._core.running or not self._ensure_open():
                return
            self._core.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop sampling (idempotent); True when the threads exited within ``timeout_s``.

        The native loop checks for a stop between devices and its XID waiter waits at
        most 100 ms at a time (the pure core drains XIDs in its sampling round, without
        waiting), so a stop takes one device's NVML calls at worst.
        """
        with self._lock:
            self._check_fork()
            if not self._core.running:
                return True
            ok = self._core.stop(timeout_s)
            if not ok:
                _logger.warning("otelgpu: sampler threads did not stop within %.1f s", timeout_s)
            return ok

    def close(self) -> None:
        """Stop and release NVML (``nvmlShutdown``); ``start()`` may open it again."""
        with self._lock:
            self.stop()
            if self._opened and not self._core.running:
                self._core.close()
                self._opened = False
                self._events_ok = False
            _live.discard(self)

    def __enter__(self) -> BaseGpuSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sample_once(self, timestamp_ns: int | None = None) -> None:
        """Take one sample of every device now, synchronously (opens NVML if needed).

        ``timestamp_ns`` stamps the samples instead of the sampler clock (for tests
        driving a simulator's virtual clock); ring order is kept by clamping.
        """
        with self._lock:
            self._check_fork()
            if not self._ensure_open():
                return
        self._core.sample_once(int(timestamp_ns) if timestamp_ns else 0)

    def now_ns(self) -> int:
        """The sampler clock (``time.time_ns()``-compatible, monotonic)."""
        return time.monotonic_ns() + self._offset_ns

    # ---- fork -------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._opened = False
        self._events_ok = False
        self._core.after_fork_in_child()

    def _check_fork(self) -> None:
        # Covers forks that bypass os.register_at_fork (e.g. a C-level fork()).
        if self._pid != os.getpid():
            self._after_fork_in_child()

    # ---- reading ----------------------------------------------------------------

    def _index_of(self, uuid: object) -> int | None:
        # Not a UUID string (e.g. an unhashable list): unknown device, not an exception.
        return self._index.get(uuid) if isinstance(uuid, str) else None

    def latest(self, uuid: str) -> GpuSample | None:
        """The newest sample of ``uuid``, or ``None`` (unknown device, no sample yet)."""
        i = self._index_of(uuid)
        if i is None:
            return None
        self._check_fork()
        raw = self._core.latest(i)
        return None if raw is None else sample_from_raw(uuid, raw)

    def window(self, uuid: str, start_ns: int, end_ns: int) -> WindowStats | None:
        """Statistics of ``uuid`` over ``[start_ns, end_ns]`` (see ``WindowStats``).

        ``None`` for an unknown device, an empty interval, bounds that are not times
        (never an exception), or no sample at or before ``end_ns``. Bounds beyond the
        int64 range are clamped to it. Cost: a binary search plus one pass over the
        window's samples.
        """
        i = self._index_of(uuid)
        s_ns, e_ns = _time_bound(start_ns), _time_bound(end_ns)
        if i is None or s_ns is None or e_ns is None:
            return None
        if self._pid != os.getpid():
            self._after_fork_in_child()
        raw = self._core.window(i, s_ns, e_ns)
        if raw is None:
            return None
        xids = tuple(e[3] for e in self._core.events(s_ns, e_ns, i, F.EV_XID))
        return window_from_raw(uuid, s_ns, e_ns, raw, xids)

    def windows(self, start_ns: int, end_ns: int) -> dict[str, WindowStats]:
        """:meth:`window` for every device that has data, keyed by UUID."""
        result = {}
        for uuid in self._uuids:
            stats = self.window(uuid, start_ns, end_ns)
            if stats is not None:
                result[uuid] = stats
        return result

    def raw_windows(self, start_ns: int, end_ns: int) -> list[tuple[Any, ...] | None]:
        """Raw window tuples (``RAW_WINDOW_FIELDS`` order) of every device, in ``devices``
        order; ``None`` where a device has no data (bounds as :meth:`window` takes them).

        No ``WindowStats`` is built and no XID is looked up: for callers that summarise
        many GPUs per span and read the window's events once for all devices
        (``otelgpu.otel.gpu_summary``). Cost: one C window query per device.
        """
        s_ns, e_ns = _time_bound(start_ns), _time_bound(end_ns)
        if s_ns is None or e_ns is None:
            return [None] * len(self._uuids)
        if self._pid != os.getpid():
            self._after_fork_in_child()
        window = self._core.window
        return [window(i, s_ns, e_ns) for i in range(len(self._uuids))]

    def summary(
        self, start_ns: int, end_ns: int, uuids: Sequence[str] | None = None
    ) -> RawSummary | None:
        """The window statistics of every device (or of ``uuids``, in that order; unknown
        ones skipped) summed up in one ``RawSummary``, with the XID codes of their events
        in the window; ``None`` when no device has data (bounds as :meth:`window` takes
        them). Device positions in it are indexes into :attr:`devices`.

        One call into the core for all devices: the constant-size GPU context of a span
        (``otelgpu.otel.gpu_summary``) costs about the same for 1 or 8 GPUs.
        """
        s_ns, e_ns = _time_bound(start_ns), _time_bound(end_ns)
        if s_ns is None or e_ns is None:
            return None
        if self._pid != os.getpid():
            self._after_fork_in_child()
        if uuids is None:
            return self._core.summary(s_ns, e_ns, None)
        devs = [i for u in uuids if (i := self._index_of(u)) is not None]
        return self._core.summary(s_ns, e_ns, devs)

    def summary_and_events(
        self, start_ns: int, end_ns: int, uuids: Sequence[str] | None = None
    ) -> tuple[RawSummary | None, list[GpuEvent]]:
        """:meth:`summary` of the window and the events of all devices in it (as
        :meth:`events` gives them), in one call: a span's GPU context on the hot path reads
        both, and each separate query costs its own bound checks and fork check."""
        # _time_bound's hot case (time_ns() values) inline: this runs for every span
        s_ns = (
            start_ns
            if type(start_ns) is int and _INT64_MIN <= start_ns <= _INT64_MAX
            else _time_bound(start_ns)
        )
        e_ns = (
            end_ns
            if type(end_ns) is int and _INT64_MIN <= end_ns <= _INT64_MAX
            else _time_bound(end_ns)
        )
        if s_ns is None or e_ns is None:
            return None, []
        if self._pid != os.getpid():
            self._after_fork_in_child()
        core = self._core
        if uuids is None:
            raw = core.summary(s_ns, e_ns, None)
        else:
            raw = core.summary(
                s_ns, e_ns, [i for u in uuids if (i := self._index_of(u)) is not None]
            )
        raws: Sequence[Any] = core.events(s_ns, e_ns, -1, -1)
        if not raws:  # the common case
            return raw, []
        return raw, [event_from_raw(self._uuids, r) for r in raws]

    def event_count(self) -> int:
        """How many events were ever published (retained or not). Cheap enough to read once
        per step: a change means new events (:meth:`events`), maybe stamped in a window
        already summarised -- the sampler publishes an event after stamping it."""
        if self._pid != os.getpid():
            self._after_fork_in_child()
        return int(self._core.event_count())

    def events(self, start_ns: int, end_ns: int, uuid: str | None = None) -> list[GpuEvent]:
        """Events in ``[start_ns, end_ns]`` (all devices, or ``uuid``), oldest first.

        Bounds are taken as :meth:`window` takes them (not times: no events).
        """
        self._check_fork()
        s_ns, e_ns = _time_bound(start_ns), _time_bound(end_ns)
        if s_ns is None or e_ns is None:
            return []
        dev = -1
        if uuid is not None:
            found = self._index_of(uuid)
            if found is None:
                return []
            dev = found
        raws: Sequence[Any] = self._core.events(s_ns, e_ns, dev, -1)
        return [event_from_raw(self._uuids, raw) for raw in raws]

    def log_device_state(self) -> None:
        """Log, once each, fields switched off as unsupported and devices lost."""
        self._check_fork()
        for i, uuid in enumerate(self._uuids):
            _caps, _disabled, lost, _t, code, _errors, _last = self._core.device_state(i)
            disabled = self._core.take_disabled(i)
            if not disabled and not lost:  # the usual case, every collection: nothing to log
                continue
            names = [n for n in F.field_names(disabled) if (uuid, n) not in self._logged]
            if names:
                self._logged.update((uuid, n) for n in names)
                _logger.info("otelgpu: %s does not support %s; not sampled", uuid, ", ".join(names))
            if lost and (uuid, "lost") not in self._logged:
                self._logged.add((uuid, "lost"))
                _logger.warning(
                    "otelgpu: GPU %s is lost (code %d); sampling the others", uuid, code
                )

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.implementation} devices={len(self._devices)} "
            f"interval_s={self.interval_s} running={self._core.running}>"
        )


class PyGpuSampler(BaseGpuSampler):
    """``GpuSampler`` with the pure-Python core (pynvml on a Python thread)."""

    _core_factory = PyCore
    implementation = "python"


def native_sampler_class(native_module: Any) -> type[BaseGpuSampler]:
    """``GpuSampler`` with the native core from the loaded ``_sampler_c`` module."""

    class NativeGpuSampler(BaseGpuSampler):
        """``GpuSampler`` with the native core (C loop without the GIL)."""

        _core_factory = native_module.NativeCore
        implementation = "native"

    NativeGpuSampler.__module__ = __name__
    NativeGpuSampler.__qualname__ = "NativeGpuSampler"
    return NativeGpuSampler
