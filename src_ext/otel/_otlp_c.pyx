# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False
"""Native twin of ``otelgpu.otel.span_encoding.attributes_bytes``: OTLP ``KeyValue``
fields written in C.

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
from libc.string cimport memcpy

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

# Kinds of a plain value.
cdef enum:
    K_OTHER = 0
    K_STR = 1
    K_BOOL = 2
    K_INT = 3
    K_FLOAT = 4

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


def attributes_bytes(bytes tag, attributes):
    """Each attribute of ``attributes`` as one repeated ``KeyValue`` field with the
    one-byte field tag ``tag``, concatenated (b"" for none)."""
    cdef Buf b
    cdef Py_ssize_t pos = 0
    cdef PyObject *k
    cdef PyObject *v
    cdef uint8_t t
    if not attributes:
        return b""
    if len(tag) != 1:
        raise ValueError("tag must be one byte")
    t = <uint8_t>tag[0]
    plain = getattr(attributes, "_dict", attributes)
    b.data = NULL
    b.size = 0
    b.cap = 0
    try:
        if PyDict_CheckExact(plain):
            while PyDict_Next(plain, &pos, &k, &v):
                key = <object>k  # own references: the twin's code may run meanwhile
                value = <object>v
                _put_attribute(&b, t, key, value, _twin_attribute)
        else:
            for key, value in plain.items():
                _put_attribute(&b, t, key, value, _twin_attribute)
        return PyBytes_FromStringAndSize(b.data, b.size)
    finally:
        free(b.data)


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
