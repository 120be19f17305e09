"""otelgpu's span encoder (``otelgpu.otel.span_encoding``) against the SDK's: the same
request, byte for byte and decoded, for every kind of span otelgpu and users produce."""

from __future__ import annotations

import random
import time
import types
from typing import Any

import pytest
from fixtures.function_twins import twin_params, use_twin
from fixtures.generated_metrics import CASES, IntCode, TextSubclass, generated_metrics
from fixtures.otel import metrics_data
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

import otelgpu
from otelgpu import _impl
from otelgpu.otel import span_encoding

#: The native attribute encoder, when this run uses the native core.
TWINS = _impl.native_module("otelgpu.otel._otlp_c")


@pytest.fixture(
    params=twin_params(span_encoding.py_encode_span, "otelgpu.otel._otlp_c", "encode_span")
)
def span_encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``span_encoding`` with one twin of ``encode_span`` in use (both where both exist)."""
    return use_twin(request, monkeypatch, span_encoding, "encode_span")


def _provider(resource: Resource | None = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=resource or Resource.create({"service.name": "enc"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def _varied_spans() -> list[Any]:
    tp, exporter = _provider()
    other, other_exporter = _provider(Resource.create({"service.name": "other", "n": 3}))
    tracer = tp.get_tracer("lib.a", "1.2", schema_url="https://opentelemetry.io/schemas/1.21")
    tracer_b = tp.get_tracer("lib.b")
    remote = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
        trace_state=TraceState([("k", "v"), ("x", "y")]),
    )  # fmt: skip
    with tracer.start_as_current_span(
        "root",
        kind=SpanKind.SERVER,
        context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
    ) as root:
        root.set_attributes(
            {
                "s": "text é",
                "b": True,
                "f": False,
                "i": -5,
                "big": 2**62,
                "zero": 0,
                "d": 1.5,
                "nan": float("nan"),
                "ls": ["a", "b"],
                "li": [1, 2, 3],
                "lf": [0.5],
                "lb": [True, False],
                "empty": "",
            }
        )
        root.add_event("ev", {"x": 1, "y": "z"}, timestamp=123)
        root.add_event("bare")
        root.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer_b.start_as_current_span(
            "child", kind=SpanKind.CLIENT, links=[Link(remote, {"l": 1}), Link(remote)]
        ) as child:
            child.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span("", kind=SpanKind.PRODUCER):
            pass
    with other.get_tracer("lib.c").start_as_current_span("elsewhere", kind=SpanKind.CONSUMER):
        pass
    spans = list(exporter.get_finished_spans()) + list(other_exporter.get_finished_spans())
    # Interleave resources and scopes: the grouping must follow first appearance.
    assert len(spans) == 4
    return [spans[1], spans[3], spans[0], spans[2]]


def _same(spans: list[Any]) -> None:
    ours = span_encoding.encode_request(spans)
    sdk = encode_spans(spans)
    assert ExportTraceServiceRequest.FromString(ours) == sdk
    assert ours == sdk.SerializeToString()


def test_pipeline_encoder_matches_sdk_on_varied_spans(span_encoder: Any) -> None:
    _same(_varied_spans())


def test_pipeline_encoder_matches_sdk_on_large_batches(span_encoder: Any) -> None:
    """Batches longer than the grouping's slice (``TICK_EVERY``): one resource and scope
    (the usual batch, grouped by identity), then the same with one span of another
    scope last and one of another resource first (grouped span by span)."""
    tp, exporter = _provider()
    tracer = tp.get_tracer("lib.a", "1.0", schema_url="https://opentelemetry.io/schemas/1.21")
    n = span_encoding.TICK_EVERY * 3 + 5
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}", attributes={"i": i, "blob": "y" * (i % 200)}):
            pass
    spans = list(exporter.get_finished_spans())
    _same(spans)
    with tp.get_tracer("lib.b").start_as_current_span("other scope"):
        pass
    _same(list(exporter.get_finished_spans()))
    other, other_exporter = _provider(Resource.create({"service.name": "other"}))
    with other.get_tracer("lib.a").start_as_current_span("other resource"):
        pass
    _same(list(other_exporter.get_finished_spans()) + list(exporter.get_finished_spans()))


def test_pipeline_encoder_matches_sdk_twice_with_caches_warm(span_encoder: Any) -> None:
    spans = _varied_spans()
    _same(spans)
    _same(spans[::-1])


def test_pipeline_encoder_skips_what_the_sdk_skips(span_encoder: Any) -> None:
    tp, exporter = _provider()
    with tp.get_tracer("t").start_as_current_span("s") as span:
        span.set_attribute("ok", 1)
        span.set_attribute("huge", 2**70)  # beyond int64: the SDK drops it (logged)
    _same(list(exporter.get_finished_spans()))


@pytest.mark.usefixtures("reset_otel_globals")
def _instrumented() -> tuple[Any, InMemorySpanExporter]:
    """``instrument()`` (no exporter) with an in-memory exporter on its tracer provider."""
    handle = otelgpu.instrument(exporters="none", frameworks="none")
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    exporter = InMemorySpanExporter()
    runtime.pipeline.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[attr-defined]
    time.sleep(0.3)
    return handle, exporter


def test_pipeline_encoder_matches_sdk_on_otelgpu_spans(sim_gpu: Any, span_encoder: Any) -> None:
    handle, exporter = _instrumented()
    for i in range(5):
        with otelgpu.step(samples=8, tokens=100, attributes={"run": "r"}):
            pass
        with otelgpu.request(model="m", attributes={"tenant": f"t{i}"}) as r:
            r.first_token()
            r.tokens(4)
    try:
        with otelgpu.request(model="m"):
            raise RuntimeError("failed request")
    except RuntimeError:
        pass
    # A block the machine stalled for 2 ms or more finishes on the deferred thread: the
    # flush finishes it first.
    handle.force_flush()
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 11
    _same(spans)
    _same_json(spans)
    handle.shutdown()


def _same_json(spans: list[Any]) -> None:
    import json

    from otelgpu.otel import span_json
    from otelgpu.otel.recording import to_json_line

    ours = span_json.request_line([(s, span_json.span_dict(s)) for s in spans])
    assert json.loads(ours) == json.loads(to_json_line(encode_spans(spans)))
    # Spliced from per-span text (what the exporter sends): the same line, exactly.
    assert span_json.request_line_text([(s, span_json.span_text(s)) for s in spans]) == ours


def test_pipeline_recording_json_matches_protobuf_json() -> None:
    spans = _varied_spans()
    _same_json(spans)
    _same_json(spans[::-1])


@pytest.mark.usefixtures("reset_otel_globals")
def test_pipeline_recording_metrics_line_built_in_slices(sim_gpu: Any) -> None:
    """The metrics line written from the SDK's data (``otelgpu.otel.metric_json``, the GIL
    handed back between data points) is the protobuf printer's line, character for
    character, for a real collection over the simulated GPUs."""

    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otelgpu.otel.exporters import append_metrics
    from otelgpu.otel.recording import metrics_json_line, to_json_line

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    handle = otelgpu.instrument(meter_provider=mp, exporters="none", frameworks="none")
    runtime = handle.runtime
    assert runtime is not None
    time.sleep(0.3)
    for _ in range(20):
        with otelgpu.step(samples=2):
            pass
        with otelgpu.request(model="m") as r:
            r.first_token()
    data = append_metrics(metrics_data(reader), runtime.sketches.metrics())
    assert sum(len(sm.metrics) for rm in data.resource_metrics for sm in rm.scope_metrics) > 10
    assert metrics_json_line(data) == to_json_line(encode_metrics(data))
    handle.shutdown()
    mp.shutdown()


def test_pipeline_recording_metrics_line_equals_protobuf_printer_on_every_kind() -> None:
    """300 generated collections: the metrics line written from the SDK's data equals the
    protobuf printer's line of the SDK's request, character for character."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from otelgpu.otel.metric_json import metrics_line
    from otelgpu.otel.recording import to_json_line

    rng = random.Random(20261204)
    kinds: set[str] = set()
    for _ in range(300):
        data = generated_metrics(rng)
        expected = to_json_line(encode_metrics(data))
        assert metrics_line(data) == expected
        kinds.update(k for k in CASES if f'"{k}"' in expected)
    assert kinds == set(CASES)  # every case was generated at least once


ATTRIBUTE_VALUES: dict[str, Any] = {
    "ascii": "abc",
    "empty str": "",
    "unicode": "GPU-é-名-🚀",
    "lone surrogate": "a\ud800b",
    "long str": "x" * 300,
    "true": True,
    "false": False,
    "zero": 0,
    "small int": 127,
    "int": 128,
    "negative int": -1,
    "int64 max": (1 << 63) - 1,
    "int64 min": -(1 << 63),
    "beyond int64": 1 << 64,
    "float": 0.1,
    "negative zero": -0.0,
    "nan": float("nan"),
    "inf": float("-inf"),
    "none": None,
    "bytes": b"\x00\xff",
    "str tuple": ("a", "b"),
    "mixed list": ["a", 1, 2.5, True],
    "empty tuple": (),
    "long list": list(range(40)),
    "tuple with None": ("a", None),
    "nested": (("a",), ("b",)),
    "mapping": {"k": 1},
    "enum": IntCode.A,
    "str subclass": TextSubclass("t"),
    "list beyond int64": [1 << 64],
}


@pytest.mark.skipif(not TWINS, reason="this run forces the pure-Python twin")
@pytest.mark.parametrize("tag", [b"\x0a", b"\x4a"])
def test_native_attribute_encoder_equals_the_twin(tag: bytes) -> None:
    """Every value kind, one at a time and all in one mapping (plain dict, the SDK's
    BoundedAttributes and a read-only proxy): the same bytes from both encoders."""
    from opentelemetry.attributes import BoundedAttributes

    assert TWINS is not None
    for name, value in ATTRIBUTE_VALUES.items():
        one = {f"k.{name}": value}
        assert TWINS.attributes_bytes(tag, one) == span_encoding.py_attributes_bytes(tag, one), name
    every = {f"k.{name}": value for name, value in ATTRIBUTE_VALUES.items()}
    expected = span_encoding.py_attributes_bytes(tag, every)
    bounded = BoundedAttributes(attributes={k: v for k, v in every.items() if v is not None})
    for mapping in (every, types.MappingProxyType(every)):
        assert TWINS.attributes_bytes(tag, mapping) == expected
    assert TWINS.attributes_bytes(tag, bounded) == span_encoding.py_attributes_bytes(tag, bounded)
    assert TWINS.attributes_bytes(tag, {}) == TWINS.attributes_bytes(tag, None) == b""


def test_encoded_attributes_decode_as_the_sdk_encodes_them() -> None:
    """Whichever encoder this run uses: a span with every value kind encodes as the SDK's."""
    tp, exporter = _provider()
    with tp.get_tracer("t").start_as_current_span("s") as span:
        for name, value in ATTRIBUTE_VALUES.items():
            span.set_attribute(f"k.{name}", value)
    (finished,) = exporter.get_finished_spans()
    assert span_encoding.encode_request([finished]) == encode_spans([finished]).SerializeToString()


@pytest.mark.skipif(not TWINS, reason="this run forces the pure-Python twin")
def test_native_span_encoder_equals_the_twin() -> None:
    """Span by span (resources, scopes, remote parents, trace state, events, links, status,
    every attribute kind): the same bytes from both encoders."""
    assert TWINS is not None
    tp, exporter = _provider()
    with tp.get_tracer("t").start_as_current_span("every kind") as span:
        for name, value in ATTRIBUTE_VALUES.items():
            span.set_attribute(f"k.{name}", value)
        span.add_event("e", {f"k.{name}": v for name, v in ATTRIBUTE_VALUES.items()})
    spans = [*_varied_spans(), *exporter.get_finished_spans()]
    for span in spans:
        assert TWINS.encode_span(span) == span_encoding.py_encode_span(span), span.name
    assert span_encoding.encode_span is TWINS.encode_span


@pytest.mark.skipif(not TWINS, reason="this run forces the pure-Python twin")
def test_native_span_json_equals_the_twin() -> None:
    """The recording's JSON of a span, span by span (remote parents, trace state, events
    with and without attributes, links, status, every attribute kind including what the
    SDK's encoder drops, non-ASCII and control characters in names and values): the same
    text, character for character, from both writers."""
    from otelgpu.otel import span_json

    assert TWINS is not None
    tp, exporter = _provider()
    tracer = tp.get_tracer("t")
    with tracer.start_as_current_span("every kind") as span:
        for name, value in ATTRIBUTE_VALUES.items():
            span.set_attribute(f"k.{name}", value)
        span.add_event("e", {f"k.{name}": v for name, v in ATTRIBUTE_VALUES.items()})
        span.add_event("dropped only", {"huge": 1 << 70})
        span.add_event("", {})
    with tracer.start_as_current_span('quote " back\\slash \n tab\t ctl\x01 é 🚀') as span:
        span.set_attribute('k"q', 'v\x1f"\\')
        span.set_status(Status(StatusCode.ERROR))
    with tracer.start_as_current_span("only huge", attributes={"huge": 1 << 70}):
        pass
    spans = [*_varied_spans(), *exporter.get_finished_spans()]
    for span in spans:
        assert TWINS.span_text(span) == span_json.py_span_text(span), span.name
    assert span_json.span_text is TWINS.span_text


@pytest.mark.skipif(not TWINS, reason="this run forces the pure-Python twin")
@pytest.mark.usefixtures("reset_otel_globals")
def test_native_span_json_equals_the_twin_on_otelgpu_spans(sim_gpu: Any) -> None:
    from otelgpu.otel import span_json

    assert TWINS is not None
    handle, exporter = _instrumented()
    sim_gpu.inject("xid", gpu=1, code=48)
    for i in range(3):
        with otelgpu.step(samples=8, tokens=100, attributes={"run": "r"}):
            time.sleep(0.05)
        with otelgpu.request(model="m", attributes={"tenant": f"t{i}"}) as r:
            r.first_token()
            r.tokens(4)
    handle.force_flush()  # the 50 ms steps finish on the deferred thread
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 6
    for span in spans:
        assert TWINS.span_text(span) == span_json.py_span_text(span), span.name
    handle.shutdown()


class _RenamedSpan(ReadableSpan):
    """A ReadableSpan whose properties say something else than its fields: the encoders
    must follow the properties (the native one reads fields only for the SDK's own)."""

    @property
    def name(self) -> str:
        return "renamed"

    @property
    def attributes(self) -> Any:
        return {"from.property": 1}


def _odd_spans() -> list[Any]:
    """Spans whose fields are not what a default SDK span holds: a subclass overriding
    properties, a ReadableSpan built directly (plain dict attributes, tuple events), and a
    span whose limits dropped attributes, events and links."""
    limits = SpanLimits(max_span_attributes=2, max_events=1, max_links=1)
    tp = TracerProvider(span_limits=limits, resource=Resource.create({"service.name": "odd"}))
    exporter = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    remote = SpanContext(0xA1, 0xB2, is_remote=True, trace_flags=TraceFlags(1))
    links = [Link(remote, {"n": i}) for i in range(3)]
    with tp.get_tracer("t").start_as_current_span("limited", links=links) as span:
        span.set_attributes({"a": 1, "b": 2, "c": 3})
        for i in range(3):
            span.add_event(f"e{i}", {"i": i})
    limited = exporter.get_finished_spans()[0]
    context = SpanContext(0xC3, 0xD4, is_remote=False, trace_flags=TraceFlags(1))
    fields: dict[str, Any] = {
        "name": "direct",
        "context": context,
        "parent": remote,
        "resource": limited.resource,
        "attributes": {"x": "y", "n": 2},
        "events": (Event("ev", {"k": 1}, timestamp=5),),
        "links": (Link(remote),),
        "kind": SpanKind.SERVER,
        "status": Status(StatusCode.ERROR, "bad"),
        "start_time": 10,
        "end_time": 20,
        "instrumentation_scope": limited.instrumentation_scope,
    }
    return [limited, ReadableSpan(**fields), _RenamedSpan(**fields)]


def test_pipeline_encoder_follows_properties_and_limits(span_encoder: Any) -> None:
    spans = _odd_spans()
    limited = spans[0]
    assert (limited.dropped_attributes, limited.dropped_events, limited.dropped_links) == (1, 2, 2)
    _same(spans)
    assert b"renamed" in span_encoding.encode_span(spans[2])


def test_pipeline_recording_json_follows_properties_and_limits() -> None:
    _same_json(_odd_spans())
