/*
 * otelgpu quantile sketch core: value -> OTLP exponential-histogram bucket index,
 * bounded dense bucket stores, and a tiny lock. Used by _sketch_c.pyx only.
 *
 * The mapping is the same formula as otelgpu/sketch/_mapping.py (and the
 * OpenTelemetry SDK's LogarithmMapping / ExponentMapping), so both twins place every
 * value in the same bucket: for scale > 0, floor(log(v) * factor) with
 * factor = ldexp(1/log(2), scale) computed *in Python* and passed in; exact powers
 * of two by their exponent; subnormals in one bucket below 2**-1022.
 *
 * Store: counts for a contiguous index range [lo, hi] in a heap array that covers
 * [offset, offset + cap). The range never exceeds `limit` indices: widening it upward
 * folds the lowest buckets into the lowest kept one; a value below the range that
 * does not fit is counted in the lowest kept bucket (collapse-lowest, see the Python
 * twin's module docstring). All functions are plain C, make no Python API calls and
 * never block: under the GIL each call is atomic with respect to other threads.
 *
 * Memory: PyMem_Raw* (no GIL needed), owned by the store, freed by otg_store_free.
 */
#ifndef OTELGPU_SKETCH_CORE_H
#define OTELGPU_SKETCH_CORE_H

#include <Python.h>
#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

/* Arithmetic (flooring) right shift, defined for negative values too. */
static inline int64_t otg_shr(int64_t x, int s) {
    return x >= 0 ? (x >> s) : -(((-x) - 1) >> s) - 1;
}

/*
 * Fast path for scales 1..OTG_TABLE_MAX_SCALE: a per-scale table over the top
 * (scale + 1) mantissa bits. Bucket widths in mantissa space are at least
 * ln(2) / 2**scale > 2**-(scale + 1), so each table slot holds at most one bucket
 * boundary 2**(j / 2**scale): the sub-index is the slot's first sub-index, plus one
 * when the mantissa is above the slot's boundary. This is the *exact* real-number
 * result; the SDK formula floor(log(v) * factor) differs from it only within about
 * 1e-12 (relative) of a boundary (log and product rounding), so any mantissa within
 * OTG_GUARD_ULPS (2**20 ulps, ~2.3e-10 relative) of a boundary takes the log path.
 * Hence the result is always the SDK formula's, bit for bit (tested against the
 * Python twin near every boundary), at a fraction of a log()'s cost.
 */
#define OTG_TABLE_MAX_SCALE 10
#define OTG_GUARD_ULPS ((int64_t)1 << 20)
/* A slot without a boundary stores this bound (every mantissa is "above" it) and
 * its first sub-index minus one, so the lookup below needs no branch on it. */
#define OTG_NO_BOUNDARY (INT64_MIN / 2)

static int64_t otg_bound[OTG_TABLE_MAX_SCALE + 1][2 << OTG_TABLE_MAX_SCALE];
static int32_t otg_jlo[OTG_TABLE_MAX_SCALE + 1][2 << OTG_TABLE_MAX_SCALE];

/* Fill the tables; call once at module import (before any sketch exists). */
static void otg_tables_init(void) {
    for (int s = 1; s <= OTG_TABLE_MAX_SCALE; s++) {
        int64_t slots = (int64_t)2 << s, per = (int64_t)1 << s;
        int64_t width = ((int64_t)1 << 52) / slots; /* mantissa units per slot */
        int32_t j = 0;                              /* boundaries below the slot start */
        for (int64_t t = 0; t < slots; t++) {
            int64_t start = t * width, end = start + width;
            otg_bound[s][t] = OTG_NO_BOUNDARY;
            otg_jlo[s][t] = j - 1;
            if (j + 1 < per) {
                /* boundary 2**((j + 1) / 2**s) as a 52-bit mantissa */
                double m = exp2((double)(j + 1) / (double)per);
                int64_t b = (int64_t)llround((m - 1.0) * 4503599627370496.0);
                if (b < end) {
                    otg_bound[s][t] = b;
                    otg_jlo[s][t] = j;
                    j++;
                }
            }
        }
    }
}

/* Bucket index of a finite v > 0 at `scale` (factor = ldexp(1/log(2), scale)). */
static inline int64_t otg_map_to_index(double v, int scale, double factor) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    int64_t exponent = (int64_t)((bits >> 52) & 0x7ff) - 1023;
    uint64_t mant = bits & 0xfffffffffffffULL;
    if (scale > 0) {
        if (v <= DBL_MIN) {
            return -1022 * ((int64_t)1 << scale) - 1;
        }
        if (mant == 0) {
            return exponent * ((int64_t)1 << scale) - 1;
        }
        if (scale <= OTG_TABLE_MAX_SCALE) {
            uint64_t t = mant >> (51 - scale);
            int64_t j = otg_jlo[scale][t];
            int64_t b = otg_bound[scale][t];
            int64_t d = (int64_t)mant - b;
            /* branch-free (random data makes "above/below the boundary" a coin flip) */
            int64_t above = d >= OTG_GUARD_ULPS, below = d <= -OTG_GUARD_ULPS;
            if (__builtin_expect(above | below, 1)) {
                return exponent * ((int64_t)1 << scale) + j + above;
            }
        }
        double f = floor(log(v) * factor);
        double cap = (double)(1024 * ((int64_t)1 << scale) - 1);
        return (int64_t)(f < cap ? f : cap);
    }
    if (v < DBL_MIN) {
        return otg_shr(-1022, -scale) - (-scale < 2 ? 1 : 0);
    }
    return otg_shr(exponent - (mant == 0), -scale);
}

/* Index by the SDK formula only (no table): for tests of the fast path. */
static inline int64_t otg_map_to_index_log(double v, int scale, double factor) {
    if (scale > 0 && v > DBL_MIN) {
        uint64_t bits;
        memcpy(&bits, &v, sizeof bits);
        if ((bits & 0xfffffffffffffULL) != 0) {
            double f = floor(log(v) * factor);
            double cap = (double)(1024 * ((int64_t)1 << scale) - 1);
            return (int64_t)(f < cap ? f : cap);
        }
    }
    return otg_map_to_index(v, scale, factor);
}

/* Estimate of the values in bucket i: exp((i + 1) / factor + offset). */
static inline double otg_bucket_value(int64_t i, double factor, double offset) {
    return exp((double)(i + 1) / factor + offset);
}

typedef struct {
    uint64_t *counts; /* counts[k] is bucket offset + k */
    int64_t offset;
    int64_t cap;
    int64_t lo, hi;   /* occupied range, meaningful when total > 0 */
    uint64_t total;
    int64_t limit;    /* most indices kept (max_buckets) */
} otg_store;

static inline void otg_store_init(otg_store *s, int64_t limit) {
    memset(s, 0, sizeof *s);
    s->limit = limit;
}

static inline void otg_store_free(otg_store *s) {
    PyMem_RawFree(s->counts);
    s->counts = NULL;
    s->cap = 0;
    s->total = 0;
}

static inline void otg_store_clear(otg_store *s) {
    if (s->counts != NULL && s->total) {
        memset(s->counts, 0, (size_t)s->cap * sizeof(uint64_t));
    }
    s->total = 0;
}

/* Make [lo, hi] addressable, keeping the counts of the occupied range. -1 on ENOMEM. */
static int otg_store_reserve(otg_store *s, int64_t lo, int64_t hi) {
    if (s->counts != NULL && lo >= s->offset && hi < s->offset + s->cap) {
        return 0;
    }
    int64_t span = hi - lo + 1;
    int64_t cap = s->cap * 2;
    if (cap < 64) cap = 64;
    if (cap > s->limit) cap = s->limit;
    if (cap < span) cap = span;
    uint64_t *counts = (uint64_t *)PyMem_RawCalloc((size_t)cap, sizeof(uint64_t));
    if (counts == NULL) {
        return -1;
    }
    int64_t offset;
    if (s->counts == NULL || s->total == 0) {
        offset = lo - (cap - span) / 2;
    } else if (hi >= s->offset + s->cap) {
        offset = lo; /* growing upward: room above */
    } else {
        offset = hi - cap + 1; /* growing downward: room below */
    }
    if (s->counts != NULL && s->total) {
        int64_t a = s->lo > lo ? s->lo : lo;
        int64_t b = s->hi < hi ? s->hi : hi;
        if (a <= b) {
            memcpy(counts + (a - offset), s->counts + (a - s->offset),
                   (size_t)(b - a + 1) * sizeof(uint64_t));
        }
    }
    PyMem_RawFree(s->counts);
    s->counts = counts;
    s->offset = offset;
    s->cap = cap;
    return 0;
}

static int otg_store_add_slow(otg_store *s, int64_t idx, uint64_t n) {
    int64_t lo, hi;
    int64_t old_lo = s->lo, fold_end = s->lo, floor_idx = 0;
    uint64_t folded = 0;
    if (s->total == 0) {
        lo = hi = idx;
    } else if (idx > s->hi) {
        lo = s->lo;
        hi = idx;
        floor_idx = idx - s->limit + 1;
        if (floor_idx > lo) { /* too wide: the lowest buckets fold into floor_idx */
            fold_end = floor_idx <= s->hi ? floor_idx : s->hi + 1;
            for (int64_t k = s->lo; k < fold_end; k++) {
                folded += s->counts[k - s->offset];
            }
            lo = floor_idx;
        }
    } else { /* idx < s->lo */
        hi = s->hi;
        floor_idx = s->hi - s->limit + 1;
        if (idx < floor_idx) {
            idx = floor_idx; /* collapse into the lowest kept bucket */
        }
        lo = idx;
    }
    /* reserve copies only [max(old lo, lo), old hi]: folded cells are not carried */
    if (otg_store_reserve(s, lo, hi) < 0) {
        return -1; /* nothing changed */
    }
    for (int64_t k = old_lo; k < fold_end; k++) { /* still in place if not reallocated */
        if (k >= s->offset && k < s->offset + s->cap) {
            s->counts[k - s->offset] = 0;
        }
    }
    s->lo = lo;
    s->hi = hi;
    if (folded) {
        s->counts[floor_idx - s->offset] += folded;
    }
    s->counts[idx - s->offset] += n;
    s->total += n;
    return 0;
}

/* Count n values in bucket idx; -1 only when memory ran out (nothing counted). */
static inline int otg_store_add(otg_store *s, int64_t idx, uint64_t n) {
    if (s->total != 0 && idx >= s->lo && idx <= s->hi) {
        s->counts[idx - s->offset] += n;
        s->total += n;
        return 0;
    }
    return otg_store_add_slow(s, idx, n);
}

/* Add every bucket of src (indices shifted right by `shift`) into dst. */
static int otg_store_merge(otg_store *dst, const otg_store *src, int shift) {
    if (src->total == 0) {
        return 0;
    }
    for (int64_t k = src->lo; k <= src->hi; k++) {
        uint64_t c = src->counts[k - src->offset];
        if (c && otg_store_add(dst, otg_shr(k, shift), c) < 0) {
            return -1;
        }
    }
    return 0;
}

/* dst = an independent copy of src's occupied range. */
static int otg_store_copy(otg_store *dst, const otg_store *src) {
    otg_store_init(dst, src->limit);
    if (src->total == 0) {
        return 0;
    }
    int64_t span = src->hi - src->lo + 1;
    dst->counts = (uint64_t *)PyMem_RawMalloc((size_t)span * sizeof(uint64_t));
    if (dst->counts == NULL) {
        return -1;
    }
    memcpy(dst->counts, src->counts + (src->lo - src->offset), (size_t)span * sizeof(uint64_t));
    dst->offset = src->lo;
    dst->cap = span;
    dst->lo = src->lo;
    dst->hi = src->hi;
    dst->total = src->total;
    return 0;
}

/* Re-bucket s to a scale `shift` steps coarser. */
static int otg_store_downscale(otg_store *s, int shift) {
    otg_store fresh;
    otg_store_init(&fresh, s->limit);
    if (otg_store_merge(&fresh, s, shift) < 0) {
        otg_store_free(&fresh);
        return -1;
    }
    otg_store_free(s);
    *s = fresh;
    return 0;
}

/*
 * Lock. With the GIL, every sketch operation is one C call with no Python API in
 * its critical section, so the GIL alone makes it atomic and no lock is taken by
 * default. On a free-threaded build (Py_GIL_DISABLED) the lock is on by default: a
 * test-and-set spin lock that yields after a few spins (the critical sections are a
 * few nanoseconds long, so a parking mutex would only add cost).
 */
#ifdef Py_GIL_DISABLED
#define OTG_LOCK_DEFAULT 1
#else
#define OTG_LOCK_DEFAULT 0
#endif

typedef struct {
    volatile char flag;
} otg_lock;

static inline void otg_lock_init(otg_lock *l) { l->flag = 0; }

static inline void otg_lock_acquire(otg_lock *l) {
    unsigned spins = 0;
    while (__atomic_test_and_set(&l->flag, __ATOMIC_ACQUIRE)) {
        if (++spins >= 64) {
            spins = 0;
            sched_yield();
        }
    }
}

static inline void otg_lock_release(otg_lock *l) {
    __atomic_clear(&l->flag, __ATOMIC_RELEASE);
}

#endif /* OTELGPU_SKETCH_CORE_H */
