"""GPU metrics as OpenTelemetry observable metrics fed from a ``GpuSampler``.

``register_gpu_metrics(runtime, sampler)`` feeds one observable metric per GPU row of
``otelgpu.metrics.catalog`` (names, units and attributes are documented in
``docs/metrics.md``). Each row has one generator of ``(value, attributes)`` points; they
run at collection time on the exporter's thread and only read the sampler's ring buffers
(a few µs per device); they never call NVML. The points reach the SDK one of two ways:

* where otelgpu owns the meter provider, as data points built by
  :class:`~otelgpu.metrics.direct.DirectMetrics` (no SDK instrument; the same exported
  data; an 8-GPU collection with its OTLP export: 13.5 -> 5.4 ms of the export thread);
* attached to an application's meter provider (whose views may apply), as SDK observable
  instruments created through ``Runtime.instrument``.

* Gauges report the newest sample. Devices that are lost report only ``hw.status``
  (failed); a reading the device does not support produces no point at all.
* "Between two collections" metrics (``otelgpu.gpu.memory.watermark``,
  ``otelgpu.gpu.throttle.fraction``) use the sampler's window statistics over the
  time since the previous collection, so a batch peak between two exports is not
  missed. With several metric readers, each collection starts a new interval.
* Observable instruments cannot be removed from an OpenTelemetry meter, so
  ``unregister()`` switches the callbacks off (they then report nothing).

Host pauses: each callback first hands the GIL over once its thread has held it for a
slice (``otelgpu.otel.slicing.tick``: a short real sleep; ``time.sleep(0)`` returns before
a waiting thread is scheduled), so a collection holds it for short slices, never for all
instruments at once.

Thread-safety: callbacks may run concurrently from several readers; the state they
keep is guarded by one lock. A failing callback logs once and reports nothing.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otelgpu.metrics import catalog as N
from otelgpu.metrics.direct import DirectMetrics, Point
from otelgpu.metrics.instruments import Instruments
from otelgpu.metrics.spec import MetricSpec
from otelgpu.otel import slicing
from otelgpu.sampler import BaseGpuSampler, GpuSample, WindowStats
from otelgpu.sampler import _fields as F

_logger = logging.getLogger(__name__)

_SNAPSHOT_TTL_NS = 20_000_000  # one collection reads each device's newest sample once
_XID_LAG_NS = 50_000_000  # events are counted once they are 50 ms old (no push race)
_MAX_DERIVED = 4096  # cached derived attribute sets (``GpuMetricsHandle._with``)

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def _yield_gil() -> None:
    """Hand the GIL to a waiting host thread if this thread held it for a slice."""
    slicing.tick()


_HARDWARE_THROTTLE = sum(
    bit
    for bit, name in F.REASON_NAMES.items()
    if name in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
)
"""Clock-event reasons that make a device ``degraded`` (a hardware reason)."""


class GpuMetricsHandle:
    """The instruments created by :func:`register_gpu_metrics`; ``unregister()`` stops them."""

    def __init__(
        self,
        instruments: _Instrumenting,
        sampler: BaseGpuSampler,
        device_attributes: Mapping[str, Mapping[str, str]] | None = None,
        lost_at_start: Sequence[str] = (),
        direct: DirectMetrics | None = None,
    ) -> None:
        self._sampler = sampler
        # GPUs NVML enumerates but could not open at start have no sampler device; their
        # only series is ``hw.status`` in the ``failed`` state, so an alert on it fires.
        self._lost_at_start = {
            lost: {"hw.id": lost, "hw.type": "gpu", "hw.vendor": "nvidia"} for lost in lost_at_start
        }
        self._enabled = True
        self._lock = threading.Lock()
        self._failed: set[str] = set()
        extra = device_attributes or {}
        self._attrs = {d.uuid: {**d.attributes(), **extra.get(d.uuid, {})} for d in sampler.devices}
        self._snapshot: dict[str, GpuSample | None] = {}
        self._snapshot_ns = -_SNAPSHOT_TTL_NS
        self._since: dict[tuple[str, str], int] = {}
        self._throttle_prev: dict[str, tuple[int, dict[str, int]]] = {}
        self._xid_counts: dict[tuple[str, int], int] = {}
        self._ecc_seen: dict[str, int] = {}
        self._devices = {d.uuid: d for d in sampler.devices}
        self._gpm_windows: dict[str, WindowStats | None] | None = None
        self._gpm_ns = -_SNAPSHOT_TTL_NS
        # This snapshot's live devices (None: to be listed) and the sampler's event count
        # then; windows computed for it, by (uuid, start, end).
        self._live: list[tuple[str, dict[str, Any], GpuSample]] | None = None
        self._live_events = -1
        self._windows: dict[tuple[str, int, int], WindowStats | None] = {}
        self._xid_cursor_ns = 0
        # (id of a device's attributes, key, value, type) -> that dict plus key=value;
        # device attribute dicts live as long as the handle, so their ids are stable.
        self._derived: dict[tuple[int, str, Any, type], Mapping[str, Any]] = {}
        callbacks: dict[str, Callable[[], Iterable[Point]]] = {
            N.GPU_UTILIZATION.name: self._utilization,
            N.GPU_MEMORY_UTILIZATION.name: self._memory_utilization,
            N.TEMPERATURE.name: self._temperature,
            N.GPU_IO.name: lambda: self._io("pcie_tx_bytes", "pcie_rx_bytes"),
            N.ERRORS.name: self._errors,
            N.STATUS.name: self._status,
            N.MEMORY_WATERMARK.name: self._watermark,
            N.THROTTLE_FRACTION.name: self._throttle_fraction,
            N.THROTTLE_TIME.name: self._throttle_time,
            N.XID.name: self._xids,
            N.NVLINK_IO.name: lambda: self._io("nvlink_tx_bytes", "nvlink_rx_bytes"),
            N.TEMPERATURE_LIMIT.name: self._temperature_limit,
            N.REMAPPED_ROWS.name: self._remapped_rows,
            N.GRAPHICS_ACTIVITY.name: lambda: self._gpm(("graphics_activity_pct", {})),
            N.SM_ACTIVITY.name: lambda: self._gpm(("sm_activity_pct", {})),
            N.SM_OCCUPANCY.name: lambda: self._gpm(("sm_occupancy_pct", {})),
            N.TENSOR_ACTIVITY.name: lambda: self._gpm(*_TENSOR_PIPES),
            N.DRAM_ACTIVITY.name: lambda: self._gpm(("dram_activity_pct", {})),
            N.PIPE_ACTIVITY.name: lambda: self._gpm(*_PIPES),
            N.SAMPLER_DROPPED.name: self._dropped,
        }
        for name, (field, scale) in _GAUGES.items():
            callbacks[name] = functools.partial(self._gauge, field, scale)
        self._points = {spec: callbacks[spec.name] for spec in (*N.GPU_METRICS, *N.SAMPLER_METRICS)}
        self.instruments: dict[str, Any] = {}
        self._callbacks: dict[str, Callback] = {}
        self._direct = direct
        sdk_specs: tuple[MetricSpec, ...] = (*N.GPU_METRICS, *N.SAMPLER_METRICS)
        if direct is not None:
            direct.add_source(self)
            # The sampler's own metric (one point, always reported) stays an SDK
            # instrument: the SDK exports nothing from a collection in which none of its
            # instruments reported, and the direct metrics ride on that export.
            sdk_specs = N.SAMPLER_METRICS
        self._direct_specs = tuple(spec for spec in self._points if spec not in sdk_specs)
        for spec in sdk_specs:
            callback = self._guard(spec)
            self._callbacks[spec.name] = callback
            self.instruments[spec.name] = instruments.instrument(spec, callback)

    @property
    def enabled(self) -> bool:
        """False after :meth:`unregister`."""
        return self._enabled

    def unregister(self) -> None:
        """Stop reporting (idempotent). The instruments stay in the meter, silent."""
        self._enabled = False
        if self._direct is not None:
            self._direct.remove_source(self)
        for name, callback in self._callbacks.items():
            self.instruments[name].remove(callback)

    close = unregister

    # ---- plumbing -------------------------------------------------------------

    def _observe(self, spec: MetricSpec) -> list[Point]:
        """This collection's points of ``spec``; ``[]`` when switched off or failing."""
        if not self._enabled:
            return []
        # A collection runs every instrument back to back on the export thread: handing
        # the GIL over before each one splits it into short slices, so the host's loop
        # waits at most one slice, not the whole collection.
        _yield_gil()
        try:
            return list(self._points[spec]())
        except Exception as exc:  # noqa: BLE001 - never break the exporter
            if spec.name not in self._failed:
                self._failed.add(spec.name)
                _logger.warning("otelgpu: metric %s callback failed: %r", spec.name, exc)
            return []

    def collect_points(self) -> Iterable[tuple[MetricSpec, Sequence[Point]]]:
        """Every GPU metric's points for one collection (the ``DirectMetrics`` source)."""
        return [(spec, self._observe(spec)) for spec in self._direct_specs]

    def _guard(self, spec: MetricSpec) -> Callback:
        """The SDK callback of ``spec`` (attached to an application's meter provider)."""

        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, attributes) for value, attributes in self._observe(spec)]

        return callback

    def _with(self, attrs: Mapping[str, Any], key: str, value: Any) -> Mapping[str, Any]:
        """``{**attrs, key: value}`` for a device's attributes, the same object each
        collection and never mutated, so a direct reader finds its series by identity
        and encodes its attributes once (``otelgpu.metrics.direct``)."""
        cache_key = (id(attrs), key, value, value.__class__)
        found = self._derived.get(cache_key)
        if found is None:
            if len(self._derived) >= _MAX_DERIVED:  # bounded: e.g. many XID codes
                self._derived.clear()
            found = self._derived[cache_key] = {**attrs, key: value}
        return found

    def _extend(self, attrs: Mapping[str, Any], extra: Mapping[str, Any]) -> Mapping[str, Any]:
        if not extra:
            return attrs
        if len(extra) == 1:
            ((key, value),) = extra.items()
            return self._with(attrs, key, value)
        return {**attrs, **extra}

    def _samples(self) -> list[tuple[str, dict[str, Any], GpuSample]]:
        """(uuid, attributes, newest sample) of every device that is not lost.

        One snapshot serves a whole collection (every instrument reads it): the newest
        samples, and which devices are live, are read once per ``_SNAPSHOT_TTL_NS``. A
        device lost meanwhile always publishes a ``device_lost`` event, so a change of
        the sampler's event count drops it from the list at once."""
        now = self._sampler.now_ns()
        events = self._sampler.event_count()
        with self._lock:
            if now - self._snapshot_ns > _SNAPSHOT_TTL_NS:
                self._sampler.log_device_state()
                self._snapshot = {u: self._sampler.latest(u) for u in self._attrs}
                self._snapshot_ns = now
                self._live = None
                self._windows = {}
            live = self._live
            if live is None or events != self._live_events:
                live = self._live = [
                    (u, self._attrs[u], s)
                    for u, s in self._snapshot.items()
                    if s is not None and s.status != "lost" and not self._sampler.lost(u)
                ]
                self._live_events = events
        return live

    def _since_previous(
        self, metric: str, samples: list[tuple[str, dict[str, Any], GpuSample]]
    ) -> list[tuple[str, dict[str, Any], WindowStats | None]]:
        """``(uuid, attributes, window)`` of every live device over the time since the
        previous collection of ``metric`` on it, up to this collection's snapshot.

        Instruments collected together ask for the same intervals, so each device's
        window is computed once per collection and shared (``_windows``)."""
        out = []
        with self._lock:
            now = self._snapshot_ns
            for uuid, attrs, _s in samples:
                start = self._since.get((metric, uuid), 0)
                # Collected again within one snapshot (another reader): up to now instead.
                end = now if start <= now else self._sampler.now_ns()
                self._since[(metric, uuid)] = end + 1
                out.append((uuid, attrs, start, end))
        result = []
        for uuid, attrs, start, end in out:
            key = (uuid, start, end)
            if key in self._windows:
                stats = self._windows[key]
            else:
                stats = self._windows[key] = self._sampler.window(uuid, start, end)
            result.append((uuid, attrs, stats))
        return result

    # ---- callbacks (generators of (value, attributes) points) ----------------

    def _gauge(self, field: str, scale: float = 1.0, **extra: str) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            value = getattr(s, field)
            if value is not None:
                yield (value * scale if scale != 1.0 else value, self._extend(attrs, extra))

    def _utilization(self) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            for value, task in (
                (s.gpu_util_pct, "general"),
                (s.encoder_util_pct, "encoder"),
                (s.decoder_util_pct, "decoder"),
            ):
                if value is not None:
                    yield (value * 0.01, self._with(attrs, "hw.gpu.task", task))

    def _memory_utilization(self) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            if s.memory_used_bytes is not None and s.memory_total_bytes:
                yield (s.memory_used_bytes / s.memory_total_bytes, attrs)

    def _temperature(self) -> Iterable[Point]:
        yield from self._gauge("temperature_c", 1.0, **{"hw.sensor_location": "gpu"})
        yield from self._gauge("memory_temperature_c", 1.0, **{"hw.sensor_location": "memory"})

    def _temperature_limit(self) -> Iterable[Point]:
        key = "otelgpu.gpu.temperature.limit_type"
        for uuid, attrs, _s in self._samples():
            details = self._devices[uuid].details
            for value, kind in (
                (details.slowdown_temp_c, "slowdown"),
                (details.shutdown_temp_c, "shutdown"),
            ):
                if value is not None:
                    yield (value, self._with(attrs, key, kind))

    def _remapped_rows(self) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            for state, value in (s.remapped_rows or {}).items():
                yield (value, self._with(attrs, "otelgpu.gpu.remap.state", state))

    def _gpm(self, *fields: tuple[str, dict[str, str]]) -> Iterable[Point]:
        """GPM activities (percent in WindowStats) as fractions, averaged since the
        previous collection; one window per device and collection, shared by the GPM
        instruments."""
        samples = self._samples()
        with self._lock:
            if self._gpm_ns != self._snapshot_ns:  # the first GPM instrument of a collection
                self._gpm_ns = self._snapshot_ns
                self._gpm_windows = None
            windows = self._gpm_windows
        if windows is None:
            windows = {u: w for u, _a, w in self._since_previous("gpm", samples)}
            with self._lock:
                self._gpm_windows = windows
        for uuid, attrs, _s in samples:
            stats = windows.get(uuid)
            if stats is None:
                continue
            for field, extra in fields:
                value = getattr(stats, field)
                if value is not None:
                    yield (value * 0.01, self._extend(attrs, extra))

    def _io(self, tx: str, rx: str) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            for field, direction in ((tx, "transmit"), (rx, "receive")):
                value = getattr(s, field)
                if value is not None:
                    yield (value, self._with(attrs, "network.io.direction", direction))

    def _errors(self) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            for field, kind in (("ecc_corrected", "corrected"), ("ecc_uncorrected", "uncorrected")):
                value = getattr(s, field)
                if value is not None:
                    yield (value, self._with(attrs, "error.type", kind))

    def _status(self) -> Iterable[Point]:
        latest = {u: s for u, _attrs, s in self._samples()}
        states = [
            (attrs, self._state(uuid, latest.get(uuid))) for uuid, attrs in self._attrs.items()
        ]
        states += [(attrs, "failed") for attrs in self._lost_at_start.values()]
        for attrs, state in states:
            for value in N.HW_STATES:
                yield (1 if value == state else 0, self._with(attrs, "hw.state", value))

    def _state(self, uuid: str, sample: GpuSample | None) -> str:
        """``hw.state`` of one device (the rule is the ``hw.status`` description)."""
        if self._sampler.lost(uuid):
            return "failed"
        if sample is None:
            return "ok"
        uncorrected = sample.ecc_uncorrected
        with self._lock:
            before = self._ecc_seen.get(uuid)
            if uncorrected is not None:
                self._ecc_seen[uuid] = uncorrected
        if sample.remapped_rows_failure or (
            uncorrected is not None and before is not None and uncorrected > before
        ):
            return "predicted_failure"
        reasons = sample.clock_event_reasons or 0
        if reasons & _HARDWARE_THROTTLE or sample.remapped_rows_pending:
            return "degraded"
        return "ok"

    def _watermark(self) -> Iterable[Point]:
        for _uuid, attrs, stats in self._since_previous(N.MEMORY_WATERMARK.name, self._samples()):
            if stats is not None and stats.memory_used_peak_bytes is not None:
                yield (stats.memory_used_peak_bytes, attrs)

    def _throttle_fraction(self) -> Iterable[Point]:
        key = "otelgpu.gpu.throttle.reason"
        samples = self._samples()
        windows = self._since_previous(N.THROTTLE_FRACTION.name, samples)
        for (uuid, attrs, s), (_u, _a, stats) in zip(samples, windows, strict=True):
            if stats is not None and stats.throttled_fraction is not None:
                yield (stats.throttled_fraction, self._with(attrs, key, "any"))
            with self._lock:
                prev = self._throttle_prev.get(uuid)
                self._throttle_prev[uuid] = (s.time_ns, dict(s.throttle_ns))
            if prev is None or s.time_ns <= prev[0]:
                continue
            elapsed = s.time_ns - prev[0]
            for reason, ns in s.throttle_ns.items():
                before = prev[1].get(reason)
                if before is not None and ns >= before:
                    yield (min(1.0, (ns - before) / elapsed), self._with(attrs, key, reason))

    def _throttle_time(self) -> Iterable[Point]:
        for _uuid, attrs, s in self._samples():
            for reason, ns in s.throttle_ns.items():
                yield (ns / 1e9, self._with(attrs, "otelgpu.gpu.throttle.reason", reason))

    def _xids(self) -> Iterable[Point]:
        now = self._sampler.now_ns() - _XID_LAG_NS
        with self._lock:
            if now > self._xid_cursor_ns:
                for event in self._sampler.events(self._xid_cursor_ns, now):
                    if event.kind == F.EVENT_KINDS[F.EV_XID]:
                        key = (event.uuid, event.code)
                        self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
                self._xid_cursor_ns = now + 1
            counts = dict(self._xid_counts)
        for (uuid, code), count in counts.items():
            attrs = self._attrs.get(uuid)
            if attrs is not None:
                yield (count, self._with(attrs, "otelgpu.gpu.xid.code", code))

    def _dropped(self) -> Iterable[Point]:
        yield (self._sampler.dropped, {})


#: The instruments that report one field of the newest sample: (field, scale).
_GAUGES: dict[str, tuple[str, float]] = {
    N.GPU_MEMORY_USAGE.name: ("memory_used_bytes", 1.0),
    N.GPU_MEMORY_LIMIT.name: ("memory_total_bytes", 1.0),
    N.POWER.name: ("power_w", 1.0),
    N.ENERGY.name: ("energy_mj", 0.001),
    N.GPU_MEMORY_RESERVED.name: ("memory_reserved_bytes", 1.0),
    N.PCIE_REPLAYS.name: ("pcie_replay_count", 1.0),
    N.MEMORY_CONTROLLER_UTILIZATION.name: ("memory_util_pct", 0.01),
    N.CLOCK_SM.name: ("sm_clock_mhz", 1e6),
    N.CLOCK_MEMORY.name: ("memory_clock_mhz", 1e6),
    N.FAN_SPEED.name: ("fan_speed_pct", 0.01),
    N.PSTATE.name: ("pstate", 1.0),
}

_TENSOR_PIPES: tuple[tuple[str, dict[str, str]], ...] = tuple(
    (f"{field}_pct", {"otelgpu.gpu.tensor.pipe": pipe})
    for field, pipe in (
        ("tensor_activity", "any"),
        ("hmma_tensor_activity", "hmma"),
        ("imma_tensor_activity", "imma"),
        ("dfma_tensor_activity", "dfma"),
        ("dmma_tensor_activity", "dmma"),
    )
)
_PIPES: tuple[tuple[str, dict[str, str]], ...] = tuple(
    (f"{pipe}_activity_pct", {"otelgpu.gpu.pipe": pipe})
    for pipe in ("fp16", "fp32", "fp64", "integer")
)


class _Instrumenting(Protocol):
    def instrument(self, spec: MetricSpec, callback: Callback | None = None) -> Any: ...


def register_gpu_metrics(
    target: _Instrumenting | Meter,
    sampler: BaseGpuSampler,
    device_attributes: Mapping[str, Mapping[str, str]] | None = None,
    *,
    lost_at_start: Sequence[str] = (),
    direct: DirectMetrics | None = None,
) -> GpuMetricsHandle:
    """Feed the GPU observable instruments from ``sampler`` (see ``docs/metrics.md``).

    ``target`` is the runtime (``Runtime.instrument`` creates the instruments) or, for a
    sampler used without ``instrument()``, a plain OpenTelemetry meter. Returns a handle
    whose ``unregister()``/``close()`` silences them. Never raises for sampler problems:
    a sampler without devices yields only the sampler metrics. ``device_attributes``
    (UUID -> attributes, e.g. the recommended ``hw.model``, ``hw.serial_number``...)
    are added to every series of that device. ``lost_at_start`` (``nvml-index-<n>``
    identifiers of GPUs lost before start) get a ``hw.status`` series, ``failed``.
    With ``direct``, no SDK instrument is created: the points are built as data points by
    ``direct``'s readers (``otelgpu.metrics.direct``; the runtime passes one where otelgpu
    owns the meter provider).
    """
    instruments = Instruments(target) if isinstance(target, Meter) else target
    return GpuMetricsHandle(instruments, sampler, device_attributes, lost_at_start, direct)


__all__ = ["GpuMetricsHandle", "register_gpu_metrics"]
