"""The one record that defines a metric: :class:`MetricSpec`.

Every metric otelgpu exports is a ``MetricSpec`` in :mod:`otelgpu.metrics.catalog`;
instruments are created from specs only (``Runtime.instrument(spec)``), and the metric
tables of ``docs/metrics*.md`` are rendered from the same specs
(:mod:`otelgpu.metrics.markdown`), so a name, unit or attribute set lives in one place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """The instrument behind a metric (one closed vocabulary for every area).

    ``SKETCH`` is otelgpu's own histogram: a :class:`~otelgpu.sketch.QuantileSketch` per
    attribute set, exported as an OTLP exponential histogram plus ``<name>.quantile``
    gauges. ``COUNTER`` is an in-process monotonic counter published at collection
    (``otelgpu.otel.counters.LocalCounter``). The ``OBSERVABLE_*`` kinds are OpenTelemetry
    observable instruments whose callbacks read state at collection time.
    """

    SKETCH = "sketch"
    COUNTER = "counter"
    OBSERVABLE_COUNTER = "observable_counter"
    OBSERVABLE_UP_DOWN_COUNTER = "observable_up_down_counter"
    OBSERVABLE_GAUGE = "observable_gauge"

    @property
    def observable(self) -> bool:
        return self.value.startswith("observable_")


class Status(enum.Enum):
    """Where the name comes from: an OpenTelemetry semantic convention, or otelgpu's own."""

    SEMCONV_STABLE = "semconv (stable)"
    SEMCONV_DEVELOPMENT = "semconv (development)"
    OTELGPU = "otelgpu"

    @property
    def semconv(self) -> bool:
        return self is not Status.OTELGPU


class Area(enum.Enum):
    """Which part of otelgpu records the metric (and which docs page lists it)."""

    GPU = "gpu"
    SAMPLER = "sampler"
    RUNTIME = "runtime"
    INTERNAL = "internal"
    TORCH = "torch"
    VLLM = "vllm"
    DIAGNOSIS = "diagnosis"


@dataclass(frozen=True)
class MetricSpec:
    """One metric: name, instrument kind, UCUM unit, description, attributes, origin.

    Attributes:
        name: the OpenTelemetry metric name.
        kind: the instrument (see :class:`Kind`).
        unit: UCUM unit (``s``, ``By``, ``Hz``, ``1``, ``{request}``...).
        description: one sentence, exported as the instrument description.
        area: who records it (see :class:`Area`).
        attributes: the metric's attribute keys beyond those every series of its area
            carries (GPU metrics: ``DEVICE_ATTRIBUTES``).
        status: semantic-convention status of the name.
        source: what the value is read from (an NVML call, a vLLM field...), for docs.
    """

    name: str
    kind: Kind
    unit: str
    description: str
    area: Area
    attributes: tuple[str, ...] = ()
    status: Status = Status.OTELGPU
    source: str = ""

    @property
    def semconv(self) -> bool:
        """True when the name is an OpenTelemetry semantic convention."""
        return self.status.semconv


__all__ = ["Area", "Kind", "MetricSpec", "Status"]
