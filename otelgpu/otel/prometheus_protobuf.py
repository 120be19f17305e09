"""The Prometheus protobuf exposition format, with native histograms for the sketches.

A scraper that asks for ``application/vnd.google.protobuf;
proto=io.prometheus.client.MetricFamily; encoding=delimited`` (Prometheus with
``--enable-feature=native-histograms``) gets :func:`encode`'s output: one
``io.prometheus.client.MetricFamily`` message per family, each preceded by its length
as a varint. Field numbers are those of ``io/prometheus/client/metrics.proto`` in
``prometheus/client_model`` (listed next to each writer below).

Content: exactly the series of the text format (``prometheus_client.generate_latest``
of the same registry) -- counters as ``<name>_total``, ``info`` as ``<name>_info``
gauges, ``_created`` samples as separate gauge families, classic histogram buckets
with ``+Inf`` -- so a scraper sees the same series whichever format it negotiates. A
family that carries native histograms (``native_histograms``, a mapping from
:func:`label_key` to :class:`otelgpu.otel.histogram_rule.NativeHistogram`, set by the
sketch collector) gets both: its classic buckets and the native fields (schema, zero
bucket, spans, deltas) in the same ``Histogram`` message, as the Prometheus Go client
writes them. Empty families are left out (they hold no series). ``gaugehistogram``
families become ``GAUGE_HISTOGRAM`` (``_gsum``/``_gcount`` as its sum and count).

Why a hand-written writer: the exposition needs nine small proto2 messages and four
wire primitives (varint, zigzag varint, 64-bit double, length-delimited). The
``protobuf`` runtime would be a new required dependency of the ``prometheus`` extra
with its own version constraints (and generated code tied to a runtime version) for
about 60 lines of encoding; a writer this small is checked field by field against an
independent decoder in the tests. Repeated scalars are written unpacked, the proto2
default of ``metrics.proto`` (every protobuf parser accepts it).

Thread safety: :func:`encode` holds no state; it runs on the scrape's thread.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.openmetrics.exposition import (
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from otelgpu.otel import slicing
from otelgpu.otel.histogram_rule import NativeHistogram

CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)

# MetricType enum values.
COUNTER, GAUGE, SUMMARY, UNTYPED, HISTOGRAM, GAUGE_HISTOGRAM = range(6)
_TYPES = {
    "counter": COUNTER,
    "gauge": GAUGE,
    "info": GAUGE,
    "stateset": GAUGE,
    "summary": SUMMARY,
    "unknown": UNTYPED,
    "untyped": UNTYPED,
    "histogram": HISTOGRAM,
    "gaugehistogram": GAUGE_HISTOGRAM,
}
_UINT64_LIMIT = 1 << 64
LabelKey = tuple[tuple[str, str], ...]


def label_key(labels: Mapping[str, str], drop: str = "") -> LabelKey:
    """The identity of a series' label set (``drop``: the ``le``/``quantile`` label)."""
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


# ----------------------------------------------------------------------------- wire
def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _uint(field: int, n: int) -> bytes:  # wire type 0: uint32, uint64, enum
    return _varint(field << 3) + _varint(n)


def _int64(field: int, n: int) -> bytes:  # wire type 0, two's complement
    return _uint(field, n % _UINT64_LIMIT)


def _sint(field: int, n: int) -> bytes:  # wire type 0, zigzag: sint32, sint64
    return _uint(field, (n << 1) ^ (n >> 63))


def _double(field: int, x: float) -> bytes:  # wire type 1
    return _varint(field << 3 | 1) + struct.pack("<d", x)


def _message(field: int, body: bytes) -> bytes:  # wire type 2: message, string, bytes
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def _string(field: int, text: str) -> bytes:
    return _message(field, text.encode("utf-8"))


def _count(int_field: int, float_field: int, value: float) -> bytes:
    """A count as ``uint64`` when it is one, else in its ``*_float`` twin field."""
    if value >= 0 and value == math.floor(value) and value < _UINT64_LIMIT:
        return _uint(int_field, int(value))
    return _double(float_field, value)


# ----------------------------------------------------------------------------- messages
def _labels(labels: Mapping[str, str], drop: str = "") -> bytes:
    # LabelPair: name = 1, value = 2; Metric.label = 1
    return b"".join(
        _message(1, _string(1, escape_label_name(k, UNDERSCORES)) + _string(2, v))
        for k, v in sorted(labels.items())
        if k != drop
    )


def _timestamp(samples: Iterable[Sample]) -> bytes:
    for s in samples:
        if s.timestamp is not None:  # Metric.timestamp_ms = 6
            return _int64(6, int(float(s.timestamp) * 1000))
    return b""


def _value_metric(sample: Sample, mtype: int) -> bytes:
    # Metric: gauge = 2, counter = 3, untyped = 5 (each: value = 1)
    field = {COUNTER: 3, GAUGE: 2}.get(mtype, 5)
    return (
        _labels(sample.labels)
        + _message(field, _double(1, float(sample.value)))
        + _timestamp((sample,))
    )


def _native(h: NativeHistogram) -> bytes:
    # Histogram: schema = 5, zero_threshold = 6, zero_count = 7, negative_span = 9,
    # negative_delta = 10, positive_span = 12, positive_delta = 13;
    # BucketSpan: offset = 1 (sint32), length = 2 (uint32)
    out = [_sint(5, h.schema), _double(6, h.zero_threshold), _uint(7, h.zero_count)]
    for span_field, delta_field, spans, deltas in (
        (9, 10, h.negative_spans, h.negative_deltas),
        (12, 13, h.positive_spans, h.positive_deltas),
    ):
        out.extend(_message(span_field, _sint(1, o) + _uint(2, n)) for o, n in spans)
        out.extend(_sint(delta_field, d) for d in deltas)
    return b"".join(out)


def _histogram_metric(
    name: str, samples: list[Sample], native: NativeHistogram | None, gauge: bool
) -> bytes:
    # Histogram: sample_count = 1 (sample_count_float = 4), sample_sum = 2, bucket = 3;
    # Bucket: cumulative_count = 1 (cumulative_count_float = 4), upper_bound = 2.
    # Metric.histogram = 7
    count_name, sum_name = (
        (name + "_gcount", name + "_gsum") if gauge else (name + "_count", name + "_sum")
    )
    body = []
    for s in samples:
        if s.name == count_name:
            body.append(_count(1, 4, float(s.value)))
        elif s.name == sum_name:
            body.append(_double(2, float(s.value)))
    for s in samples:
        if s.name == name + "_bucket":
            bound = float(s.labels["le"])
            body.append(_message(3, _count(1, 4, float(s.value)) + _double(2, bound)))
    if native is not None:
        body.append(_native(native))
    return _labels(samples[0].labels, "le") + _message(7, b"".join(body)) + _timestamp(samples)


def _summary_metric(name: str, samples: list[Sample]) -> bytes:
    # Summary: sample_count = 1, sample_sum = 2, quantile = 3 (quantile = 1, value = 2);
    # Metric.summary = 4
    body = []
    for s in samples:
        if s.name == name + "_count":
            body.append(_uint(1, int(s.value)))
        elif s.name == name + "_sum":
            body.append(_double(2, float(s.value)))
    for s in samples:
        if s.name == name:
            q = float(s.labels["quantile"])
            body.append(_message(3, _double(1, q) + _double(2, float(s.value))))
    return (
        _labels(samples[0].labels, "quantile") + _message(4, b"".join(body)) + _timestamp(samples)
    )


def _family(name: str, documentation: str, mtype: int, metrics: list[bytes]) -> bytes:
    # MetricFamily: name = 1, help = 2, type = 3, metric = 4
    body = (
        _string(1, escape_metric_name(name, UNDERSCORES))
        + _string(2, documentation)
        + _uint(3, mtype)
        + b"".join(_message(4, m) for m in metrics)
    )
    return _varint(len(body)) + body


def _grouped(samples: Iterable[Sample], drop: str) -> dict[LabelKey, list[Sample]]:
    groups: dict[LabelKey, list[Sample]] = {}
    for s in samples:
        groups.setdefault(label_key(s.labels, drop), []).append(s)
    return groups


def _families(metric: Any, names: Collection[str] | None) -> Iterator[bytes]:
    """The delimited ``MetricFamily`` messages of one ``prometheus_client`` family."""
    name, doc = metric.name, metric.documentation
    mtype = _TYPES.get(metric.type, UNTYPED)
    main: list[Sample] = []
    extra: dict[str, list[Sample]] = {}  # the text format's separate families
    gauge_histogram = mtype == GAUGE_HISTOGRAM
    whole = mtype in (HISTOGRAM, GAUGE_HISTOGRAM, SUMMARY)  # one message per series
    if names is not None and whole:
        if name not in names and not any(s.name in names for s in metric.samples):
            return
        names = None  # a histogram or summary travels whole
    for s in metric.samples:
        if names is not None and s.name not in names:
            continue
        if s.name == name + "_created" or (
            not gauge_histogram and s.name in (name + "_gsum", name + "_gcount")
        ):
            extra.setdefault(s.name, []).append(s)
        else:
            main.append(s)
    metrics: list[bytes] = []
    if mtype in (HISTOGRAM, GAUGE_HISTOGRAM):
        native: Mapping[LabelKey, NativeHistogram] = getattr(metric, "native_histograms", {})
        for key, group in _grouped(main, "le").items():
            metrics.append(_histogram_metric(name, group, native.get(key), gauge_histogram))
        family_name = name
    elif mtype == SUMMARY:
        metrics = [_summary_metric(name, g) for g in _grouped(main, "quantile").values()]
        family_name = name
    else:
        family_name = {"counter": name + "_total", "info": name + "_info"}.get(metric.type, name)
        for s in main:
            if s.name == family_name:
                metrics.append(_value_metric(s, mtype))
            else:  # a sample the family type does not name: its own untyped series
                extra.setdefault(s.name, []).append(s)
    if metrics:
        yield _family(family_name, doc, mtype, metrics)
    for sample_name, samples in extra.items():
        kind = GAUGE if sample_name.endswith(("_created", "_gsum", "_gcount")) else UNTYPED
        yield _family(sample_name, doc, kind, [_value_metric(s, kind) for s in samples])


def encode(registry: Collector, names: Collection[str] | None = None) -> bytes:
    """Every family of ``registry`` in the delimited protobuf format (see module docstring).

    ``names`` (a scrape's ``name[]``): only the samples so named; a histogram or
    summary (one message per series: its buckets, sum, count and native histogram
    together) is written whole when its name or one of its sample names is listed."""
    chunks: list[bytes] = []
    for metric in registry.collect():
        slicing.tick()  # a scrape's thread hands the GIL back between families
        chunks.extend(_families(metric, names))
    return b"".join(chunks)
