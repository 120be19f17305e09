"""Creates instruments from :class:`~otelgpu.metrics.spec.MetricSpec` rows, once each.

:class:`Instruments` is what ``Runtime.instrument(spec)`` delegates to; nothing else in
otelgpu creates an instrument. It is idempotent: the same spec returns the same object,
so a re-instrumented torch or vLLM integration, or a second vLLM engine, reuses the
instruments the first one created (OpenTelemetry instruments cannot be removed, and a
second observable instrument of the same name would be dropped by the SDK).

What a spec gives, by kind:

* ``SKETCH`` -> a :class:`~otelgpu.otel.sketches.SketchHistogram` (``record(value, attrs)``);
* ``COUNTER`` -> a :class:`~otelgpu.otel.counters.LocalCounter` (``add(amount, attrs)``);
* ``OBSERVABLE_*`` -> an :class:`Observable`: one SDK observable instrument whose single
  callback calls every callback added to it (``add``/``remove``). A bound method is held
  weakly, so an owner that is dropped without ``remove`` stops reporting.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otelgpu.metrics.spec import Area, Kind, MetricSpec
from otelgpu.otel import slicing
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.sketches import SketchHistogram, SketchRegistry
from otelgpu.otel.stats import InternalStats

_logger = logging.getLogger("otelgpu")

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class Observable:
    """One observable instrument fed by any number of callbacks (see the module docstring)."""

    def __init__(self, spec: MetricSpec, stats: InternalStats | None) -> None:
        self.spec = spec
        self._stats = stats
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], Callback | None]] = []

    def add(self, callback: Callback) -> None:
        """Report ``callback``'s observations too (idempotent for the same callback)."""
        ref = _reference(callback)
        with self._lock:
            if any(r() == callback for r in self._callbacks):
                return
            self._callbacks.append(ref)

    def remove(self, callback: Callback) -> None:
        """Stop calling ``callback`` (no-op when it was never added)."""
        with self._lock:
            self._callbacks = [r for r in self._callbacks if r() not in (None, callback)]

    def __call__(self, options: CallbackOptions) -> Iterator[Observation]:
        """The observations of every callback, lazily: the SDK turns each one into a
        measurement and aggregates it as it is produced, so :func:`slicing.tick` between
        observations cuts an instrument with many series (eight GPUs) into short GIL
        slices (``otelgpu.otel.slicing``), its callbacks' work and the SDK's alike."""
        with self._lock:
            refs = list(self._callbacks)
        for ref in refs:
            callback = ref()
            if callback is None:
                continue
            try:
                observations = list(callback(options))
            except Exception as exc:  # noqa: BLE001 - one callback must not stop collection
                if self._stats is not None:
                    self._stats.report_error(f"metric {self.spec.name}", exc)
                else:
                    _logger.debug("otelgpu: metric %s callback failed: %r", self.spec.name, exc)
                continue
            for observation in observations:
                slicing.tick()
                yield observation


def _reference(callback: Callback) -> Callable[[], Callback | None]:
    if inspect.ismethod(callback):
        return weakref.WeakMethod(callback)
    return lambda: callback


class Instruments:
    """The instruments of one runtime (or of one meter, for ``register_gpu_metrics``).

    Args:
        meter: the meter of every area but :attr:`Area.INTERNAL`.
        internal_meter: the meter of the internal metrics (default: ``meter``).
        sketches: where sketch histograms live (default: a private registry).
        max_series: attribute sets per counter before the overflow series.
        stats: where swallowed errors are counted.
    """

    def __init__(
        self,
        meter: Meter,
        *,
        internal_meter: Meter | None = None,
        sketches: SketchRegistry | None = None,
        max_series: int = 1000,
        stats: InternalStats | None = None,
    ) -> None:
        self._meter = meter
        self._internal_meter = internal_meter or meter
        self._stats = stats
        self._sketches = sketches or SketchRegistry(
            relative_accuracy=0.01,
            max_series=max_series,
            quantiles=(),
            stats=stats or InternalStats(),
        )
        self._max_series = max_series
        self._lock = threading.Lock()
        self._by_name: dict[str, Any] = {}

    def instrument(self, spec: MetricSpec, callback: Callback | None = None) -> Any:
        """The instrument of ``spec`` (created on first use); ``callback`` feeds an observable.

        Raises ``ValueError`` when ``callback`` is given for a kind that is not observable,
        or a spec of the same name but another kind or unit was instrumented before.
        """
        if callback is not None and not spec.kind.observable:
            raise ValueError(f"{spec.name}: a {spec.kind.value} takes no callback")
        with self._lock:
            made = self._by_name.get(spec.name)
            if made is None:
                made = self._create(spec)
                self._by_name[spec.name] = made
            elif made[0] != (spec.kind, spec.unit):
                raise ValueError(f"{spec.name}: instrumented before as {made[0]}")
        instrument = made[1]
        if callback is not None:
            instrument.add(callback)
        return instrument

    def _create(self, spec: MetricSpec) -> tuple[tuple[Kind, str], Any]:
        meter = self._internal_meter if spec.area is Area.INTERNAL else self._meter
        kind = spec.kind
        made: Any
        if kind is Kind.SKETCH:
            made = self._sketches.get(spec.name, spec.unit, spec.description)
        elif kind is Kind.COUNTER:
            made = LocalCounter(
                meter,
                spec.name,
                spec.unit,
                spec.description,
                max_series=self._max_series,
                stats=self._stats,
            )
        else:
            made = Observable(spec, self._stats)
            factory = {
                Kind.OBSERVABLE_COUNTER: meter.create_observable_counter,
                Kind.OBSERVABLE_UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
                Kind.OBSERVABLE_GAUGE: meter.create_observable_gauge,
            }[kind]
            factory(spec.name, callbacks=[made], unit=spec.unit, description=spec.description)
        return (kind, spec.unit), made


__all__ = ["Callback", "Instruments", "Observable", "SketchHistogram"]
