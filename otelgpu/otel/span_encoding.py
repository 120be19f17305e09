"""OTLP protobuf encoding of finished spans, written straight to bytes.

The SDK's encoder (``opentelemetry.exporter.otlp.proto.common``) builds one protobuf
object per span, attribute, value and event, in Python: 75-135 µs per otelgpu span with
15 attributes -- more than the span itself. This encoder writes the protobuf wire format
directly, with the encoded key of every attribute name and the whole key/value of repeated
string and boolean attributes (a model name, a GPU UUID) cached, about 5x faster.

Contract: ``encode_request(spans)`` is an ``ExportTraceServiceRequest`` whose decoding
equals ``encode_spans(spans)`` of the SDK (same grouping by resource and scope, in order
of first appearance; same span flags, kind mapping, status, ids), and is byte-for-byte
the SDK's serialization (fields in field-number order, defaults omitted, oneof values
always written) -- ``tests/pipeline/test_pipeline_span_encoding.py`` checks both.
Values the SDK would refuse (an int beyond int64) are left out, as the SDK does.

Work can be sliced: :func:`encode_span` encodes one span (no shared state but the
bounded caches), :func:`assemble` frames already encoded spans into a request, so a
background exporter can yield the GIL between spans (``otelgpu.otel.processor``).
Thread-safe: the caches are plain dicts (atomic get/set under the GIL) and bounded.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from otelgpu import _impl
from otelgpu.otel import slicing

_logger = logging.getLogger("otelgpu")

_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack
_pack_i = struct.Struct("<I").pack
_MASK64 = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_CACHE_LIMIT = 4096

_SMALL = [bytes([i]) for i in range(128)]


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + payload


_key_cache: dict[str, bytes] = {}
_kv_cache: dict[tuple[bytes, str, Any, type], bytes] = {}


def _key(key: str) -> bytes:
    encoded = _key_cache.get(key)
    if encoded is None:
        encoded = _ld(b"\x0a", key.encode("utf-8"))  # KeyValue.key
        if len(_key_cache) >= _CACHE_LIMIT:
            _key_cache.clear()
        _key_cache[key] = encoded
    return encoded


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message body (the oneof field is always written)."""
    if value is None:
        return b""
    t = type(value)
    if t is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if t is str:
        return _ld(b"\x0a", value.encode("utf-8"))
    if t is int:
        if value < _INT64_MIN or value > _INT64_MAX:
            raise ValueError(f"int out of int64 range: {value}")
        return b"\x18" + _varint(value & _MASK64)
    if t is float:
        return b"\x21" + _pack_d(value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _ld(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        return _any_value(int(value))
    if isinstance(value, float):
        return b"\x21" + _pack_d(float(value))
    if isinstance(value, bytes):
        return _ld(b"\x3a", value)
    if isinstance(value, Sequence):
        inner = b"".join(_ld(b"\x0a", _any_value(v)) for v in value)  # ArrayValue.values
        return _ld(b"\x2a", inner)
    if isinstance(value, Mapping):
        inner = b"".join(_ld(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        return _ld(b"\x32", inner)
    raise ValueError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message body."""
    return _key(key) + _ld(b"\x12", _any_value(value))


_float_prefix: dict[tuple[bytes, str], bytes] = {}


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """Each attribute as one repeated ``KeyValue`` field with ``tag``.

    Fast paths (the hot attribute types): a float is a cached prefix (tag, length, key,
    value header: all fixed for a given key) plus 8 bytes; a str or bool key/value pair
    is cached whole; a small non-negative int is framed in place.
    """
    if not attributes:
        return []
    out: list[bytes] = []
    append = out.append
    kv_cache = _kv_cache
    small = _SMALL
    # BoundedAttributes is a MutableMapping whose items() iterate through the generic
    # (slow) ABC machinery; its plain dict iterates in the same order.
    plain = getattr(attributes, "_dict", attributes)
    for key, value in plain.items():
        t = type(value)
        if t is float:
            prefix = _float_prefix.get((tag, key))
            if prefix is None:
                kb = _key(key)
                prefix = tag + _varint(len(kb) + 11) + kb + b"\x12\x09\x21"
                if len(_float_prefix) >= _CACHE_LIMIT:
                    _float_prefix.clear()
                _float_prefix[(tag, key)] = prefix
            append(prefix + _pack_d(value))
            continue
        if t is int and 0 <= value < 128:
            kb = _key(key)
            n = len(kb) + 4
            if n < 128:
                append(tag + small[n] + kb + b"\x12\x02\x18" + small[value])
                continue
        if t is str or t is bool:
            cache_key = (tag, key, value, t)
            field = kv_cache.get(cache_key)
            if field is None:
                try:
                    field = _ld(tag, _key_value(key, value))
                except UnicodeEncodeError as exc:  # a lone surrogate: the SDK skips it too
                    _logger.debug("otelgpu: attribute %s not encoded: %r", key, exc)
                    continue
                if len(kv_cache) >= _CACHE_LIMIT:
                    kv_cache.clear()
                kv_cache[cache_key] = field
            append(field)
            continue
        try:
            append(_ld(tag, _key_value(key, value)))
        except Exception as exc:  # noqa: BLE001 - the SDK logs and drops the attribute too
            _logger.debug("otelgpu: attribute %s not encoded: %r", key, exc)
    return out


def py_attributes_bytes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as one repeated ``KeyValue`` field with the one-byte field ``tag``,
    concatenated: the pure-Python twin of ``otelgpu.otel._otlp_c.attributes_bytes``."""
    return b"".join(_attributes(tag, attributes))


def attribute_bytes(tag: bytes, key: str, value: Any) -> bytes:
    """One attribute's ``KeyValue`` field (b"" where the SDK's encoder skips it): what the
    native encoder asks of this module for a value that is not plain."""
    return b"".join(_attributes(tag, {key: value}))


_native = _impl.native_module("otelgpu.otel._otlp_c")
#: :func:`py_attributes_bytes`, native when the core loaded (same bytes).
attributes_bytes: Callable[[bytes, Mapping[str, Any] | None], bytes] = (
    _native.attributes_bytes if _native is not None else py_attributes_bytes
)


def _flags(parent: Any) -> bytes:
    # SpanFlags: HAS_IS_REMOTE (0x100), plus IS_REMOTE (0x200) for a remote parent.
    return _pack_i(0x300 if parent is not None and parent.is_remote else 0x100)


# Reading a span field through the SDK's property is a Python call per field (about
# twenty a span, and ``events``/``links`` copy their list under its lock). For a span
# whose class uses the SDK's own properties unchanged, the fields are read from the
# instance dict instead -- the same objects the properties return -- as the native
# encoder does. Checked once per class.
_SPAN_PROPERTIES = (
    "name", "kind", "parent", "start_time", "end_time", "status", "attributes", "events",
    "links", "dropped_attributes", "dropped_events", "dropped_links", "context",
)  # fmt: skip
_direct_layout: dict[type, bool] = {}
#: id(member) -> value of SpanKind and StatusCode (an enum's ``.value`` is a Python call).
_ENUM_VALUES: dict[int, int] = {id(m): m.value for m in (*SpanKind, *StatusCode)}


def _sdk_layout(cls: type) -> bool:
    """Whether ``cls`` is an SDK ReadableSpan whose field properties are the SDK's own."""
    known = _direct_layout.get(cls)
    if known is not None:
        return known
    try:
        ok = (
            issubclass(cls, ReadableSpan)
            and all(getattr(cls, n) is getattr(ReadableSpan, n) for n in _SPAN_PROPERTIES)
            and any(
                cls.get_span_context is f
                for f in (ReadableSpan.get_span_context, SdkSpan.get_span_context)
            )
        )
    except Exception:  # noqa: BLE001 - another SDK layout: the properties are read
        ok = False
    if len(_direct_layout) < 64:
        _direct_layout[cls] = ok
    return ok


def _bounded(items: Any) -> tuple[Any, int]:
    """(items, dropped) of an SDK BoundedList -- its deque, uncopied -- or (items, 0)."""
    if isinstance(items, BoundedList):
        bounded: Any = items
        return bounded._dq, bounded.dropped
    return items, 0


def _span_fields(span: Any) -> tuple[Any, ...]:
    """(context, parent, name, kind, start, end, attributes, dropped attributes, events,
    dropped events, links, dropped links, status) of ``span``, as its properties give them
    (attributes: the plain dict where there is one). The twin of the native encoder's."""
    if _sdk_layout(type(span)):
        d = span.__dict__
        attributes: Any = d["_attributes"]
        dropped_attributes = 0
        if isinstance(attributes, BoundedAttributes):
            dropped_attributes = attributes.dropped
            plain = attributes._dict
            if type(plain) is dict:
                attributes = plain
        elif not attributes:
            attributes = {}
        events, dropped_events = _bounded(d["_events"])
        links, dropped_links = _bounded(d["_links"])
        return (
            d["_context"], d["_parent"], d["_name"], d["_kind"], d["_start_time"],
            d["_end_time"], attributes, dropped_attributes, events, dropped_events, links,
            dropped_links, d["_status"],
        )  # fmt: skip
    own = getattr(getattr(span, "_attributes", None), "_dict", None)
    return (
        span.get_span_context(), span.parent, span.name, span.kind, span.start_time,
        span.end_time, own if type(own) is dict else span.attributes,
        span.dropped_attributes, span.events, span.dropped_events, span.links,
        span.dropped_links, span.status,
    )  # fmt: skip


def _enum_value(member: Any) -> int:
    value = _ENUM_VALUES.get(id(member))
    return member.value if value is None else value


def py_encode_span(span: Any) -> bytes:
    """One ``Span`` message body (an SDK ``ReadableSpan``): the pure-Python twin of
    ``otelgpu.otel._otlp_c.encode_span``."""
    (ctx, parent, name, kind, start, end, attributes, dropped, events, dropped_events,
     links, dropped_links, status) = _span_fields(span)  # fmt: skip
    exact = type(ctx) is SpanContext  # a tuple: its fields by position, not properties
    parts = [
        b"\x0a\x10" + (ctx[0] if exact else ctx.trace_id).to_bytes(16, "big"),
        b"\x12\x08" + (ctx[1] if exact else ctx.span_id).to_bytes(8, "big"),
    ]
    state = ctx[4] if exact else ctx.trace_state
    if state:
        parts.append(_ld(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode()))
    if parent:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if name:
        parts.append(_ld(b"\x2a", name.encode("utf-8")))
    parts.append(b"\x30" + _SMALL[_enum_value(kind) + 1])
    if start:
        parts.append(b"\x39" + _pack_q(start))
    if end:
        parts.append(b"\x41" + _pack_q(end))
    parts.append(attributes_bytes(b"\x4a", attributes))
    if dropped:
        parts.append(b"\x50" + _varint(dropped))
    for event in events:
        body = []
        if event.timestamp:
            body.append(b"\x09" + _pack_q(event.timestamp))
        if event.name:
            body.append(_ld(b"\x12", event.name.encode("utf-8")))
        body.append(attributes_bytes(b"\x1a", event.attributes))
        if event.dropped_attributes:
            body.append(b"\x20" + _varint(event.dropped_attributes))
        parts.append(_ld(b"\x5a", b"".join(body)))
    if dropped_events:
        parts.append(b"\x60" + _varint(dropped_events))
    for link in links:
        body = [
            b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + link.context.span_id.to_bytes(8, "big"),
        ]
        body.append(attributes_bytes(b"\x22", link.attributes))
        if link.dropped_attributes:
            body.append(b"\x28" + _varint(link.dropped_attributes))
        body.append(b"\x35" + _flags(link.context))
        parts.append(_ld(b"\x6a", b"".join(body)))
    if dropped_links:
        parts.append(b"\x70" + _varint(dropped_links))
    if status is not None:
        body = []
        if type(status) is Status:
            description, code = status._description, _enum_value(status._status_code)
        else:
            description, code = status.description, _enum_value(status.status_code)
        if description:
            body.append(_ld(b"\x12", description.encode("utf-8")))
        if code:
            body.append(b"\x18" + _varint(code))
        parts.append(_ld(b"\x7a", b"".join(body)))
    parts.append(b"\x85\x01" + _flags(parent))
    return b"".join(parts)


#: :func:`py_encode_span`, native when the core loaded (same bytes).
encode_span: Callable[[Any], bytes] = _native.encode_span if _native is not None else py_encode_span


_resource_cache: dict[int, tuple[Any, bytes]] = {}
_scope_cache: dict[Any, bytes] = {}


def _resource(resource: Any) -> bytes:
    """``Resource`` message body (cached per resource object, kept alive by the cache)."""
    hit = _resource_cache.get(id(resource))
    if hit is not None and hit[0] is resource:
        return hit[1]
    encoded = attributes_bytes(b"\x0a", resource.attributes)
    if len(_resource_cache) >= 64:
        _resource_cache.clear()
    _resource_cache[id(resource)] = (resource, encoded)
    return encoded


def _scope(scope: Any) -> bytes:
    """``InstrumentationScope`` message body (cached per scope)."""
    if scope is None:
        return b""
    encoded = _scope_cache.get(scope)
    if encoded is None:
        parts = []
        if scope.name:
            parts.append(_ld(b"\x0a", scope.name.encode("utf-8")))
        if scope.version:
            parts.append(_ld(b"\x12", scope.version.encode("utf-8")))
        parts.append(attributes_bytes(b"\x1a", scope.attributes))
        encoded = b"".join(parts)
        if len(_scope_cache) >= 256:
            _scope_cache.clear()
        _scope_cache[scope] = encoded
    return encoded


#: Spans framed between two :func:`otelgpu.otel.slicing.tick` calls while a batch is
#: grouped and assembled (a batch of 512 is ~1-2 ms of Python on the export thread).
TICK_EVERY = 64


def group(encoded: Iterable[tuple[Any, Any]]) -> list[tuple[Any, dict[Any, list[Any]]]]:
    """``(span, item)`` pairs grouped by resource then instrumentation scope, in order of
    first appearance (as the SDK groups them): ``[(resource, {scope: [item, ...]})]``."""
    pairs = encoded if isinstance(encoded, list) else list(encoded)
    if not pairs:
        return []
    tick = slicing.tick
    # The usual batch: every span from one provider and one tracer (checked by identity).
    first = pairs[0][0]
    resource, scope = first.resource, first.instrumentation_scope
    for k in range(0, len(pairs), TICK_EVERY):
        for span, _ in pairs[k : k + TICK_EVERY]:
            if span.resource is not resource or span.instrumentation_scope is not scope:
                return _group_mixed(pairs)
        tick()
    return [(resource, {scope or None: [item for _, item in pairs]})]


def _group_mixed(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, dict[Any, list[Any]]]]:
    # Group by resource identity first: an SDK Resource hashes by JSON-dumping its
    # attributes (tens of µs). Equal but distinct resources are merged afterwards.
    tick = slicing.tick
    by_id: dict[int, tuple[Any, dict[Any, list[Any]]]] = {}
    for n, (span, item) in enumerate(pairs, 1):
        resource = span.resource
        entry = by_id.get(id(resource))
        if entry is None:
            entry = by_id[id(resource)] = (resource, {})
        scopes = entry[1]
        scope = span.instrumentation_scope or None
        items = scopes.get(scope)
        if items is None:
            items = scopes[scope] = []
        items.append(item)
        if n % TICK_EVERY == 0:
            tick()
    groups: list[tuple[Any, dict[Any, list[Any]]]] = []
    for resource, scopes in by_id.values():
        for known, known_scopes in groups:
            if known == resource:
                for scope, items in scopes.items():
                    known_scopes.setdefault(scope, []).extend(items)
                break
        else:
            groups.append((resource, scopes))
    return groups


def assemble(encoded: Iterable[tuple[Any, bytes]]) -> bytes:
    """An ``ExportTraceServiceRequest`` of ``(span, encode_span(span))`` pairs, grouped by
    resource then instrumentation scope in order of first appearance (as the SDK does).

    The request is written with one join of its pieces (the nested messages' lengths are
    summed, not measured on copies: each copy of a large request is a C call holding the
    GIL, page faults included). On a background thread it hands the GIL back
    (``slicing.tick``) every :data:`TICK_EVERY` spans once its slice is used up."""
    tick = slicing.tick
    out: list[bytes] = []
    for resource, scopes in group(encoded):
        head = _ld(b"\x0a", _resource(resource))
        rs, rs_len = [head], len(head)
        for scope, bodies in scopes.items():
            head = _ld(b"\x0a", _scope(scope))
            ss, ss_len = [head], len(head)
            for k in range(0, len(bodies), TICK_EVERY):
                for body in bodies[k : k + TICK_EVERY]:
                    n = len(body)
                    head = b"\x12" + (_SMALL[n] if n < 128 else _varint(n))
                    ss += (head, body)
                    ss_len += len(head) + n
                tick()
            schema = scope.schema_url if scope is not None else ""
            if schema:
                tail = _ld(b"\x1a", schema.encode("utf-8"))
                ss.append(tail)
                ss_len += len(tail)
            head = b"\x12" + _varint(ss_len)
            rs.append(head)
            rs += ss
            rs_len += len(head) + ss_len
        if resource.schema_url:
            tail = _ld(b"\x1a", resource.schema_url.encode("utf-8"))
            rs.append(tail)
            rs_len += len(tail)
        out.append(b"\x0a" + _varint(rs_len))
        out += rs
    return b"".join(out)


def encode_request(spans: Sequence[Any]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans`` (see the module docstring)."""
    return assemble((span, encode_span(span)) for span in spans)
