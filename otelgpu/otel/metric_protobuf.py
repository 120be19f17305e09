"""OTLP metric requests written as protobuf bytes, straight from the SDK's data.

The SDK's OTLP exporters build one protobuf object per metric, data point, attribute and
exemplar in Python, then serialise them (``encode_metrics``); a collection over eight GPUs
cost 20-25 ms of CPU that way, in the export thread (or in the caller of ``force_flush``),
holding the GIL. Encoding a few points at a time and merging them with protobuf's C
``MergeFrom`` bounded the pauses but not the cost. This module writes the wire format
directly, the way :mod:`otelgpu.otel.span_encoding` writes spans (its attribute encoder and
caches included), one data point at a time with a :class:`~otelgpu.otel.slicing.Slicer`
tick before each.

Contract: :func:`encode_request` is byte for byte ``encode_metrics(data).SerializeToString()``
of the SDK -- the encoder's choices (a gauge has no start time, a histogram's ``sum``, ``min``
and ``max`` are written whenever set, a metric without data points has no data, a bucket
list without counts is left out; resources then scopes grouped as its dictionaries group
them: a repeated one keeps its first position and its last contents) and protobuf's
serialisation (fields in field-number order, proto3 defaults omitted, packed repeated
numbers). ``tests/pipeline/test_pipeline_metric_encoding.py`` checks it on collections of
otelgpu's shape and on generated data of every kind. Raises ``ValueError`` where the SDK's
encoder raises (an integer value outside int64, an exemplar value of another type).

Thread-safe: the caches are those of ``span_encoding`` (bounded plain dicts).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    Gauge,
    Histogram,
    MetricsData,
    Sum,
)

from otelgpu import _impl
from otelgpu.otel.slicing import Slicer
from otelgpu.otel.span_encoding import _ld, _resource, _scope, _varint, attributes_bytes

__all__ = ["encode_request", "grouped_scopes"]

T = TypeVar("T")

_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack
_pack_sq = struct.Struct("<q").pack
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _zigzag(n: int) -> bytes:
    """A ``sint32`` value."""
    return _varint((n << 1) ^ (n >> 31) if n < 0 else n << 1)


def _fixed64(tag: bytes, value: int) -> bytes:
    """A ``fixed64`` field, left out when zero (proto3)."""
    return tag + _pack_q(value) if value else b""


def _int64(value: Any) -> bytes:
    value = int(value)
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"Value out of range: {value}")
    return _pack_sq(value)


def _exemplars(tag: bytes, exemplars: Any) -> list[bytes]:
    out = []
    for exemplar in exemplars:
        body = [_fixed64(b"\x11", exemplar.time_unix_nano)]
        value = exemplar.value
        if isinstance(value, float):
            body.append(b"\x19" + _pack_d(value))
        elif not isinstance(value, int):
            raise ValueError("Exemplar value must be an int or float")  # as the SDK's
        if exemplar.span_id is not None and exemplar.trace_id is not None:
            body.append(b"\x22\x08" + exemplar.span_id.to_bytes(8, "big"))
            body.append(b"\x2a\x10" + exemplar.trace_id.to_bytes(16, "big"))
        if not isinstance(value, float):
            body.append(b"\x31" + _int64(value))
        body.append(attributes_bytes(b"\x3a", exemplar.filtered_attributes))
        out.append(_ld(tag, b"".join(body)))
    return out


class FixedAttributes(dict):  # type: ignore[type-arg]
    """An attribute set its owner never mutates, so its encoding is kept after the first
    use (the series of ``otelgpu.metrics.direct``: the same set every collection)."""

    __slots__ = ("encoded",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encoded: bytes | None = None


def _point_attributes(attributes: Any) -> bytes:
    if attributes.__class__ is FixedAttributes:
        encoded = attributes.encoded
        if encoded is None:
            encoded = attributes.encoded = attributes_bytes(b"\x3a", attributes)
        return encoded
    return attributes_bytes(b"\x3a", attributes)


def _number(point: Any, start: bool) -> bytes:
    """A ``NumberDataPoint`` body (``start``: with its start time; a gauge's has none)."""
    body = [_fixed64(b"\x11", point.start_time_unix_nano) if start else b""]
    body.append(_fixed64(b"\x19", point.time_unix_nano))
    value = point.value
    as_int = isinstance(value, int)
    if not as_int:
        body.append(b"\x21" + _pack_d(value))
    body += _exemplars(b"\x2a", point.exemplars)
    if as_int:
        body.append(b"\x31" + _int64(value))
    body.append(_point_attributes(point.attributes))
    return b"".join(body)


def py_number_points(points: Any, start: bool, tick: Callable[[], None]) -> bytes:
    """The ``data_points`` fields of a gauge (``start`` false) or a sum: each point
    length-delimited, concatenated, ``tick()`` before each (pure-Python twin of
    ``otelgpu.otel._otlp_c.number_points``)."""
    out = []
    for point in points:
        tick()
        out.append(_ld(b"\x0a", _number(point, start)))
    return b"".join(out)


_native = _impl.native_module("otelgpu.otel._otlp_c")
#: :func:`py_number_points`, native when the core loaded (same bytes, same errors).
number_points: Callable[[Any, bool, Callable[[], None]], bytes] = (
    _native.number_points if _native is not None else py_number_points
)


def _optional_double(tag: bytes, value: Any) -> bytes:
    """A proto3 ``optional double``: written whenever set, zero included."""
    return b"" if value is None else tag + _pack_d(value)


def _packed(tag: bytes, fmt: str, values: Any) -> bytes:
    if not values:
        return b""
    return _ld(tag, struct.pack(f"<{len(values)}{fmt}", *values))


def _histogram(point: Any) -> bytes:
    return b"".join(
        [
            _fixed64(b"\x11", point.start_time_unix_nano),
            _fixed64(b"\x19", point.time_unix_nano),
            _fixed64(b"\x21", int(point.count)),
            _optional_double(b"\x29", point.sum),
            _packed(b"\x32", "Q", point.bucket_counts),
            _packed(b"\x3a", "d", point.explicit_bounds),
            *_exemplars(b"\x42", point.exemplars),
            attributes_bytes(b"\x4a", point.attributes),
            _optional_double(b"\x59", point.min),
            _optional_double(b"\x61", point.max),
        ]
    )


def _buckets(tag: bytes, buckets: Any) -> bytes:
    """A ``Buckets`` field, left out where the SDK's encoder leaves it unset (no counts)."""
    counts = buckets.bucket_counts
    if not counts:
        return b""
    offset = int(buckets.offset)
    try:  # most counts of a sketch's buckets are below 128: one byte each, as they are
        packed = bytes(counts) if max(counts) < 128 else None
    except (TypeError, ValueError):  # not plain ints: each converted below
        packed = None
    if packed is None:
        packed = b"".join(_varint(int(c)) for c in counts)
    body = (b"\x08" + _zigzag(offset) if offset else b"") + _ld(b"\x12", packed)
    return _ld(tag, body)


def _exponential(point: Any) -> bytes:
    scale = int(point.scale)
    flags = int(point.flags)
    return b"".join(
        [
            attributes_bytes(b"\x0a", point.attributes),
            _fixed64(b"\x11", point.start_time_unix_nano),
            _fixed64(b"\x19", point.time_unix_nano),
            _fixed64(b"\x21", int(point.count)),
            _optional_double(b"\x29", point.sum),
            b"\x30" + _zigzag(scale) if scale else b"",
            _fixed64(b"\x39", int(point.zero_count)),
            _buckets(b"\x42", point.positive),
            _buckets(b"\x4a", point.negative),
            b"\x50" + _varint(flags) if flags else b"",
            *_exemplars(b"\x5a", point.exemplars),
            _optional_double(b"\x61", point.min),
            _optional_double(b"\x69", point.max),
        ]
    )


#: Kind of metric data -> (its ``Metric`` field tag, its data point writer; ``None``:
#: number points, written by :data:`number_points`).
_KINDS: tuple[tuple[type, bytes, Callable[[Any], bytes] | None], ...] = (
    (Gauge, b"\x2a", None),
    (Sum, b"\x3a", None),
    (Histogram, b"\x4a", _histogram),
    (ExponentialHistogram, b"\x52", _exponential),
)


def _data(data: Any, slicer: Slicer) -> bytes:
    """The ``Metric`` field of a metric's data; empty for data the SDK's encoder leaves
    out (no data point, or an unsupported kind)."""
    found = next((entry for entry in _KINDS if isinstance(data, entry[0])), None)
    if found is None:
        return b""
    kind, tag, write = found
    body = []
    if write is None:
        points = number_points(data.data_points, kind is Sum, slicer.tick)
        if points:
            body.append(points)
    else:
        for point in data.data_points:
            slicer.tick()
            body.append(_ld(b"\x0a", write(point)))
    if not body:
        return b""
    if kind is not Gauge:
        temporality = int(data.aggregation_temporality or 0)
        if temporality:
            body.append(b"\x10" + _varint(temporality))
    if kind is Sum and data.is_monotonic:
        body.append(b"\x18\x01")
    return _ld(tag, b"".join(body))


def _metric(metric: Any, slicer: Slicer) -> bytes:
    body = [
        _ld(tag, value.encode("utf-8"))
        for tag, value in (
            (b"\x0a", metric.name),
            (b"\x12", metric.description),
            (b"\x1a", metric.unit),
        )
        if value
    ]
    body.append(_data(metric.data, slicer))
    return b"".join(body)


def grouped_scopes(
    metrics_data: MetricsData, write_scope: Callable[[Any], T]
) -> dict[Any, dict[Any, T]]:
    """``{resource: {scope: write_scope(scope_metrics)}}`` grouped as the SDK's encoder
    groups: by resource, then by scope, a later entry equal to an earlier one replacing
    its contents and keeping its place (the SDK's dictionaries)."""
    grouped: dict[Any, dict[Any, T]] = {}
    for rm in metrics_data.resource_metrics:
        scopes: dict[Any, T] = {}
        grouped[rm.resource] = scopes
        for sm in rm.scope_metrics:
            scopes[sm.scope] = write_scope(sm)
    return grouped


def encode_request(metrics_data: MetricsData, slicer: Slicer | None = None) -> bytes:
    """The serialized ``ExportMetricsServiceRequest`` of ``metrics_data`` (module docstring);
    ``slicer`` (default: a new one) ticks before every data point."""
    slicer = slicer or Slicer()

    def write_scope(sm: Any) -> bytes:
        scope = sm.scope
        body = [_ld(b"\x0a", _scope(scope))]
        body += [_ld(b"\x12", _metric(metric, slicer)) for metric in sm.metrics]
        schema_url = getattr(scope, "schema_url", "")
        if schema_url:
            body.append(_ld(b"\x1a", schema_url.encode("utf-8")))
        return b"".join(body)

    out = []
    for resource, scopes in grouped_scopes(metrics_data, write_scope).items():
        slicer.tick()
        body = [_ld(b"\x0a", _resource(resource))]
        body += [_ld(b"\x12", scope_body) for scope_body in scopes.values()]
        if resource.schema_url:
            body.append(_ld(b"\x1a", resource.schema_url.encode("utf-8")))
        out.append(_ld(b"\x0a", b"".join(body)))
    return b"".join(out)
