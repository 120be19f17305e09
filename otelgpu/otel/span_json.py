"""OTLP/JSON of finished spans for the local recording, built as plain dicts.

The recording's line used to be ``json_format.MessageToDict`` of the SDK's protobuf
request: protobuf's JSON printer walks every field in Python (hundreds of µs per batch
of spans). :func:`span_dict` builds the same structure straight from the SDK span, and
:func:`request_line` groups spans like the SDK and dumps one line. Contract: the parsed
line equals ``to_json_line(encode_spans(spans))`` of ``otelgpu.otel.recording`` (OTLP/JSON:
lowerCamelCase keys, enums as integers, 64-bit integers as strings, ids in hex, defaults
omitted); ``tests/pipeline/test_pipeline_span_encoding.py`` checks it.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otelgpu import _impl
from otelgpu.otel import span_encoding

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _value(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        if value < _INT64_MIN or value > _INT64_MAX:
            raise ValueError(value)
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"doubleValue": "NaN"}
        if math.isinf(value):
            return {"doubleValue": "Infinity" if value > 0 else "-Infinity"}
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Sequence):
        values = [_value(v) for v in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        kvs = [{"key": str(k), "value": _value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": kvs} if kvs else {}}
    raise ValueError(value)


_INF = float("inf")


def attributes_json(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """OTLP/JSON ``KeyValue`` list of ``attributes``; values the SDK's encoder drops are
    dropped (shared with ``otelgpu.otel.metric_json``)."""
    out: list[dict[str, Any]] = []
    if attributes:
        append = out.append
        for key, value in getattr(attributes, "_dict", attributes).items():
            t = type(value)  # fast paths for the hot types; the rest via _value
            if t is float and value == value and value not in (_INF, -_INF):
                append({"key": key, "value": {"doubleValue": value}})
            elif t is str:
                append({"key": key, "value": {"stringValue": value}})
            elif t is int and _INT64_MIN <= value <= _INT64_MAX:
                append({"key": key, "value": {"intValue": str(value)}})
            else:
                try:
                    append({"key": key, "value": _value(value)})
                except ValueError:  # what the SDK's encoder drops, we drop too
                    continue
    return out


def _put_attributes(
    out: dict[str, Any], attributes: Mapping[str, Any] | None, dropped: int
) -> None:
    """``attributes`` and ``droppedAttributesCount`` of ``out``, each only when not empty."""
    encoded = attributes_json(attributes)
    if encoded:
        out["attributes"] = encoded
    if dropped:
        out["droppedAttributesCount"] = dropped


def _flags(parent: Any) -> int:
    return 0x300 if parent is not None and parent.is_remote else 0x100


def span_dict(span: Any) -> dict[str, Any]:
    """One span as OTLP/JSON (a dict ready for ``json.dumps``)."""
    ctx = span.get_span_context()
    out: dict[str, Any] = {
        "traceId": format(ctx.trace_id, "032x"),
        "spanId": format(ctx.span_id, "016x"),
    }
    state = ctx.trace_state
    if state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in state.items())
    parent = span.parent
    if parent:
        out["parentSpanId"] = format(parent.span_id, "016x")
    if span.name:
        out["name"] = span.name
    out["kind"] = span.kind.value + 1
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    _put_attributes(out, span.attributes, span.dropped_attributes)
    events = []
    for event in span.events:
        e: dict[str, Any] = {}
        if event.timestamp:
            e["timeUnixNano"] = str(event.timestamp)
        if event.name:
            e["name"] = event.name
        _put_attributes(e, event.attributes, event.dropped_attributes)
        events.append(e)
    if events:
        out["events"] = events
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    links = []
    for link in span.links:
        d: dict[str, Any] = {
            "traceId": format(link.context.trace_id, "032x"),
            "spanId": format(link.context.span_id, "016x"),
        }
        _put_attributes(d, link.attributes, link.dropped_attributes)
        d["flags"] = _flags(link.context)
        links.append(d)
    if links:
        out["links"] = links
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status = span.status
    if status is not None:
        st: dict[str, Any] = {}
        if status.description:
            st["message"] = status.description
        if status.status_code.value:
            st["code"] = status.status_code.value
        out["status"] = st
    out["flags"] = _flags(parent)
    return out


def scope_json(scope: Any) -> dict[str, Any]:
    """OTLP/JSON ``InstrumentationScope`` of an SDK scope (``{}`` for ``None``)."""
    if scope is None:
        return {}
    out: dict[str, Any] = {}
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    attributes = attributes_json(scope.attributes)
    if attributes:
        out["attributes"] = attributes
    return out


def request_line(pairs: Sequence[tuple[Any, dict[str, Any]]]) -> str:
    """One recording line (an ``ExportTraceServiceRequest``) of ``(span, span_dict(span))``."""
    resource_spans = []
    for resource, scopes in span_encoding.group(pairs):
        scope_spans = []
        for scope, spans in scopes.items():
            ss: dict[str, Any] = {"scope": scope_json(scope), "spans": spans}
            if scope is not None and scope.schema_url:
                ss["schemaUrl"] = scope.schema_url
            scope_spans.append(ss)
        res: dict[str, Any] = {}
        ra = attributes_json(resource.attributes)
        if ra:
            res["attributes"] = ra
        rs: dict[str, Any] = {"resource": res, "scopeSpans": scope_spans}
        if resource.schema_url:
            rs["schemaUrl"] = resource.schema_url
        resource_spans.append(rs)
    return json.dumps({"resourceSpans": resource_spans}, separators=(",", ":"))


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def py_span_text(span: Any) -> str:
    """:func:`span_dict` of ``span`` as JSON text: one untracked string instead of a tree
    of dicts, so spans encoded ahead of sending cost the garbage collector nothing. The
    pure-Python twin of ``otelgpu.otel._otlp_c.span_text``."""
    return _dumps(span_dict(span))


_native = _impl.native_module("otelgpu.otel._otlp_c")
#: :func:`py_span_text`, native when the core loaded (the same text).
span_text: Callable[[Any], str] = _native.span_text if _native is not None else py_span_text


def request_line_text(pairs: Sequence[tuple[Any, str]]) -> str:
    """:func:`request_line` of ``(span, span_text(span))`` pairs: the same line, character
    for character, spliced from the spans' JSON text."""
    resource_spans = []
    for resource, scopes in span_encoding.group(pairs):
        scope_spans = []
        for scope, texts in scopes.items():
            part = '{"scope":' + _dumps(scope_json(scope)) + ',"spans":[' + ",".join(texts) + "]"
            if scope is not None and scope.schema_url:
                part += ',"schemaUrl":' + _dumps(scope.schema_url)
            scope_spans.append(part + "}")
        res: dict[str, Any] = {}
        ra = attributes_json(resource.attributes)
        if ra:
            res["attributes"] = ra
        part = '{"resource":' + _dumps(res) + ',"scopeSpans":[' + ",".join(scope_spans) + "]"
        if resource.schema_url:
            part += ',"schemaUrl":' + _dumps(resource.schema_url)
        resource_spans.append(part + "}")
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}"
