# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False
"""Native twins of ``otelgpu.otel.span_encoding`` (``attributes_bytes``: OTLP ``KeyValue``
fields; ``encode_span``: a whole ``Span`` message), of
``otelgpu.otel.metric_protobuf.py_number_points`` (gauge and sum data points) and of
``otelgpu.otel.span_attributes.py_plain_values``, written in C.

A span or data point's attributes are the bulk of its encoding (a request span has 26):
the pure-Python encoder spends ~0.35 µs on each, this one ~30 ns. Plain values -- exact
``str``, ``bool``, ``int`` within int64, ``float``, and tuples or lists of those -- are
written here, sizes first, into one growing buffer; any other value (a subclass, bytes,
a mapping, a nested sequence, an int beyond int64, a string that is not valid UTF-8)
goes to the twin's own code for that one attribute, so both produce the same bytes,
skipped attributes included. Holds the GIL (it reads Python objects); no state.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.math cimport isfinite
from libc.stdio cimport snprintf
from libc.string cimport memcpy, memmove, strlen

cdef extern from "Python.h":
    bint PyFloat_CheckExact(object)
    bint PyLong_CheckExact(object)
    bint PyBool_Check(object)
    bint PyUnicode_CheckExact(object)
    bint PyTuple_CheckExact(object)
    bint PyList_CheckExact(object)
    bint PyDict_CheckExact(object)
    double PyFloat_AS_DOUBLE(object)
    long long PyLong_AsLongLongAndOverflow(object, int *) except? -1
    const char *PyUnicode_AsUTF8AndSize(object, Py_ssize_t *)
    Py_ssize_t PySequence_Fast_GET_SIZE(object)
    PyObject *PySequence_Fast_GET_ITEM(object, Py_ssize_t)
    void PyErr_Clear()
    object PyUnicode_DecodeASCII(const char *, Py_ssize_t, const char *)
    char *PyOS_double_to_string(double, char, int, int, int *) except NULL
    void PyMem_Free(void *)
    int Py_DTSF_ADD_DOT_0

# Kinds of a plain value.
cdef enum:
    K_OTHER = 0
    K_STR = 1
    K_BOOL = 2
    K_INT = 3
    K_FLOAT = 4

cdef object _INT64_MIN = -(1 << 63)
cdef object _INT64_MAX = (1 << 63) - 1


cdef struct Buf:
    char *data
    Py_ssize_t size
    Py_ssize_t cap

# A plain scalar, classified and measured once.
cdef struct Scalar:
    int kind
    const char *text  # K_STR: UTF-8 (owned by the str object)
    Py_ssize_t n  # K_STR: bytes of text
    uint64_t bits  # K_BOOL: 0/1; K_INT: two's complement; K_FLOAT: IEEE bits
    Py_ssize_t size  # AnyValue message size


cdef inline int _varint_size(uint64_t v) noexcept nogil:
    cdef int n = 1
    while v >= 128:
        v >>= 7
        n += 1
    return n


cdef int _reserve(Buf *b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t want = b.size + extra
    cdef Py_ssize_t cap
    cdef char *grown
    if want <= b.cap:
        return 0
    cap = b.cap * 2 if b.cap else 256
    while cap < want:
        cap *= 2
    grown = <char *>realloc(b.data, cap)
    if grown == NULL:
        raise MemoryError()
    b.data = grown
    b.cap = cap
    return 0


cdef inline void _byte(Buf *b, uint8_t v) noexcept:
    b.data[b.size] = <char>v
    b.size += 1


cdef inline void _varint(Buf *b, uint64_t v) noexcept:
    while v >= 128:
        b.data[b.size] = <char>((v & 0x7F) | 0x80)
        b.size += 1
        v >>= 7
    b.data[b.size] = <char>v
    b.size += 1


cdef inline void _raw(Buf *b, const char *p, Py_ssize_t n) noexcept:
    memcpy(b.data + b.size, p, n)
    b.size += n


cdef inline void _fixed64(Buf *b, uint64_t v) noexcept:
    cdef int k
    for k in range(8):
        b.data[b.size + k] = <char>((v >> (8 * k)) & 0xFF)
    b.size += 8


cdef int _scalar(object value, Scalar *s) except -1:
    """Classifies a plain scalar and measures its ``AnyValue``; K_OTHER otherwise."""
    cdef int overflow = 0
    cdef long long i
    cdef double d
    s.kind = K_OTHER
    if PyUnicode_CheckExact(value):
        s.text = PyUnicode_AsUTF8AndSize(value, &s.n)
        if s.text == NULL:  # not encodable (a lone surrogate): the twin decides
            PyErr_Clear()
            return 0
        s.kind = K_STR
        s.size = 1 + _varint_size(<uint64_t>s.n) + s.n
    elif PyBool_Check(value):
        s.kind = K_BOOL
        s.bits = 1 if value is True else 0
        s.size = 2
    elif PyLong_CheckExact(value):
        i = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return 0
        s.kind = K_INT
        s.bits = <uint64_t>i
        s.size = 1 + _varint_size(s.bits)
    elif PyFloat_CheckExact(value):
        d = PyFloat_AS_DOUBLE(value)
        memcpy(&s.bits, &d, 8)
        s.kind = K_FLOAT
        s.size = 9
    return 0


cdef void _put_scalar(Buf *b, Scalar *s) noexcept:
    """Writes the ``AnyValue`` body of ``s`` (space reserved by the caller)."""
    if s.kind == K_STR:
        _byte(b, 0x0A)
        _varint(b, <uint64_t>s.n)
        _raw(b, s.text, s.n)
    elif s.kind == K_BOOL:
        _byte(b, 0x10)
        _byte(b, <uint8_t>s.bits)
    elif s.kind == K_INT:
        _byte(b, 0x18)
        _varint(b, s.bits)
    else:
        _byte(b, 0x21)
        _fixed64(b, s.bits)


cdef int _put_key(Buf *b, uint8_t tag, const char *key, Py_ssize_t key_n,
                  Py_ssize_t any_size) except -1:
    """A ``KeyValue`` field up to its ``AnyValue`` body (``any_size`` bytes, written next by
    the caller): room reserved for all of it."""
    cdef Py_ssize_t kv = (1 + _varint_size(<uint64_t>key_n) + key_n
                          + 1 + _varint_size(<uint64_t>any_size) + any_size)
    _reserve(b, 1 + _varint_size(<uint64_t>kv) + kv)
    _byte(b, tag)
    _varint(b, <uint64_t>kv)
    _byte(b, 0x0A)
    _varint(b, <uint64_t>key_n)
    _raw(b, key, key_n)
    _byte(b, 0x12)
    _varint(b, <uint64_t>any_size)
    return 0


cdef int _put_attribute(Buf *b, uint8_t tag, object key, object value, object slow) except -1:
    """One ``KeyValue`` field; ``slow(tag, key, value)`` (the twin) for what is not plain."""
    cdef Scalar s
    cdef Scalar *items = NULL
    cdef Scalar small[16]
    cdef Py_ssize_t key_n, n, k, inner, any_size
    cdef const char *key_text
    cdef object encoded
    if PyUnicode_CheckExact(key):
        key_text = PyUnicode_AsUTF8AndSize(key, &key_n)
        if key_text == NULL:
            PyErr_Clear()
            key_text = NULL
    else:
        key_text = NULL
    if key_text == NULL:
        encoded = slow(bytes([tag]), key, value)
        _append_bytes(b, encoded)
        return 0
    if PyTuple_CheckExact(value) or PyList_CheckExact(value):
        n = PySequence_Fast_GET_SIZE(value)
        if n <= 16:
            items = &small[0]
        else:
            items = <Scalar *>malloc(n * sizeof(Scalar))
        if items == NULL:
            raise MemoryError()
        try:
            inner = 0
            for k in range(n):
                _scalar(<object>PySequence_Fast_GET_ITEM(value, k), &items[k])
                if items[k].kind == K_OTHER:
                    encoded = slow(bytes([tag]), key, value)
                    _append_bytes(b, encoded)
                    return 0
                inner += 1 + _varint_size(<uint64_t>items[k].size) + items[k].size
            any_size = 1 + _varint_size(<uint64_t>inner) + inner
            _put_key(b, tag, key_text, key_n, any_size)
            _byte(b, 0x2A)
            _varint(b, <uint64_t>inner)
            for k in range(n):
                _byte(b, 0x0A)
                _varint(b, <uint64_t>items[k].size)
                _put_scalar(b, &items[k])
        finally:
            if items != &small[0]:
                free(items)
        return 0
    _scalar(value, &s)
    if s.kind == K_OTHER:
        encoded = slow(bytes([tag]), key, value)
        _append_bytes(b, encoded)
        return 0
    _put_key(b, tag, key_text, key_n, s.size)
    _put_scalar(b, &s)
    return 0


cdef int _append_bytes(Buf *b, object encoded) except -1:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(encoded)
    _reserve(b, n)
    _raw(b, PyBytes_AS_STRING(encoded), n)
    return 0


_slow = None


def _twin_attribute(tag, key, value):
    """The twin's bytes for one attribute (imported lazily: the twin imports this module)."""
    global _slow
    if _slow is None:
        from otelgpu.otel.span_encoding import attribute_bytes

        _slow = attribute_bytes
    return _slow(tag, key, value)


cdef int _put_attributes(Buf *b, uint8_t tag, object attributes) except -1:
    """Each attribute as one repeated ``KeyValue`` field with field tag ``tag``."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *k
    cdef PyObject *v
    if not attributes:
        return 0
    plain = getattr(attributes, "_dict", attributes)
    if PyDict_CheckExact(plain):
        while PyDict_Next(plain, &pos, &k, &v):
            key = <object>k  # own references: the twin's code may run meanwhile
            value = <object>v
            _put_attribute(b, tag, key, value, _twin_attribute)
    else:
        for key, value in plain.items():
            _put_attribute(b, tag, key, value, _twin_attribute)
    return 0


def attributes_bytes(bytes tag, attributes):
    """Each attribute of ``attributes`` as one repeated ``KeyValue`` field with the
    one-byte field tag ``tag``, concatenated (b"" for none)."""
    cdef Buf b
    if not attributes:
        return b""
    if len(tag) != 1:
        raise ValueError("tag must be one byte")
    b.data = NULL
    b.size = 0
    b.cap = 0
    try:
        _put_attributes(&b, <uint8_t>tag[0], attributes)
        return PyBytes_FromStringAndSize(b.data, b.size)
    finally:
        free(b.data)


# --------------------------------------------------------------------------- spans
cdef int _put_payload(Buf *b, uint8_t tag, const char *p, Py_ssize_t n) except -1:
    """A length-delimited field: tag, length, ``n`` bytes at ``p``."""
    _reserve(b, 1 + _varint_size(<uint64_t>n) + n)
    _byte(b, tag)
    _varint(b, <uint64_t>n)
    if n:
        _raw(b, p, n)
    return 0


cdef int _put_bytes(Buf *b, uint8_t tag, bytes payload) except -1:
    return _put_payload(b, tag, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))


cdef int _put_id(Buf *b, uint8_t tag, object value, int n) except -1:
    """A trace (16 bytes) or span (8 bytes) id, big-endian, as the SDK writes it."""
    cdef bytes raw = value.to_bytes(n, "big")
    return _put_bytes(b, tag, raw)


cdef int _put_varint_field(Buf *b, uint8_t tag, uint64_t v) except -1:
    _reserve(b, 11)
    _byte(b, tag)
    _varint(b, v)
    return 0


cdef int _put_fixed64_field(Buf *b, uint8_t tag, uint64_t v) except -1:
    _reserve(b, 9)
    _byte(b, tag)
    _fixed64(b, v)
    return 0


cdef int _put_flags(Buf *b, bytes tag, object context) except -1:
    """SpanFlags (fixed32): HAS_IS_REMOTE, plus IS_REMOTE for a remote ``context``."""
    cdef uint64_t flags = 0x300 if context is not None and _is_remote(context) else 0x100
    cdef int k
    _reserve(b, PyBytes_GET_SIZE(tag) + 4)
    _raw(b, PyBytes_AS_STRING(tag), PyBytes_GET_SIZE(tag))
    for k in range(4):
        _byte(b, <uint8_t>((flags >> (8 * k)) & 0xFF))
    return 0


# ------------------------------------------------------------------ span fields
# The SDK's ReadableSpan exposes its fields through Python properties (``span.name`` is
# ``return self._name``): ~1,000 instructions a read, about twenty reads a span. For a span
# whose class uses the SDK's own properties unchanged, the fields are read from the
# instance dict instead -- the same objects the properties return. Checked once per class.

_SPAN_PROPERTIES = (
    "name", "kind", "parent", "start_time", "end_time", "status", "attributes", "events",
    "links", "dropped_attributes", "dropped_events", "dropped_links", "context",
)

# SpanContext is a tuple (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid)
# whose fields are properties; enum members' ``.value`` is a Python-level descriptor. Both are
# read directly for the API's own classes (the same objects), the properties otherwise.
cdef object _SpanContextType = None
cdef object _StatusType = None
cdef dict _ENUM_VALUES = {}


cdef int _init_api_types() except -1:
    global _SpanContextType, _StatusType
    if _SpanContextType is None:
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

        for member in (*SpanKind, *StatusCode):
            _ENUM_VALUES[id(member)] = member.value
        _StatusType = Status
        _SpanContextType = SpanContext
    return 0


cdef inline object _trace_id(object ctx):
    return ctx[0] if type(ctx) is _SpanContextType else ctx.trace_id


cdef inline object _span_id(object ctx):
    return ctx[1] if type(ctx) is _SpanContextType else ctx.span_id


cdef inline object _is_remote(object ctx):
    return ctx[2] if type(ctx) is _SpanContextType else ctx.is_remote


cdef inline object _trace_state(object ctx):
    return ctx[4] if type(ctx) is _SpanContextType else ctx.trace_state


cdef inline object _enum_value(object member):
    value = _ENUM_VALUES.get(id(member))
    return member.value if value is None else value


cdef inline tuple _status_fields(object status):
    """(description, code value) of a Status."""
    if type(status) is _StatusType:
        return status._description, _enum_value(status._status_code)
    return status.description, _enum_value(status.status_code)

cdef dict _direct_layout = {}
cdef object _BoundedAttributes = None
cdef object _BoundedList = None


cdef bint _sdk_layout(object cls):
    """Whether ``cls`` is an SDK ReadableSpan whose field properties are the SDK's own."""
    global _BoundedAttributes, _BoundedList
    known = _direct_layout.get(cls)
    if known is not None:
        return known
    ok = False
    try:
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace import Span as SdkSpan
        from opentelemetry.sdk.util import BoundedList

        _BoundedAttributes, _BoundedList = BoundedAttributes, BoundedList
        ok = (
            issubclass(cls, ReadableSpan)
            and all(getattr(cls, n) is getattr(ReadableSpan, n) for n in _SPAN_PROPERTIES)
            and any(
                getattr(cls, "get_span_context") is f
                for f in (ReadableSpan.get_span_context, SdkSpan.get_span_context)
            )
        )
    except Exception:  # another SDK layout: the properties are read
        ok = False
    if len(_direct_layout) < 64:
        _direct_layout[cls] = ok
    return ok


cdef inline tuple _bounded(object items):
    """(items, dropped) of an SDK BoundedList -- its deque, uncopied -- or (items, 0)."""
    if isinstance(items, _BoundedList):
        return items._dq, items.dropped
    return items, 0


cdef tuple _span_fields(object span):
    """(context, parent, name, kind, start, end, attributes, dropped attributes, events,
    dropped events, links, dropped links, status) of ``span``, as its properties give them
    (attributes: the plain dict where there is one)."""
    if _sdk_layout(type(span)):
        d = span.__dict__
        attributes = d["_attributes"]
        dropped_attributes = 0
        if isinstance(attributes, _BoundedAttributes):
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
        )
    plain = getattr(getattr(span, "_attributes", None), "_dict", None)
    return (
        span.get_span_context(), span.parent, span.name, span.kind, span.start_time,
        span.end_time, plain if type(plain) is dict else span.attributes,
        span.dropped_attributes, span.events, span.dropped_events, span.links,
        span.dropped_links, span.status,
    )


def encode_span(span):
    """Native twin of ``otelgpu.otel.span_encoding.py_encode_span``: one ``Span`` message
    body of an SDK ``ReadableSpan`` (the same bytes)."""
    cdef Buf b
    cdef Buf inner
    b.data = inner.data = NULL
    b.size = inner.size = 0
    b.cap = inner.cap = 0
    _init_api_types()
    try:
        (ctx, parent, name, kind, start, end, attributes, dropped, events, dropped_events,
         links, dropped_links, status) = _span_fields(span)
        _put_id(&b, 0x0A, _trace_id(ctx), 16)
        _put_id(&b, 0x12, _span_id(ctx), 8)
        state = _trace_state(ctx)
        if state:
            _put_bytes(&b, 0x1A, ",".join([f"{k}={v}" for k, v in state.items()]).encode())
        if parent:
            _put_id(&b, 0x22, _span_id(parent), 8)
        if name:
            _put_bytes(&b, 0x2A, name.encode("utf-8"))
        _put_varint_field(&b, 0x30, _enum_value(kind) + 1)
        if start:
            _put_fixed64_field(&b, 0x39, start)
        if end:
            _put_fixed64_field(&b, 0x41, end)
        # The SDK's ReadableSpan.attributes is a read-only proxy; its BoundedAttributes'
        # plain dict (what _span_fields gives) holds the same items in order.
        _put_attributes(&b, 0x4A, attributes)
        if dropped:
            _put_varint_field(&b, 0x50, dropped)
        for event in events:
            inner.size = 0
            timestamp = event.timestamp
            if timestamp:
                _put_fixed64_field(&inner, 0x09, timestamp)
            event_name = event.name
            if event_name:
                _put_bytes(&inner, 0x12, event_name.encode("utf-8"))
            _put_attributes(&inner, 0x1A, event.attributes)
            if event.dropped_attributes:
                _put_varint_field(&inner, 0x20, event.dropped_attributes)
            _put_payload(&b, 0x5A, inner.data, inner.size)
        if dropped_events:
            _put_varint_field(&b, 0x60, dropped_events)
        for link in links:
            inner.size = 0
            link_ctx = link.context
            _put_id(&inner, 0x0A, _trace_id(link_ctx), 16)
            _put_id(&inner, 0x12, _span_id(link_ctx), 8)
            _put_attributes(&inner, 0x22, link.attributes)
            if link.dropped_attributes:
                _put_varint_field(&inner, 0x28, link.dropped_attributes)
            _put_flags(&inner, b"\x35", link_ctx)
            _put_payload(&b, 0x6A, inner.data, inner.size)
        if dropped_links:
            _put_varint_field(&b, 0x70, dropped_links)
        if status is not None:
            inner.size = 0
            description, code = _status_fields(status)
            if description:
                _put_bytes(&inner, 0x12, description.encode("utf-8"))
            if code:
                _put_varint_field(&inner, 0x18, code)
            _put_payload(&b, 0x7A, inner.data, inner.size)
        _put_flags(&b, b"\x85\x01", parent)
        return PyBytes_FromStringAndSize(b.data, b.size)
    finally:
        free(b.data)
        free(inner.data)


cdef inline bint _plain_scalar(object value):
    """A value the SDK stores unchanged: exact bool, int, float, bytes, or None."""
    return (
        value is None
        or PyFloat_CheckExact(value)
        or PyLong_CheckExact(value)  # bool is not an exact int: checked on its own
        or type(value) is bool
        or type(value) is bytes
    )


def plain_values(attributes, limit):
    """Native twin of ``otelgpu.otel.span_attributes.py_plain_values``: ``attributes`` as
    the SDK would store them on a span (lists as tuples), or ``None`` where a key or value
    needs the SDK's own cleaning. ``limit``: the span's value length limit, or ``None``."""
    cdef Py_ssize_t pos = 0, n, i, cap = -1
    cdef PyObject *k
    cdef PyObject *v
    cdef dict out = {}
    if limit is not None:
        cap = limit
    if not PyDict_CheckExact(attributes):
        attributes = dict(attributes.items())
    while PyDict_Next(attributes, &pos, &k, &v):
        key = <object>k
        value = <object>v
        if not PyUnicode_CheckExact(key) or len(<str>key) == 0:
            return None
        if PyUnicode_CheckExact(value):
            if cap >= 0 and len(<str>value) > cap:
                return None
        elif PyList_CheckExact(value) or PyTuple_CheckExact(value):
            n = PySequence_Fast_GET_SIZE(value)
            for i in range(n):
                item = <object>PySequence_Fast_GET_ITEM(value, i)
                if PyUnicode_CheckExact(item):
                    if cap >= 0 and len(<str>item) > cap:
                        return None
                elif not _plain_scalar(item):
                    return None
            if not PyTuple_CheckExact(value):
                value = tuple(value)
        elif not _plain_scalar(value):
            return None
        out[key] = value
    return out


# ------------------------------------------------------------- metric data points
_number_twin = None
_fixed_cls = None


cdef int _time_field(object value, uint64_t *out) noexcept:
    """A data point's time: 1 and ``*out`` for ``None`` (0: left out) or an exact int in
    [0, 2**63); 0 for anything else (the twin writes the point)."""
    cdef int overflow = 0
    cdef long long v
    if value is None:
        out[0] = 0
        return 1
    if not PyLong_CheckExact(value):
        return 0
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow or v < 0:
        return 0
    out[0] = <uint64_t>v
    return 1


cdef int _number_body(Buf *b, object point, bint start) except -1:
    """Writes one ``NumberDataPoint`` body into ``b`` (emptied first); 1 if done, 0 where
    the twin must write it (exemplars, or a time or value that is not a plain int/float)."""
    cdef uint64_t t_start = 0, t_time, bits
    cdef long long iv = 0
    cdef int overflow = 0
    cdef double d
    cdef bint as_int
    b.size = 0
    if point.exemplars:
        return 0
    if start and not _time_field(point.start_time_unix_nano, &t_start):
        return 0
    if not _time_field(point.time_unix_nano, &t_time):
        return 0
    value = point.value
    if PyFloat_CheckExact(value):
        as_int = False
        d = PyFloat_AS_DOUBLE(value)
        memcpy(&bits, &d, 8)
    elif PyBool_Check(value):
        as_int = True
        iv = 1 if value is True else 0
    elif PyLong_CheckExact(value):
        as_int = True
        iv = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:  # beyond int64: the twin raises as the SDK's encoder does
            return 0
    else:
        return 0
    _reserve(b, 27)
    if t_start:
        _byte(b, 0x11)
        _fixed64(b, t_start)
    if t_time:
        _byte(b, 0x19)
        _fixed64(b, t_time)
    if as_int:
        _byte(b, 0x31)
        _fixed64(b, <uint64_t>iv)
    else:
        _byte(b, 0x21)
        _fixed64(b, bits)
    attributes = point.attributes
    if type(attributes) is _fixed_cls:  # encoded once, kept on the set (the twin's rule)
        encoded = attributes.encoded
        if encoded is None:
            encoded = attributes.encoded = attributes_bytes(b"\x3a", attributes)
        _append_bytes(b, encoded)
    else:
        _put_attributes(b, 0x3A, attributes)
    return 1


def number_points(points, bint start, tick):
    """The ``data_points`` fields (field 1) of a gauge (``start`` false: no start time) or
    a sum: each ``NumberDataPoint`` length-delimited, concatenated; ``tick()`` before each
    point. Native twin of ``otelgpu.otel.metric_protobuf.py_number_points`` (same bytes,
    same errors): a point with exemplars, or a time or value that is not a plain int or
    float, is written by the twin's ``_number``."""
    global _number_twin, _fixed_cls
    cdef Buf out
    cdef Buf body
    if _number_twin is None:  # imported lazily: the twin's module imports this one
        from otelgpu.otel.metric_protobuf import FixedAttributes, _number

        _fixed_cls = FixedAttributes
        _number_twin = _number
    out.data = NULL
    out.size = 0
    out.cap = 0
    body.data = NULL
    body.size = 0
    body.cap = 0
    try:
        for point in points:
            tick()
            if _number_body(&body, point, start):
                _put_payload(&out, 0x0A, body.data, body.size)
            else:
                _put_bytes(&out, 0x0A, _number_twin(point, start))
        return PyBytes_FromStringAndSize(out.data, out.size)
    finally:
        free(out.data)
        free(body.data)


# --------------------------------------------------------------------------- OTLP/JSON
# Native twin of otelgpu.otel.span_json.span_text: the recording's JSON of one span,
# written as text. Exactly ``json.dumps`` of ``span_dict`` with separators (",", ":") and
# ASCII escaping: strings through json's own ``encode_basestring_ascii``, floats through
# ``float.__repr__`` (what json's encoder calls), anything unusual through the twin's code.
_json_twin = None


cdef object _json():
    """(encode_basestring_ascii, dumps, _value) of the twin, imported once, lazily (the twin
    imports this module)."""
    global _json_twin
    if _json_twin is None:
        from json.encoder import encode_basestring_ascii

        from otelgpu.otel import span_json

        _json_twin = (encode_basestring_ascii, span_json._dumps, span_json._value)
    return _json_twin


cdef int _put_text(Buf *b, object text) except -1:
    """An ASCII ``str`` (already JSON) as it is."""
    cdef Py_ssize_t n
    cdef const char *p = PyUnicode_AsUTF8AndSize(text, &n)
    if p == NULL:
        raise ValueError("not text")
    _reserve(b, n)
    _raw(b, p, n)
    return 0


cdef int _put_lit(Buf *b, const char *p) except -1:
    cdef Py_ssize_t n = strlen(p)
    _reserve(b, n)
    _raw(b, p, n)
    return 0


cdef int _put_json_str(Buf *b, object value, object escape) except -1:
    return _put_text(b, escape(value))


#: JSON of attribute keys (``"key"`` quoted and escaped), bounded like the key cache above.
cdef dict _json_keys = {}


cdef int _put_json_key(Buf *b, object key, object escape) except -1:
    encoded = _json_keys.get(key)
    if encoded is None:
        encoded = escape(key)
        if len(_json_keys) >= 4096:
            _json_keys.clear()
        _json_keys[key] = encoded
    return _put_text(b, encoded)


cdef int _put_double(Buf *b, double d) except -1:
    """``float.__repr__`` of a finite ``d`` (what json's encoder writes)."""
    cdef char *text = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        _put_lit(b, text)
    finally:
        PyMem_Free(text)
    return 0


cdef int _put_quoted_int(Buf *b, object value) except -1:
    cdef int overflow = 0
    cdef long long i = PyLong_AsLongLongAndOverflow(value, &overflow)
    cdef char digits[24]
    _put_lit(b, '"')
    if overflow or not PyLong_CheckExact(value):
        _put_text(b, int.__repr__(value))
    else:
        snprintf(digits, sizeof(digits), "%lld", i)
        _put_lit(b, digits)
    _put_lit(b, '"')
    return 0


cdef Py_ssize_t _put_json_attributes(Buf *b, object attributes, object twin) except -1:
    """The ``KeyValue`` objects of ``attributes``, comma-separated; returns how many (what
    the SDK's encoder drops is dropped, as the twin does)."""
    cdef Py_ssize_t written = 0
    if not attributes:
        return 0
    escape, dumps, value_json = twin
    for key, value in getattr(attributes, "_dict", attributes).items():
        if written:
            _put_lit(b, ",")
        if PyUnicode_CheckExact(key):
            if PyFloat_CheckExact(value) and isfinite(PyFloat_AS_DOUBLE(value)):
                _put_lit(b, '{"key":')
                _put_json_key(b, key, escape)
                _put_lit(b, ',"value":{"doubleValue":')
                _put_double(b, PyFloat_AS_DOUBLE(value))
                _put_lit(b, "}}")
                written += 1
                continue
            if PyUnicode_CheckExact(value):
                _put_lit(b, '{"key":')
                _put_json_key(b, key, escape)
                _put_lit(b, ',"value":{"stringValue":')
                _put_json_str(b, value, escape)
                _put_lit(b, "}}")
                written += 1
                continue
            if PyLong_CheckExact(value) and _INT64_MIN <= value <= _INT64_MAX:
                _put_lit(b, '{"key":')
                _put_json_key(b, key, escape)
                _put_lit(b, ',"value":{"intValue":')
                _put_quoted_int(b, value)
                _put_lit(b, "}}")
                written += 1
                continue
        try:
            kv = {"key": key, "value": value_json(value)}
        except ValueError:  # what the SDK's encoder drops, the twin drops too
            if written:
                b.size -= 1  # the comma written for it
            continue
        _put_text(b, dumps(kv))
        written += 1
    return written


cdef int _put_json_attributes_field(Buf *b, object attributes, object dropped,
                                    object twin) except -1:
    """``,"attributes":[…]`` when any is encoded, then ``,"droppedAttributesCount":n``."""
    cdef Py_ssize_t mark = b.size
    _put_lit(b, ',"attributes":[')
    if _put_json_attributes(b, attributes, twin):
        _put_lit(b, "]")
    else:
        b.size = mark
    if dropped:
        _put_lit(b, ',"droppedAttributesCount":')
        _put_text(b, int.__repr__(dropped))
    return 0


cdef int _put_json_flags(Buf *b, object context) except -1:
    if context is not None and _is_remote(context):
        return _put_lit(b, "768")
    return _put_lit(b, "256")


cdef int _put_json_nanos(Buf *b, const char *member, object value) except -1:
    """``,"member":"<value>"`` (a time in ns, as a JSON string) when ``value`` is set."""
    if value:
        _put_lit(b, member)
        _put_quoted_int(b, value)
    return 0


cdef int _put_json_text(Buf *b, const char *member, object value, object escape) except -1:
    """``,"member":"<value>"`` (an escaped string) when ``value`` is not empty."""
    if value:
        _put_lit(b, member)
        _put_json_str(b, value, escape)
    return 0


def span_text(span):
    """Native twin of ``otelgpu.otel.span_json.span_text``: ``span_dict(span)`` as JSON text,
    character for character."""
    cdef Buf b
    cdef bint first
    cdef Py_ssize_t mark
    twin = _json()
    escape = twin[0]
    b.data = NULL
    b.size = 0
    b.cap = 0
    _init_api_types()
    try:
        (ctx, parent, name, kind, start, end, attributes, dropped, events, dropped_events,
         links, dropped_links, status) = _span_fields(span)
        _put_lit(&b, '{"traceId":"')
        _put_text(&b, format(_trace_id(ctx), "032x"))
        _put_lit(&b, '","spanId":"')
        _put_text(&b, format(_span_id(ctx), "016x"))
        _put_lit(&b, '"')
        state = _trace_state(ctx)
        if state:
            _put_lit(&b, ',"traceState":')
            _put_json_str(&b, ",".join([f"{k}={v}" for k, v in state.items()]), escape)
        if parent:
            _put_lit(&b, ',"parentSpanId":"')
            _put_text(&b, format(_span_id(parent), "016x"))
            _put_lit(&b, '"')
        _put_json_text(&b, ',"name":', name, escape)
        _put_lit(&b, ',"kind":')
        _put_text(&b, int.__repr__(_enum_value(kind) + 1))
        _put_json_nanos(&b, ',"startTimeUnixNano":', start)
        _put_json_nanos(&b, ',"endTimeUnixNano":', end)
        _put_json_attributes_field(&b, attributes, dropped, twin)
        first = True
        for event in events:
            _put_lit(&b, ',"events":[{' if first else ",{")
            first = False
            mark = b.size
            _put_json_nanos(&b, ',"timeUnixNano":', event.timestamp)
            _put_json_text(&b, ',"name":', event.name, escape)
            _put_json_attributes_field(&b, event.attributes, event.dropped_attributes, twin)
            if b.size > mark:  # the object's first member has no leading comma
                memmove(b.data + mark, b.data + mark + 1, b.size - mark - 1)
                b.size -= 1
            _put_lit(&b, "}")
        if not first:
            _put_lit(&b, "]")
        if dropped_events:
            _put_lit(&b, ',"droppedEventsCount":')
            _put_text(&b, int.__repr__(dropped_events))
        first = True
        for link in links:
            _put_lit(&b, ',"links":[' if first else ",")
            first = False
            link_ctx = link.context
            _put_lit(&b, '{"traceId":"')
            _put_text(&b, format(_trace_id(link_ctx), "032x"))
            _put_lit(&b, '","spanId":"')
            _put_text(&b, format(_span_id(link_ctx), "016x"))
            _put_lit(&b, '"')
            _put_json_attributes_field(&b, link.attributes, link.dropped_attributes, twin)
            _put_lit(&b, ',"flags":')
            _put_json_flags(&b, link_ctx)
            _put_lit(&b, "}")
        if not first:
            _put_lit(&b, "]")
        if dropped_links:
            _put_lit(&b, ',"droppedLinksCount":')
            _put_text(&b, int.__repr__(dropped_links))
        if status is not None:
            _put_lit(&b, ',"status":{')
            description, code = _status_fields(status)
            if description:
                _put_lit(&b, '"message":')
                _put_json_str(&b, description, escape)
            if code:
                _put_lit(&b, ',"code":' if description else '"code":')
                _put_text(&b, int.__repr__(code))
            _put_lit(&b, "}")
        _put_lit(&b, ',"flags":')
        _put_json_flags(&b, parent)
        _put_lit(&b, "}")
        return PyUnicode_DecodeASCII(b.data, b.size, NULL)
    finally:
        free(b.data)
