"""OTLP/JSON of a metric collection for the local recording, straight from the SDK's data.

The recording's metrics line used to be the SDK's protobuf request (``encode_metrics``)
printed by protobuf's JSON printer, which walks every field of every data point in Python:
30-40 ms of CPU for a collection over two GPUs, run in slices by a background thread that
a host holding the GIL gives one turn per switch interval -- seconds of wall time. This
module writes the same JSON from the SDK's ``MetricsData`` directly, one data point at a
time (:class:`~otelgpu.otel.slicing.Slicer` ticks between points).

Contract: :func:`metrics_line` equals ``to_json_line(encode_metrics(data))`` of
``otelgpu.otel.recording``, character for character: the SDK encoder's choices (which
fields it sets, resources and scopes grouped as it groups them) and protobuf's JSON
mapping (field-number order, lowerCamelCase keys, 64-bit integers as strings, enums as
integers, defaults omitted but set optional fields and oneof members kept, ``NaN`` and
``Infinity`` as strings, ids in hex). ``tests/pipeline/test_pipeline_span_encoding.py``
checks it on real collections and on generated data of every kind.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    Gauge,
    Histogram,
    MetricsData,
    Sum,
)

from otelgpu.otel.metric_protobuf import grouped_scopes
from otelgpu.otel.slicing import Slicer
from otelgpu.otel.span_json import attributes_json, scope_json

__all__ = ["metrics_line"]

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _double(value: Any) -> Any:
    """A protobuf double as its JSON mapping prints it."""
    value = float(value)
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _head(out: dict[str, Any], point: Any, start: bool = True) -> None:
    """``startTimeUnixNano`` (with ``start``) and ``timeUnixNano``, each when set."""
    if start and point.start_time_unix_nano:
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        out["timeUnixNano"] = str(point.time_unix_nano)


def _exemplars(exemplars: Any) -> list[dict[str, Any]]:
    out = []
    for exemplar in exemplars:
        e: dict[str, Any] = {}
        if exemplar.time_unix_nano:
            e["timeUnixNano"] = str(exemplar.time_unix_nano)
        value = exemplar.value
        as_double = isinstance(value, float)
        if not as_double and not isinstance(value, int):
            raise ValueError("Exemplar value must be an int or float")  # as the SDK's
        if as_double:
            e["asDouble"] = _double(value)
        if exemplar.span_id is not None and exemplar.trace_id is not None:
            if exemplar.span_id:
                e["spanId"] = format(exemplar.span_id, "016x")
            if exemplar.trace_id:
                e["traceId"] = format(exemplar.trace_id, "032x")
        if not as_double:
            e["asInt"] = str(int(value))
        _listed(e, "filteredAttributes", attributes_json(exemplar.filtered_attributes))
        out.append(e)
    return out


def _number(point: Any, start: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _head(out, point, start)
    value = point.value
    as_int = isinstance(value, int)
    if not as_int:
        out["asDouble"] = _double(value)
    _listed(out, "exemplars", _exemplars(point.exemplars))
    if as_int:
        out["asInt"] = str(int(value))
    _listed(out, "attributes", attributes_json(point.attributes))
    return out


def _optional(out: dict[str, Any], key: str, value: Any) -> None:
    """A proto3 ``optional double``: printed whenever set, zero included."""
    if value is not None:
        out[key] = _double(value)


def _listed(out: dict[str, Any], key: str, items: list[Any]) -> None:
    """A repeated field: printed only when not empty."""
    if items:
        out[key] = items


def _histogram(point: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _head(out, point)
    if point.count:
        out["count"] = str(int(point.count))
    _optional(out, "sum", point.sum)
    if point.bucket_counts:
        out["bucketCounts"] = [str(int(c)) for c in point.bucket_counts]
    if point.explicit_bounds:
        out["explicitBounds"] = [_double(b) for b in point.explicit_bounds]
    _listed(out, "exemplars", _exemplars(point.exemplars))
    _listed(out, "attributes", attributes_json(point.attributes))
    _optional(out, "min", point.min)
    _optional(out, "max", point.max)
    return out


def _buckets(buckets: Any) -> dict[str, Any] | None:
    """A ``Buckets`` message, or ``None`` where the SDK's encoder leaves it unset."""
    if not buckets.bucket_counts:
        return None
    out: dict[str, Any] = {}
    if buckets.offset:
        out["offset"] = int(buckets.offset)
    out["bucketCounts"] = [str(int(c)) for c in buckets.bucket_counts]
    return out


def _exponential(point: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _listed(out, "attributes", attributes_json(point.attributes))
    _head(out, point)
    if point.count:
        out["count"] = str(int(point.count))
    _optional(out, "sum", point.sum)
    if point.scale:
        out["scale"] = int(point.scale)
    if point.zero_count:
        out["zeroCount"] = str(int(point.zero_count))
    for key, buckets in (("positive", point.positive), ("negative", point.negative)):
        encoded = _buckets(buckets)
        if encoded is not None:
            out[key] = encoded
    if point.flags:
        out["flags"] = int(point.flags)
    _listed(out, "exemplars", _exemplars(point.exemplars))
    _optional(out, "min", point.min)
    _optional(out, "max", point.max)
    return out


def _gauge_point(point: Any) -> dict[str, Any]:
    return _number(point, start=False)  # the SDK's encoder sets no start time on a gauge


def _sum_point(point: Any) -> dict[str, Any]:
    return _number(point, start=True)


#: Kind of metric data -> its JSON key and its data point writer.
_KINDS: tuple[tuple[type, str, Callable[[Any], dict[str, Any]]], ...] = (
    (Gauge, "gauge", _gauge_point),
    (Histogram, "histogram", _histogram),
    (Sum, "sum", _sum_point),
    (ExponentialHistogram, "exponentialHistogram", _exponential),
)


def _data_text(data: Any, slicer: Slicer) -> tuple[str, str] | None:
    """``(JSON key, JSON text)`` of a metric's data, ``None`` for data the SDK's encoder
    leaves out (no data point, or an unsupported kind)."""
    found = next((entry for entry in _KINDS if isinstance(data, entry[0])), None)
    if found is None:
        return None
    kind, key, write = found
    points = []
    for point in data.data_points:
        slicer.tick()
        points.append(_dumps(write(point)))
    if not points:
        return None
    text = '{"dataPoints":[' + ",".join(points) + "]"
    if kind is not Gauge:
        temporality = int(data.aggregation_temporality or 0)
        if temporality:
            text += f',"aggregationTemporality":{temporality}'
    if isinstance(data, Sum) and data.is_monotonic:
        text += ',"isMonotonic":true'
    return key, text + "}"


def _metric_text(metric: Any, slicer: Slicer) -> str:
    parts = [
        f"{_dumps(key)}:{_dumps(value)}"
        for key, value in (
            ("name", metric.name),
            ("description", metric.description),
            ("unit", metric.unit),
        )
        if value
    ]
    data = _data_text(metric.data, slicer)
    if data is not None:
        parts.append(f"{_dumps(data[0])}:{data[1]}")
    return "{" + ",".join(parts) + "}"


def metrics_line(metrics_data: MetricsData, slicer: Slicer | None = None) -> str:
    """One recording line (an ``ExportMetricsServiceRequest`` as OTLP/JSON) of
    ``metrics_data``; ``slicer`` (default: a new one) ticks before every data point."""
    slicer = slicer or Slicer()

    def write_scope(sm: Any) -> str:
        scope = sm.scope
        text = '{"scope":' + _dumps(scope_json(scope))
        metrics = [_metric_text(metric, slicer) for metric in sm.metrics]
        if metrics:
            text += ',"metrics":[' + ",".join(metrics) + "]"
        schema_url = getattr(scope, "schema_url", "")
        if schema_url:
            text += ',"schemaUrl":' + _dumps(schema_url)
        return text + "}"

    grouped = grouped_scopes(metrics_data, write_scope)
    if not grouped:
        return "{}"
    resources = []
    for resource, scopes in grouped.items():
        slicer.tick()
        attributes = attributes_json(resource.attributes)
        text = '{"resource":' + _dumps({"attributes": attributes} if attributes else {})
        if scopes:
            text += ',"scopeMetrics":[' + ",".join(scopes.values()) + "]"
        if resource.schema_url:
            text += ',"schemaUrl":' + _dumps(resource.schema_url)
        resources.append(text + "}")
    return '{"resourceMetrics":[' + ",".join(resources) + "]}"
