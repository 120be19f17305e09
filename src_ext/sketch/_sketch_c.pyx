# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False
# cython: cdivision=True, initializedcheck=False, always_allow_keywords=False
"""Native twin of ``otelgpu.sketch._sketch_py.QuantileSketch`` (same API, same buckets).

The Python twin's module docstring is the specification (bucket layout, accuracy,
collapse-lowest memory bound, rejected values, empty-sketch policy). This module keeps
the buckets in C arrays (``sketch_core.h``) and computes bucket indices with the same
formula and the same Python-computed constants, so both twins agree bucket for bucket.

Thread-safety: with the GIL, ``add``/``add_many``/``merge``/... each run their whole
critical section as C code with no Python API calls in it, so the GIL makes them
atomic and no lock is taken. On a free-threaded build a spin lock (``sketch_core.h``)
guards every critical section. ``_set_locking(True)`` forces the lock on a GIL build
too, which is how the benchmark measures its cost.
"""

cimport cython
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_Check, PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport INFINITY, NAN
from libc.stdint cimport int64_t, uint64_t

from otelgpu.errors import CorruptDataError
from otelgpu.sketch import _codec, _config, _mapping, _otlp
from otelgpu.sketch._state import SketchState

__all__ = ["QuantileSketch"]


cdef extern from "Python.h":
    # Re-declared without Cython's automatic error check: a failed conversion is a
    # rejected value here, handled inline (PyErr_Clear), never an exception.
    double _as_double "PyFloat_AsDouble"(object) noexcept
    double _long_as_double "PyLong_AsDouble"(object) noexcept
    long long _long_as_long_and_overflow "PyLong_AsLongLongAndOverflow"(object, int *) noexcept
    void* PyErr_Occurred() noexcept
    void PyErr_Clear() noexcept


cdef extern from "sketch_core.h" nogil:
    ctypedef struct otg_store:
        uint64_t *counts
        int64_t offset
        int64_t cap
        int64_t lo
        int64_t hi
        uint64_t total
        int64_t limit

    ctypedef struct otg_lock:
        pass

    int OTG_LOCK_DEFAULT
    int64_t otg_shr(int64_t x, int s)
    int64_t otg_map_to_index(double v, int scale, double factor)
    int64_t otg_map_to_index_log(double v, int scale, double factor)
    void otg_tables_init()
    double otg_bucket_value(int64_t i, double factor, double offset)
    void otg_store_init(otg_store *s, int64_t limit)
    void otg_store_free(otg_store *s)
    void otg_store_clear(otg_store *s)
    int otg_store_add(otg_store *s, int64_t idx, uint64_t n)
    int otg_store_merge(otg_store *dst, const otg_store *src, int shift)
    int otg_store_copy(otg_store *dst, const otg_store *src)
    int otg_store_downscale(otg_store *s, int shift)
    void otg_lock_init(otg_lock *l)
    void otg_lock_acquire(otg_lock *l)
    void otg_lock_release(otg_lock *l)


otg_tables_init()


def _map_to_index(double value, int scale, bint table=True):
    """Bucket index of a finite ``value > 0`` as the sketch computes it (for tests).

    ``table=False`` forces the plain SDK formula, bypassing the lookup-table fast path.
    """
    if not (_mapping.MIN_SCALE <= scale <= _mapping.MAX_SCALE and 0.0 < value < INFINITY):
        raise ValueError(f"need a scale in -10..20 and a finite value > 0, not {scale}, {value}")
    cdef double factor = _mapping.scale_factor(scale)
    if table:
        return otg_map_to_index(value, scale, factor)
    return otg_map_to_index_log(value, scale, factor)


ctypedef struct _snapshot:
    otg_store pos
    otg_store neg
    uint64_t zero
    uint64_t rejected
    double total
    double vmin
    double vmax
    int scale


cdef inline void _set_totals(_snapshot *snap, uint64_t zero, uint64_t rejected, double total,
                             double vmin, double vmax, int scale) noexcept nogil:
    # Everything of a snapshot but its bucket stores.
    snap.zero, snap.rejected, snap.total = zero, rejected, total
    snap.vmin, snap.vmax, snap.scale = vmin, vmax, scale


cdef inline double _clamp(double v, double lo, double hi) noexcept:
    if v < lo:
        return lo
    if v > hi:
        return hi
    return v


cdef inline bint _scan(const otg_store *s, bint descending, uint64_t target, uint64_t *seen,
                       int64_t *found) noexcept nogil:
    # Walks the buckets of ``s`` from its highest index down (``descending``) or from its
    # lowest up, adding their counts to ``seen[0]``: True, with the bucket's index in
    # ``found[0]``, at the first bucket that takes ``seen[0]`` past ``target``.
    cdef int64_t k, _n, step = -1 if descending else 1
    if s.total == 0:
        return False
    k = s.hi if descending else s.lo
    for _n in range(s.hi - s.lo + 1):
        seen[0] += s.counts[k - s.offset]
        if seen[0] > target:
            found[0] = k
            return True
        k += step
    return False


cdef object _validate_q(object q):
    cdef double qf
    if isinstance(q, bool) or not isinstance(q, (int, float)):
        try:
            q = float(q)
        except (TypeError, ValueError):
            raise ValueError(f"quantile q must be a number in [0, 1], got {q!r}") from None
    qf = float(q)
    if not 0.0 <= qf <= 1.0:  # also rejects NaN
        raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
    return qf


cdef list _dense(const otg_store *s):
    cdef int64_t k
    if s.total == 0:
        return []
    return [s.counts[k - s.offset] for k in range(s.lo, s.hi + 1)]


cdef int _fill_store(otg_store *dst, int64_t offset, list counts, int shift) except -1:
    cdef Py_ssize_t i
    cdef uint64_t c
    # _codec.check bounds every decoded index; this guard keeps ``offset + i`` defined
    # for any other caller (a duck-typed ``_state()`` handed to merge()).
    lo, hi = _codec.index_bounds(_mapping.MAX_SCALE)
    if counts and not (lo <= offset and offset + len(counts) - 1 <= hi):
        raise CorruptDataError(f"sketch bucket offset {offset} is out of range")
    for i in range(len(counts)):
        c = counts[i]
        if c and otg_store_add(dst, otg_shr(offset + i, shift), c) < 0:
            raise MemoryError("otelgpu sketch: out of memory")
    return 0


@cython.final
cdef class QuantileSketch:
    """Streaming quantiles with relative error; buckets are OTLP exponential buckets.

    ``QuantileSketch(relative_accuracy=0.01, *, scale=None, max_buckets=None)``: give
    either the accuracy (the coarsest scale meeting it is chosen) or the ``scale``
    (-10..20) itself. ``max_buckets`` bounds each sign's bucket range (default: 32
    binades, 2048 at scale 6). Invalid arguments raise ``ConfigurationError``.
    """

    cdef otg_store _pos
    cdef otg_store _neg
    cdef uint64_t _zero
    cdef uint64_t _rejected
    cdef double _sum
    cdef double _min
    cdef double _max
    cdef int _scale
    cdef double _factor
    cdef double _offset
    cdef int64_t _max_buckets
    cdef otg_lock _lock
    cdef bint _locked

    def __cinit__(self):
        otg_store_init(&self._pos, 2)
        otg_store_init(&self._neg, 2)
        otg_lock_init(&self._lock)
        self._locked = OTG_LOCK_DEFAULT

    def __dealloc__(self):
        otg_store_free(&self._pos)
        otg_store_free(&self._neg)

    def __init__(self, relative_accuracy=0.01, *, scale=None, max_buckets=None):
        scale, max_buckets = _config.resolve(relative_accuracy, scale, max_buckets)
        otg_store_free(&self._pos)
        otg_store_free(&self._neg)
        otg_store_init(&self._pos, max_buckets)
        otg_store_init(&self._neg, max_buckets)
        self._max_buckets = max_buckets
        self._set_scale(scale)
        self._clear()

    cdef int _set_scale(self, int scale) except -1:
        # factor and offset come from Python: the same doubles the Python twin uses.
        self._scale = scale
        self._factor = _mapping.scale_factor(scale)
        self._offset = _mapping.estimate_offset(scale)
        return 0

    cdef void _clear(self) noexcept:
        otg_store_clear(&self._pos)
        otg_store_clear(&self._neg)
        self._zero = 0
        self._rejected = 0
        self._sum = 0.0
        self._min = INFINITY
        self._max = -INFINITY

    def _set_locking(self, bint enabled):
        """Force the spin lock on (or off) -- for benchmarks and tests only."""
        self._locked = enabled

    # -- ingest ---------------------------------------------------------------------

    cdef inline void _add_unlocked(self, double v) noexcept:
        cdef int rc
        if v > 0.0:
            if v == INFINITY:
                self._rejected += 1
                return
            rc = otg_store_add(&self._pos, otg_map_to_index(v, self._scale, self._factor), 1)
        elif v < 0.0:
            if v == -INFINITY:
                self._rejected += 1
                return
            rc = otg_store_add(&self._neg, otg_map_to_index(-v, self._scale, self._factor), 1)
        elif v == 0.0:
            self._zero += 1
            rc = 0
        else:  # NaN
            self._rejected += 1
            return
        if rc < 0:  # out of memory: drop and count, never raise on the hot path
            self._rejected += 1
            return
        self._sum += v
        if v < self._min:
            self._min = v
        if v > self._max:
            self._max = v

    cdef inline void _add(self, double v) noexcept:
        if self._locked:
            otg_lock_acquire(&self._lock)
            self._add_unlocked(v)
            otg_lock_release(&self._lock)
        else:
            self._add_unlocked(v)

    cdef inline void _reject(self) noexcept:
        if self._locked:
            otg_lock_acquire(&self._lock)
            self._rejected += 1
            otg_lock_release(&self._lock)
        else:
            self._rejected += 1

    cdef inline void _add_object(self, object value) noexcept:
        cdef double v
        cdef long long iv
        cdef int overflow
        if PyFloat_CheckExact(value):
            v = PyFloat_AS_DOUBLE(value)
        elif PyLong_CheckExact(value):
            iv = _long_as_long_and_overflow(value, &overflow)
            if overflow == 0 and (iv != -1 or PyErr_Occurred() == NULL):
                v = <double>iv  # rounds to nearest, exactly like PyLong_AsDouble
            else:
                PyErr_Clear()
                v = _long_as_double(value)
                if v == -1.0 and PyErr_Occurred() != NULL:  # int too large for a float
                    PyErr_Clear()
                    self._reject()
                    return
        elif PyFloat_Check(value):  # float subclasses, e.g. numpy.float64
            v = PyFloat_AS_DOUBLE(value)
        elif isinstance(value, (str, bytes, bytearray)):
            self._reject()
            return
        else:
            v = _as_double(value)
            if v == -1.0 and PyErr_Occurred() != NULL:
                PyErr_Clear()
                self._reject()
                return
        self._add(v)

    def add(self, value):
        """Count one value. NaN, +-inf and non-numbers are counted in ``rejected``."""
        self._add_object(value)

    def add_many(self, values):
        """Count every value of a float64 buffer (numpy array, ``array('d')``) or iterable.

        Same result as calling ``add`` for each value in order.
        """
        cdef const double[:] view
        cdef Py_ssize_t i, n
        try:
            view = values
        except (TypeError, ValueError, BufferError):
            for item in values:
                self._add_object(item)
            return
        n = view.shape[0]
        if self._locked:
            otg_lock_acquire(&self._lock)
        for i in range(n):
            self._add_unlocked(view[i])
        if self._locked:
            otg_lock_release(&self._lock)

    # -- queries --------------------------------------------------------------------

    @property
    def scale(self):
        """OTLP exponential-histogram scale: base ``2 ** (2 ** -scale)``."""
        return self._scale

    @property
    def relative_accuracy(self):
        """Guaranteed relative error of quantile estimates at this scale."""
        return _mapping.accuracy_for_scale(self._scale)

    @property
    def max_buckets(self):
        """Most consecutive buckets kept per sign before the lowest are collapsed."""
        return self._max_buckets

    @property
    def count(self):
        """Number of stored values (``rejected`` ones excluded)."""
        return self._zero + self._pos.total + self._neg.total

    @property
    def sum(self):
        """Sum of stored values (0.0 when empty)."""
        return self._sum

    @property
    def min(self):
        """Smallest stored value, exact (``nan`` when empty)."""
        return self._min if self._zero + self._pos.total + self._neg.total else NAN

    @property
    def max(self):
        """Largest stored value, exact (``nan`` when empty)."""
        return self._max if self._zero + self._pos.total + self._neg.total else NAN

    @property
    def zero_count(self):
        """Number of stored zeros."""
        return self._zero

    @property
    def rejected(self):
        """Number of NaN, +-inf or non-numeric values passed to ``add``/``add_many``."""
        return self._rejected

    cdef double _quantile_unlocked(self, double q) noexcept:
        # Same answer as the Python twin's ascending scan (the bucket holding element
        # floor(rank) of the sorted values), but scans from the nearer end: upper
        # quantiles, the common query, touch only the top few buckets.
        cdef uint64_t count = self._zero + self._pos.total + self._neg.total
        cdef double rank
        cdef uint64_t target, seen = 0
        cdef int64_t k
        if count == 0:
            return NAN
        rank = q * <double>(count - 1)
        if rank < 1.0:  # the smallest value: known exactly
            return self._min
        if rank >= <double>(count - 1):  # the largest value: known exactly
            return self._max
        target = <uint64_t>rank  # 0-based position in the sorted values
        # _scan passes over an empty side (its lo..hi are stale, its counts may be NULL).
        if target < count // 2:  # ascending: negatives (largest magnitude first), 0, positives
            if _scan(&self._neg, True, target, &seen, &k):
                return _clamp(-otg_bucket_value(k, self._factor, self._offset),
                              self._min, self._max)
            seen += self._zero
            if seen > target:
                return 0.0
            if _scan(&self._pos, False, target, &seen, &k):
                return _clamp(otg_bucket_value(k, self._factor, self._offset), self._min, self._max)
            return self._max
        target = count - 1 - target  # position from the top
        if _scan(&self._pos, True, target, &seen, &k):
            return _clamp(otg_bucket_value(k, self._factor, self._offset), self._min, self._max)
        seen += self._zero
        if seen > target:
            return 0.0
        if _scan(&self._neg, False, target, &seen, &k):
            return _clamp(-otg_bucket_value(k, self._factor, self._offset), self._min, self._max)
        return self._min

    def quantile(self, q):
        """Estimate of the lower-rank quantile ``sorted(v)[int(q * (count - 1))]``.

        ``nan`` when empty; ``ValueError`` unless ``0 <= q <= 1``. Clamped to
        [``min``, ``max``], so ``quantile(0) == min`` and ``quantile(1) == max``.
        """
        cdef double qf = _validate_q(q)
        cdef double result
        if self._locked:
            otg_lock_acquire(&self._lock)
        result = self._quantile_unlocked(qf)
        if self._locked:
            otg_lock_release(&self._lock)
        return result

    def quantiles(self, qs):
        """``[quantile(q) for q in qs]``, from one consistent snapshot."""
        cdef list checked = [_validate_q(q) for q in qs]
        cdef Py_ssize_t i, n = len(checked)
        cdef double *buf = <double *>PyMem_Malloc((n + 1) * sizeof(double))
        if buf == NULL:
            raise MemoryError("otelgpu sketch: out of memory")
        try:
            for i in range(n):
                buf[i] = checked[i]
            if self._locked:
                otg_lock_acquire(&self._lock)
            for i in range(n):  # in place: each q is read before its result is written
                buf[i] = self._quantile_unlocked(buf[i])
            if self._locked:
                otg_lock_release(&self._lock)
            return [buf[i] for i in range(n)]
        finally:
            PyMem_Free(buf)

    # -- combination ----------------------------------------------------------------

    cdef int _snapshot(self, _snapshot *snap) except -1:
        """Copy everything into ``snap`` (C memory only, so atomic under the GIL)."""
        cdef int rc1, rc2
        if self._locked:
            otg_lock_acquire(&self._lock)
        rc1 = otg_store_copy(&snap.pos, &self._pos)
        rc2 = otg_store_copy(&snap.neg, &self._neg)
        _set_totals(snap, self._zero, self._rejected, self._sum, self._min, self._max, self._scale)
        if self._locked:
            otg_lock_release(&self._lock)
        if rc1 < 0 or rc2 < 0:
            otg_store_free(&snap.pos)
            otg_store_free(&snap.neg)
            raise MemoryError("otelgpu sketch: out of memory")
        return 0

    cdef int _merge_snapshot(self, _snapshot *snap) except -1:
        cdef int rc = 0
        cdef int shift
        # Python-computed constants first: no Python calls while the lock is held.
        cdef double factor = _mapping.scale_factor(snap.scale)
        cdef double offset = _mapping.estimate_offset(snap.scale)
        if self._locked:
            otg_lock_acquire(&self._lock)
        if snap.scale < self._scale:
            rc = otg_store_downscale(&self._pos, self._scale - snap.scale)
            if rc == 0:
                rc = otg_store_downscale(&self._neg, self._scale - snap.scale)
            if rc == 0:
                self._scale = snap.scale
                self._factor = factor
                self._offset = offset
        if rc == 0:
            shift = snap.scale - self._scale
            rc = otg_store_merge(&self._pos, &snap.pos, shift)
            if rc == 0:
                rc = otg_store_merge(&self._neg, &snap.neg, shift)
        if rc == 0:
            self._zero += snap.zero
            self._rejected += snap.rejected
            self._sum += snap.total
            if snap.vmin < self._min:
                self._min = snap.vmin
            if snap.vmax > self._max:
                self._max = snap.vmax
        if self._locked:
            otg_lock_release(&self._lock)
        if rc < 0:
            raise MemoryError("otelgpu sketch: out of memory")
        return 0

    def merge(self, other):
        """Add all of ``other``'s values (either twin) into this sketch.

        If the scales differ, the finer sketch's buckets are down-scaled to the
        coarser scale (exact, OTLP buckets nest). ``other`` is not modified.
        """
        cdef _snapshot snap
        cdef QuantileSketch native
        if isinstance(other, QuantileSketch):
            native = <QuantileSketch>other
            native._snapshot(&snap)
            try:
                self._merge_snapshot(&snap)
            finally:
                otg_store_free(&snap.pos)
                otg_store_free(&snap.neg)
        elif callable(getattr(other, "_state", None)):
            self._merge_state(other._state())
        else:
            raise TypeError(f"can only merge a QuantileSketch, not {type(other).__name__}")

    cdef int _merge_state(self, object state) except -1:
        cdef _snapshot snap
        otg_store_init(&snap.pos, max(len(state.positive), 2))
        otg_store_init(&snap.neg, max(len(state.negative), 2))
        try:
            _fill_store(&snap.pos, state.positive_offset, state.positive, 0)
            _fill_store(&snap.neg, state.negative_offset, state.negative, 0)
            _set_totals(&snap, state.zero_count, state.rejected, state.sum, state.min, state.max,
                        state.scale)
            self._merge_snapshot(&snap)
        finally:
            otg_store_free(&snap.pos)
            otg_store_free(&snap.neg)
        return 0

    def reset(self):
        """Forget every value (the scale and ``max_buckets`` are kept)."""
        if self._locked:
            otg_lock_acquire(&self._lock)
        self._clear()
        if self._locked:
            otg_lock_release(&self._lock)

    def copy(self):
        """An independent sketch with the same contents."""
        cdef QuantileSketch twin = QuantileSketch(scale=self._scale,
                                                  max_buckets=self._max_buckets)
        twin._locked = self._locked
        twin.merge(self)
        return twin

    # -- snapshots, bytes, OTLP -------------------------------------------------------

    def _state(self):
        cdef _snapshot snap
        self._snapshot(&snap)
        try:
            return SketchState(
                scale=snap.scale,
                max_buckets=self._max_buckets,
                sum=snap.total,
                min=snap.vmin,
                max=snap.vmax,
                zero_count=snap.zero,
                rejected=snap.rejected,
                positive_offset=snap.pos.lo if snap.pos.total else 0,
                positive=_dense(&snap.pos),
                negative_offset=snap.neg.lo if snap.neg.total else 0,
                negative=_dense(&snap.neg),
            )
        finally:
            otg_store_free(&snap.pos)
            otg_store_free(&snap.neg)

    @classmethod
    def _from_state(cls, state):
        cdef QuantileSketch sketch = cls(scale=state.scale, max_buckets=state.max_buckets)
        sketch._merge_state(state)
        return sketch

    def to_bytes(self):
        """Compact versioned, checksummed encoding (see ``otelgpu.sketch._codec``)."""
        return _codec.encode(self._state())

    @classmethod
    def from_bytes(cls, data):
        """Inverse of ``to_bytes``; ``CorruptDataError`` if ``data`` is damaged."""
        return cls._from_state(_codec.decode(data))

    def to_data_point(self, start_time_unix_nano, time_unix_nano, attributes=None):
        """This sketch as an OTel SDK ``ExponentialHistogramDataPoint`` (same buckets)."""
        return _otlp.to_data_point(self._state(), start_time_unix_nano, time_unix_nano,
                                   attributes)

    @classmethod
    def from_data_point(cls, dp):
        """A sketch holding exactly ``dp``'s buckets; ``ValueError`` if inconsistent."""
        return cls._from_state(_otlp.from_data_point(dp))

    def __reduce__(self):
        return (type(self).from_bytes, (self.to_bytes(),))

    def __repr__(self):
        return (
            f"{type(self).__name__}(scale={self._scale}, count={self.count}, "
            f"min={self.min!r}, max={self.max!r}, rejected={self._rejected})"
        )
