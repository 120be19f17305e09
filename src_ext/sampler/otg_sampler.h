/*
 * otelgpu native sampler core: GIL-free sampling loop, XID waiter, per-device ring
 * buffers and window statistics. Pure C, no Python objects: every function here
 * may run with the GIL released, never allocates Python objects and never raises.
 * The pure-Python twin (otelgpu/sampler/_core_py.py) implements the same rules and
 * the same formulas, so both twins give identical windows for identical samples.
 *
 * Clock: t_ns = CLOCK_MONOTONIC + offset_ns, where Python captures
 * offset_ns = time.time_ns() - time.monotonic_ns() once per sampler. Timestamps are
 * comparable with OpenTelemetry span times yet never jump with the wall clock, so
 * each ring is sorted by time (pushes clamp t to the previous sample's t).
 *
 * Locks (none is held while calling NVML):
 *   tick_lock - one tick at a time (the loop thread vs. sample_once());
 *   data_lock - rings, the event ring and the per-device lost flags; held only to
 *               copy one record in, or for one window computation (a binary search
 *               plus a linear pass over the window's samples);
 *   wake_lock/wake - the loop's and the waiter's interruptible sleep.
 *
 * Record layout: otg_sample_t below, one per device per tick. `valid` has one
 * OTG_F_* bit per field present in this sample; a field is absent when the device
 * does not support it (its bit is also cleared from the device's capability mask,
 * so it is never asked again) or when the call failed this time (counted in
 * `nerrors`, status OTG_STATUS_FIELD_ERRORS).
 */
#ifndef OTG_SAMPLER_H
#define OTG_SAMPLER_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "otg_nvml.h"

/* ---- sample fields ------------------------------------------------------ */
#define OTG_F_UTIL (1u << 0)      /* gpu_util, mem_util (percent) */
#define OTG_F_MEMORY (1u << 1)    /* mem_used, mem_total (bytes) */
#define OTG_F_POWER (1u << 2)     /* power_mw */
#define OTG_F_ENERGY (1u << 3)    /* energy_mj, cumulative since driver load (field 83) */
#define OTG_F_TEMP (1u << 4)      /* temperature_c */
#define OTG_F_SM_CLOCK (1u << 5)  /* sm_clock_mhz */
#define OTG_F_MEM_CLOCK (1u << 6) /* mem_clock_mhz */
#define OTG_F_REASONS (1u << 7)   /* clock-event (throttle) reasons bitmask */
#define OTG_F_THR0 (1u << 8)      /* throttle_ns[k] is bit OTG_F_THR0 << k, k < 8 */
#define OTG_F_PCIE_TX (1u << 16)  /* cumulative bytes (field 197) */
#define OTG_F_PCIE_RX (1u << 17)  /* field 198 */
#define OTG_F_NVLINK_TX (1u << 18) /* cumulative bytes, all links (field 138 KiB x 1024) */
#define OTG_F_NVLINK_RX (1u << 19) /* field 139 */
#define OTG_F_ECC_CORR (1u << 20) /* volatile corrected ECC total (field 3) */
#define OTG_F_ECC_UNCORR (1u << 21) /* volatile uncorrected ECC total (field 4) */
#define OTG_F_FAN (1u << 22)      /* fan_pct */
#define OTG_F_PSTATE (1u << 23)   /* pstate 0..15 */
#define OTG_F_MEM_RESERVED (1u << 24) /* mem_reserved (bytes); memory v2: mem_used excludes it */
#define OTG_F_MEM_TEMP (1u << 25)  /* mem_temp_c, HBM temperature (field 82) */
#define OTG_F_PCIE_REPLAY (1u << 26) /* cumulative PCIe replays (field 94) */
#define OTG_F_REMAP (1u << 27)     /* remapped rows cor/unc/pending/failure (fields 142-145) */
#define OTG_F_ENC (1u << 28)       /* enc_util (percent) */
#define OTG_F_DEC (1u << 29)       /* dec_util (percent) */
#define OTG_F_GPM (1u << 30)       /* gpm[] (GPU Performance Monitoring, Hopper+) */
#define OTG_F_ALL 0x7FFFFFFFu
#define OTG_NTHROTTLE 8
#define OTG_NFIELDS 21

/* GPM metrics, index k of gpm[] / bit (1 << k) of gpm_valid: NVML metric ids. Activities
 * are percent; the last four are MiB/s. */
#define OTG_NGPM 17
static const unsigned int OTG_GPM_IDS[OTG_NGPM] = {
    NVML_GPM_METRIC_GRAPHICS_UTIL,    NVML_GPM_METRIC_SM_UTIL,
    NVML_GPM_METRIC_SM_OCCUPANCY,     NVML_GPM_METRIC_INTEGER_UTIL,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,  NVML_GPM_METRIC_DFMA_TENSOR_UTIL,
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL, NVML_GPM_METRIC_DMMA_TENSOR_UTIL,
    NVML_GPM_METRIC_IMMA_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL,
    NVML_GPM_METRIC_FP64_UTIL,        NVML_GPM_METRIC_FP32_UTIL,
    NVML_GPM_METRIC_FP16_UTIL,        NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC,  NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
};
#define OTG_GPM_ALL ((1u << OTG_NGPM) - 1u)
/* GPM samples closer than this are not compared (the counters refresh every ~100 ms). */
#define OTG_GPM_MIN_INTERVAL_NS 100000000ll
/* Pseudo return code recorded when nvmlGpmQueryDeviceSupport says "not this device". */
#define OTG_OFF_GPM_DEVICE 1000u
/* ...and when a GPM call answers NVML_ERROR_NO_PERMISSION (it will not change later). */
#define OTG_OFF_GPM_NO_PERMISSION 1001u

#define OTG_STATUS_OK 0u
#define OTG_STATUS_FIELD_ERRORS 1u
#define OTG_STATUS_LOST 2u

/* Reasons that mean "clocks are held down" (not idle, app clocks, sync boost, display). */
#define OTG_THROTTLE_MASK 0x6ECull
/* Energy counter refresh (~100 ms, nvml.md section 7): shorter spans use power x time. */
#define OTG_ENERGY_MIN_SPAN_NS 100000000ll
/* Waiter's nvmlEventSetWait timeout: bounds how long stop() waits for it. */
#define OTG_WAIT_MS 100u

#define OTG_EV_XID 0
#define OTG_EV_ECC_UNCORRECTED 1
#define OTG_EV_DEVICE_LOST 2
#define OTG_EV_THROTTLE_START 3

/* Field-value requests, one nvmlDeviceGetFieldValues call per device and round:
 * energy (83, mJ, = nvmlDeviceGetTotalEnergyConsumption), volatile ECC totals (3
 * corrected / 4 uncorrected), throttle ns (74,76,77,78,79,269,270,271), PCIe bytes
 * (197/198), NVLink KiB over all links (138/139), HBM temperature (82), PCIe replays
 * (94) and remapped rows (142-145). Batching these keeps a round at
 * 9-10 NVML calls per device, which matters because calls serialize in the driver. */
static const struct { unsigned int id, scope; uint32_t bit; } OTG_FIELD_TABLE[OTG_NFIELDS] = {
    {83, 0, OTG_F_ENERGY},     {3, 0, OTG_F_ECC_CORR},    {4, 0, OTG_F_ECC_UNCORR},
    {74, 0, OTG_F_THR0 << 0},  {76, 0, OTG_F_THR0 << 1},  {77, 0, OTG_F_THR0 << 2},
    {78, 0, OTG_F_THR0 << 3},  {79, 0, OTG_F_THR0 << 4},  {269, 0, OTG_F_THR0 << 5},
    {270, 0, OTG_F_THR0 << 6}, {271, 0, OTG_F_THR0 << 7}, {197, 0, OTG_F_PCIE_TX},
    {198, 0, OTG_F_PCIE_RX},   {138, OTG_SCOPE_ALL_LINKS, OTG_F_NVLINK_TX},
    {139, OTG_SCOPE_ALL_LINKS, OTG_F_NVLINK_RX},
    {NVML_FI_DEV_MEMORY_TEMP, 0, OTG_F_MEM_TEMP},
    {NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0, OTG_F_PCIE_REPLAY},
    {NVML_FI_DEV_REMAPPED_COR, 0, OTG_F_REMAP},     {NVML_FI_DEV_REMAPPED_UNC, 0, OTG_F_REMAP},
    {NVML_FI_DEV_REMAPPED_PENDING, 0, OTG_F_REMAP}, {NVML_FI_DEV_REMAPPED_FAILURE, 0, OTG_F_REMAP},
};

typedef struct {
    int64_t t_ns;
    uint32_t valid, status, nerrors, pad;
    uint32_t gpu_util, mem_util;
    uint64_t mem_used, mem_total;
    uint32_t power_mw, temperature_c;
    uint64_t energy_mj;
    uint32_t sm_clock_mhz, mem_clock_mhz;
    uint64_t reasons;
    uint64_t throttle_ns[OTG_NTHROTTLE];
    uint64_t pcie_tx, pcie_rx, nvlink_tx, nvlink_rx;
    uint64_t ecc_corr, ecc_uncorr;
    uint32_t fan_pct, pstate;
    uint64_t mem_reserved;
    uint32_t mem_temp_c, pcie_replay;
    uint32_t remap[4]; /* correctable, uncorrectable, pending, failure */
    uint32_t enc_util, dec_util;
    uint32_t gpm_valid, pad2; /* bit k: gpm[k] present */
    int64_t gpm_dt_ns;        /* the GPM interval gpm[] covers, ending at t_ns */
    double gpm[OTG_NGPM];
} otg_sample_t;

typedef struct {
    int64_t t_ns;
    int32_t dev, kind;
    uint64_t code, detail;
} otg_event_t;

typedef struct {
    otg_dev_t handle;
    char uuid[96];
    uint32_t caps;     /* fields still asked for */
    uint32_t disabled; /* fields switched off since Python last drained them */
    int lost;
    int64_t lost_t_ns;
    uint64_t lost_code;
    uint64_t errors;
    otg_ret_t last_error;
    int have_prev_ecc;
    uint64_t prev_ecc_uncorr, prev_throttle;
    uint32_t off_code[32]; /* NVML return that switched field bit k off */
    /* GPM: two samples used alternately; gpm_caps = metrics still asked for. */
    nvmlGpmSample_t gpm_sample[2];
    int gpm_cur, gpm_have_prev;
    int64_t gpm_prev_t;
    uint32_t gpm_caps;
    otg_sample_t *ring;
    uint64_t head; /* samples ever pushed; slot = index % cap */
} otg_device_t;

typedef struct {
    uint64_t samples;
    int lost;
    uint32_t valid; /* OTG_F_* bits: which outputs below are meaningful */
    double gpu_util_mean, gpu_util_min, gpu_util_max, mem_util_mean;
    uint64_t mem_used_peak, mem_total;
    double power_mean_w, power_max_w;
    double energy_j;
    int energy_from_counter;
    uint32_t temp_max;
    double sm_clock_mean;
    uint64_t reasons;
    double throttled_fraction;
    uint64_t ecc_corr_delta, ecc_uncorr_delta, pcie_tx, pcie_rx, nvlink_tx, nvlink_rx;
    uint64_t mem_reserved; /* newest used sample's */
    uint32_t mem_temp_max;
    uint64_t pcie_replay_delta;
    double enc_util_mean, dec_util_mean;
    uint32_t gpm_valid;
    double gpm[OTG_NGPM]; /* time-weighted means over the GPM intervals (see otg_window) */
} otg_window_t;

typedef struct {
    otg_nvml_t nvml;
    int loaded, inited;
    int ndev;
    otg_device_t *dev;
    uint64_t cap;
    int64_t interval_ns, offset_ns;
    pthread_mutex_t data_lock, tick_lock, wake_lock;
    pthread_cond_t wake;
    int stop; /* read/written with __atomic builtins */
    otg_evset_t evset;
    otg_event_t *events;
    uint64_t ev_cap, ev_head, ev_dropped;
    int64_t ev_newest_t; /* latest t_ns of any event pushed (valid when ev_head > 0) */
    uint64_t ticks, samples, dropped, overwritten;
    int64_t busy_ns;
} otg_state_t;

/* ---- time and locks ----------------------------------------------------- */

static int64_t otg_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int64_t otg_now_ns(const otg_state_t *st) { return otg_mono_ns() + st->offset_ns; }

static int otg_stopping(otg_state_t *st) { return __atomic_load_n(&st->stop, __ATOMIC_ACQUIRE); }

static void otg_init_locks(otg_state_t *st)
{
    pthread_condattr_t ca;
    pthread_mutex_init(&st->data_lock, NULL);
    pthread_mutex_init(&st->tick_lock, NULL);
    pthread_mutex_init(&st->wake_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->wake, &ca);
    pthread_condattr_destroy(&ca);
}

/* Sleep until the monotonic deadline or until otg_request_stop(). */
static void otg_sleep_until(otg_state_t *st, int64_t deadline_mono_ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline_mono_ns / 1000000000ll);
    ts.tv_nsec = (long)(deadline_mono_ns % 1000000000ll);
    pthread_mutex_lock(&st->wake_lock);
    while (!otg_stopping(st) && otg_mono_ns() < deadline_mono_ns) {
        if (pthread_cond_timedwait(&st->wake, &st->wake_lock, &ts) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&st->wake_lock);
}

static void otg_request_stop(otg_state_t *st)
{
    pthread_mutex_lock(&st->wake_lock);
    __atomic_store_n(&st->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&st->wake);
    pthread_mutex_unlock(&st->wake_lock);
}

static void otg_clear_stop(otg_state_t *st) { __atomic_store_n(&st->stop, 0, __ATOMIC_RELEASE); }

/* ---- life cycle ---------------------------------------------------------- */

static void otg_destroy(otg_state_t *st)
{
    if (st == NULL) return;
    if (st->dev != NULL) {
        for (int i = 0; i < st->ndev; i++) free(st->dev[i].ring);
        free(st->dev);
    }
    free(st->events);
    free(st);
}

/* Allocate a state for ndev devices; NULL when out of memory. */
static otg_state_t *otg_create(int ndev, uint64_t cap, int64_t interval_ns, int64_t offset_ns,
                               uint64_t ev_cap)
{
    otg_state_t *st = (otg_state_t *)calloc(1, sizeof(otg_state_t));
    if (st == NULL) return NULL;
    st->ndev = ndev;
    st->cap = cap < 2 ? 2 : cap;
    st->interval_ns = interval_ns;
    st->offset_ns = offset_ns;
    st->ev_cap = ev_cap < 16 ? 16 : ev_cap;
    st->dev = (otg_device_t *)calloc(ndev > 0 ? (size_t)ndev : 1, sizeof(otg_device_t));
    st->events = (otg_event_t *)calloc((size_t)st->ev_cap, sizeof(otg_event_t));
    if (st->dev == NULL || st->events == NULL) {
        otg_destroy(st);
        return NULL;
    }
    for (int i = 0; i < ndev; i++) {
        st->dev[i].caps = OTG_F_ALL;
        st->dev[i].gpm_caps = OTG_GPM_ALL;
        st->dev[i].ring = (otg_sample_t *)calloc((size_t)st->cap, sizeof(otg_sample_t));
        if (st->dev[i].ring == NULL) {
            otg_destroy(st);
            return NULL;
        }
    }
    otg_init_locks(st);
    return st;
}

/* ---- events -------------------------------------------------------------- */

/* data_lock held. */
static void otg_push_event(otg_state_t *st, int64_t t_ns, int dev, int kind, uint64_t code,
                           uint64_t detail)
{
    otg_event_t *e = &st->events[st->ev_head % st->ev_cap];
    if (st->ev_head >= st->ev_cap) st->ev_dropped++;
    if (st->ev_head == 0 || t_ns > st->ev_newest_t) st->ev_newest_t = t_ns;
    e->t_ns = t_ns;
    e->dev = dev;
    e->kind = kind;
    e->code = code;
    e->detail = detail;
    st->ev_head++;
}

/* data_lock held: first loss of a device records a device_lost event. */
static void otg_mark_lost(otg_state_t *st, int i, int64_t t_ns, uint64_t code)
{
    otg_device_t *d = &st->dev[i];
    if (d->lost) return;
    d->lost = 1;
    d->lost_t_ns = t_ns;
    d->lost_code = code;
    otg_push_event(st, t_ns, i, OTG_EV_DEVICE_LOST, code, 0);
}

/* ---- NVML open / close --------------------------------------------------- */

/*
 * Load the library (once), nvmlInit, resolve each device's handle by UUID.
 * Returns 0, or -1 with st->nvml.error set (library or init failure). A device
 * whose handle cannot be obtained is marked lost (code = NVML return value).
 */
static int otg_open(otg_state_t *st, const char *path)
{
    if (!st->loaded) {
        if (otg_nvml_load(&st->nvml, path) != 0) return -1;
        st->loaded = 1;
    }
    if (!st->inited) {
        otg_ret_t r = st->nvml.Init();
        if (r != OTG_NVML_SUCCESS) {
            snprintf(st->nvml.error, sizeof st->nvml.error, "nvmlInit failed with NVML error %u",
                     r);
            return -1;
        }
        st->inited = 1;
    }
    for (int i = 0; i < st->ndev; i++) {
        otg_device_t *d = &st->dev[i];
        otg_ret_t r = st->nvml.DeviceGetHandleByUUID(d->uuid, &d->handle);
        if (r != OTG_NVML_SUCCESS) {
            pthread_mutex_lock(&st->data_lock);
            otg_mark_lost(st, i, otg_now_ns(st), r);
            pthread_mutex_unlock(&st->data_lock);
        }
    }
    return 0;
}

/* Create the event set and register XID events; 0 when XIDs will be delivered. */
static int otg_events_open(otg_state_t *st)
{
    otg_nvml_t *n = &st->nvml;
    int registered = 0;
    if (st->evset != NULL) return 0;
    if (n->EventSetCreate == NULL || n->DeviceRegisterEvents == NULL || n->EventSetWait == NULL)
        return -1;
    if (n->EventSetCreate(&st->evset) != OTG_NVML_SUCCESS) {
        st->evset = NULL;
        return -1;
    }
    for (int i = 0; i < st->ndev; i++) {
        unsigned long long supported = OTG_EVENT_XID;
        if (st->dev[i].lost) continue;
        if (n->DeviceGetSupportedEventTypes != NULL &&
            n->DeviceGetSupportedEventTypes(st->dev[i].handle, &supported) != OTG_NVML_SUCCESS)
            continue;
        if (!(supported & OTG_EVENT_XID)) continue;
        if (n->DeviceRegisterEvents(st->dev[i].handle, OTG_EVENT_XID, st->evset) ==
            OTG_NVML_SUCCESS)
            registered++;
    }
    if (registered == 0) {
        if (n->EventSetFree != NULL) n->EventSetFree(st->evset);
        st->evset = NULL;
        return -1;
    }
    return 0;
}

/* Free the event set and balance nvmlInit (threads must have stopped). */
static void otg_close(otg_state_t *st)
{
    for (int i = 0; i < st->ndev; i++) {
        otg_device_t *d = &st->dev[i];
        for (int k = 0; k < 2; k++) {
            if (d->gpm_sample[k] != NULL && st->nvml.GpmSampleFree != NULL)
                st->nvml.GpmSampleFree(d->gpm_sample[k]);
            d->gpm_sample[k] = NULL;
        }
        d->gpm_have_prev = 0;
    }
    if (st->evset != NULL && st->nvml.EventSetFree != NULL) st->nvml.EventSetFree(st->evset);
    st->evset = NULL;
    if (st->inited && st->nvml.Shutdown != NULL) st->nvml.Shutdown();
    st->inited = 0;
}

/* ---- sampling ------------------------------------------------------------ */

#define OTG_CALL(fn, ...) ((fn) != NULL ? (fn)(__VA_ARGS__) : OTG_NVML_ERROR_FUNCTION_NOT_FOUND)

static int otg_is_lost_code(otg_ret_t r) { return r == OTG_NVML_ERROR_GPU_IS_LOST || r == 28u; }

/* Classify one NVML result for the fields in `bits`; 1 when the values are valid. */
static int otg_check(otg_device_t *d, otg_sample_t *s, uint32_t bits, otg_ret_t r)
{
    if (r == OTG_NVML_SUCCESS) {
        s->valid |= bits;
        return 1;
    }
    if (r == OTG_NVML_ERROR_NOT_SUPPORTED || r == OTG_NVML_ERROR_FUNCTION_NOT_FOUND ||
        r == OTG_NVML_ERROR_ARGUMENT_VERSION_MISMATCH || r == OTG_OFF_GPM_DEVICE ||
        r == OTG_OFF_GPM_NO_PERMISSION) {
        for (int k = 0; k < 32; k++)
            if (bits & (1u << k)) d->off_code[k] = r;
        __atomic_and_fetch(&d->caps, ~bits, __ATOMIC_RELAXED);
        __atomic_or_fetch(&d->disabled, bits, __ATOMIC_RELAXED);
    } else if (otg_is_lost_code(r)) {
        s->status = OTG_STATUS_LOST;
        d->last_error = r;
    } else {
        s->nerrors++;
        d->errors++;
        d->last_error = r;
    }
    return 0;
}

#define OTG_LOST(s) ((s)->status == OTG_STATUS_LOST)

/* GPM for device d: support check and sample allocation on first use (the probe stops
 * there), then one nvmlGpmSampleGet per call at least OTG_GPM_MIN_INTERVAL_NS after the
 * previous one and the metrics between the two. A time going backwards (a caller's own
 * timestamps) restarts from this sample. */
static void otg_sample_gpm(otg_nvml_t *n, otg_device_t *d, otg_sample_t *s, int probing)
{
    otg_ret_t r;
    if (d->gpm_sample[0] == NULL) {
        nvmlGpmSupport_t sup;
        if (n->GpmQueryDeviceSupport == NULL || n->GpmSampleAlloc == NULL ||
            n->GpmSampleGet == NULL || n->GpmMetricsGet == NULL) {
            otg_check(d, s, OTG_F_GPM, OTG_NVML_ERROR_FUNCTION_NOT_FOUND);
            return;
        }
        memset(&sup, 0, sizeof sup);
        sup.version = NVML_GPM_SUPPORT_VERSION;
        r = n->GpmQueryDeviceSupport(d->handle, &sup);
        if (r == OTG_NVML_SUCCESS && !sup.isSupportedDevice) r = OTG_OFF_GPM_DEVICE;
        if (r == OTG_NVML_ERROR_NO_PERMISSION) r = OTG_OFF_GPM_NO_PERMISSION;
        if (r != OTG_NVML_SUCCESS) {
            otg_check(d, s, OTG_F_GPM, r);
            return;
        }
        r = n->GpmSampleAlloc(&d->gpm_sample[0]);
        if (r == OTG_NVML_SUCCESS) r = n->GpmSampleAlloc(&d->gpm_sample[1]);
        if (r != OTG_NVML_SUCCESS) {
            if (d->gpm_sample[0] != NULL && n->GpmSampleFree != NULL)
                n->GpmSampleFree(d->gpm_sample[0]);
            d->gpm_sample[0] = d->gpm_sample[1] = NULL;
            otg_check(d, s, OTG_F_GPM, r);
            return;
        }
        d->gpm_cur = 0;
        d->gpm_have_prev = 0;
    }
    if (probing) return;
    if (d->gpm_have_prev && s->t_ns > d->gpm_prev_t &&
        s->t_ns - d->gpm_prev_t < OTG_GPM_MIN_INTERVAL_NS)
        return; /* too soon: this sample has no GPM values */
    r = n->GpmSampleGet(d->handle, d->gpm_sample[d->gpm_cur]);
    if (r == OTG_NVML_ERROR_NO_PERMISSION) r = OTG_OFF_GPM_NO_PERMISSION;
    if (r != OTG_NVML_SUCCESS) {
        d->gpm_have_prev = 0;
        otg_check(d, s, OTG_F_GPM, r);
        return;
    }
    if (d->gpm_have_prev && s->t_ns > d->gpm_prev_t && d->gpm_caps != 0) {
        nvmlGpmMetricsGet_t mg;
        int idx[OTG_NGPM], nm = 0;
        memset(&mg, 0, sizeof mg);
        mg.version = NVML_GPM_METRICS_GET_VERSION;
        mg.sample1 = d->gpm_sample[1 - d->gpm_cur];
        mg.sample2 = d->gpm_sample[d->gpm_cur];
        for (int k = 0; k < OTG_NGPM; k++) {
            if (!(d->gpm_caps & (1u << k))) continue;
            mg.metrics[nm].metricId = OTG_GPM_IDS[k];
            idx[nm++] = k;
        }
        mg.numMetrics = (unsigned int)nm;
        r = n->GpmMetricsGet(&mg);
        if (r != OTG_NVML_SUCCESS) {
            otg_check(d, s, OTG_F_GPM, r);
        } else {
            for (int j = 0; j < nm; j++) {
                otg_ret_t mr = mg.metrics[j].nvmlReturn;
                if (mr == OTG_NVML_SUCCESS) {
                    s->gpm[idx[j]] = mg.metrics[j].value;
                    s->gpm_valid |= 1u << idx[j];
                } else if (mr == OTG_NVML_ERROR_NOT_SUPPORTED) {
                    d->gpm_caps &= ~(1u << idx[j]); /* e.g. NVLink rates on a PCIe card */
                } else {
                    s->nerrors++;
                    d->errors++;
                    d->last_error = mr;
                }
            }
            if (s->gpm_valid) {
                s->valid |= OTG_F_GPM;
                s->gpm_dt_ns = s->t_ns - d->gpm_prev_t;
            }
        }
    }
    d->gpm_prev_t = s->t_ns;
    d->gpm_have_prev = 1;
    d->gpm_cur = 1 - d->gpm_cur;
}

/* Take one sample of device d (no lock held: only NVML calls and local writes). The probe
 * (probing = 1) checks GPM support without taking a GPM sample. */
static void otg_sample_device(otg_nvml_t *n, otg_device_t *d, otg_sample_t *s, int64_t t_ns,
                              int probing)
{
    otg_ret_t r;
    otg_dev_t h = d->handle;
    unsigned int period; /* of the codec utilizations: not kept */
/* One value of type `type` read into s->field when the device has `bit` and is not lost:
 * n->fn(h, ...), where the arguments after the handle name the value &v_. */
#define OTG_READ(bit, type, field, fn, ...)                                    \
    if ((d->caps & (bit)) && !OTG_LOST(s)) {                                   \
        type v_;                                                               \
        r = OTG_CALL(n->fn, h, __VA_ARGS__);                                   \
        if (otg_check(d, s, (bit), r)) s->field = v_;                          \
    }
    memset(s, 0, sizeof *s);
    s->t_ns = t_ns;
    if ((d->caps & OTG_F_UTIL) && !OTG_LOST(s)) {
        otg_utilization_t u;
        r = OTG_CALL(n->DeviceGetUtilizationRates, h, &u);
        if (otg_check(d, s, OTG_F_UTIL, r)) {
            s->gpu_util = u.gpu;
            s->mem_util = u.memory;
        }
    }
    if ((d->caps & OTG_F_MEM_RESERVED) && (d->caps & OTG_F_MEMORY) && !OTG_LOST(s)) {
        /* v2 (drivers >= 515): used excludes the reserved memory, as nvidia-smi shows. */
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = OTG_NVML_MEMORY_V2_VERSION;
        r = OTG_CALL(n->DeviceGetMemoryInfo_v2, h, &m2);
        if (otg_check(d, s, OTG_F_MEMORY | OTG_F_MEM_RESERVED, r)) {
            s->mem_used = m2.used;
            s->mem_total = m2.total;
            s->mem_reserved = m2.reserved;
        } else if (!(d->caps & OTG_F_MEM_RESERVED)) {
            /* v2 unsupported: keep memory (v1 below), drop only the reserved field. */
            __atomic_or_fetch(&d->caps, OTG_F_MEMORY, __ATOMIC_RELAXED);
            __atomic_and_fetch(&d->disabled, ~OTG_F_MEMORY, __ATOMIC_RELAXED);
            d->off_code[1] = 0;
        }
    }
    if ((d->caps & OTG_F_MEMORY) && !(d->caps & OTG_F_MEM_RESERVED) && !OTG_LOST(s)) {
        otg_memory_t m;
        r = OTG_CALL(n->DeviceGetMemoryInfo, h, &m);
        if (otg_check(d, s, OTG_F_MEMORY, r)) {
            s->mem_used = m.used;
            s->mem_total = m.total;
        }
    }
    OTG_READ(OTG_F_POWER, unsigned int, power_mw, DeviceGetPowerUsage, &v_)
    OTG_READ(OTG_F_TEMP, unsigned int, temperature_c, DeviceGetTemperature, OTG_TEMPERATURE_GPU,
             &v_)
    OTG_READ(OTG_F_SM_CLOCK, unsigned int, sm_clock_mhz, DeviceGetClockInfo, OTG_CLOCK_SM, &v_)
    OTG_READ(OTG_F_MEM_CLOCK, unsigned int, mem_clock_mhz, DeviceGetClockInfo, OTG_CLOCK_MEM, &v_)
    OTG_READ(OTG_F_REASONS, unsigned long long, reasons, DeviceGetCurrentClocksEventReasons, &v_)
    if (!OTG_LOST(s)) {
        otg_field_value_t fv[OTG_NFIELDS];
        uint32_t bit[OTG_NFIELDS];
        int nf = 0;
        memset(fv, 0, sizeof fv);
        for (int k = 0; k < OTG_NFIELDS; k++) {
            if (!(d->caps & OTG_FIELD_TABLE[k].bit)) continue;
            fv[nf].fieldId = OTG_FIELD_TABLE[k].id;
            fv[nf].scopeId = OTG_FIELD_TABLE[k].scope;
            bit[nf++] = OTG_FIELD_TABLE[k].bit;
        }
        if (nf > 0) {
            r = OTG_CALL(n->DeviceGetFieldValues, h, nf, fv);
            if (r != OTG_NVML_SUCCESS) {
                uint32_t all = 0;
                for (int k = 0; k < nf; k++) all |= bit[k];
                otg_check(d, s, all, r);
            } else {
                for (int k = 0; k < nf; k++) {
                    if (!otg_check(d, s, bit[k], fv[k].nvmlReturn)) continue;
                    unsigned long long v = otg_field_u64(&fv[k]);
                    if (bit[k] == OTG_F_ENERGY) s->energy_mj = v;
                    else if (bit[k] == OTG_F_ECC_CORR) s->ecc_corr = v;
                    else if (bit[k] == OTG_F_ECC_UNCORR) s->ecc_uncorr = v;
                    else if (bit[k] == OTG_F_PCIE_TX) s->pcie_tx = v;
                    else if (bit[k] == OTG_F_PCIE_RX) s->pcie_rx = v;
                    else if (bit[k] == OTG_F_NVLINK_TX) s->nvlink_tx = v * 1024ull;
                    else if (bit[k] == OTG_F_NVLINK_RX) s->nvlink_rx = v * 1024ull;
                    else if (bit[k] == OTG_F_MEM_TEMP) s->mem_temp_c = (uint32_t)v;
                    else if (bit[k] == OTG_F_PCIE_REPLAY) s->pcie_replay = (uint32_t)v;
                    else if (bit[k] == OTG_F_REMAP)
                        s->remap[fv[k].fieldId - NVML_FI_DEV_REMAPPED_COR] = (uint32_t)v;
                    else {
                        for (int j = 0; j < OTG_NTHROTTLE; j++)
                            if (bit[k] == (OTG_F_THR0 << j)) s->throttle_ns[j] = v;
                    }
                }
            }
        }
    }
    OTG_READ(OTG_F_FAN, unsigned int, fan_pct, DeviceGetFanSpeed, &v_)
    OTG_READ(OTG_F_PSTATE, unsigned int, pstate, DeviceGetPerformanceState, &v_)
    OTG_READ(OTG_F_ENC, unsigned int, enc_util, DeviceGetEncoderUtilization, &v_, &period)
    OTG_READ(OTG_F_DEC, unsigned int, dec_util, DeviceGetDecoderUtilization, &v_, &period)
#undef OTG_READ
    if ((d->caps & OTG_F_GPM) && !OTG_LOST(s)) otg_sample_gpm(n, d, s, probing);
    if (s->status != OTG_STATUS_LOST && s->nerrors > 0) s->status = OTG_STATUS_FIELD_ERRORS;
}

/* data_lock held: append s to device i's ring and derive events from it. */
static void otg_push_sample(otg_state_t *st, int i, otg_sample_t *s)
{
    otg_device_t *d = &st->dev[i];
    if (d->head > 0) {
        int64_t prev_t = d->ring[(d->head - 1) % st->cap].t_ns;
        if (s->t_ns < prev_t) s->t_ns = prev_t; /* keep each ring sorted by time */
    }
    if (d->head >= st->cap) st->overwritten++;
    d->ring[d->head % st->cap] = *s;
    d->head++;
    st->samples++;
    if (s->valid & OTG_F_ECC_UNCORR) {
        if (d->have_prev_ecc && s->ecc_uncorr > d->prev_ecc_uncorr)
            otg_push_event(st, s->t_ns, i, OTG_EV_ECC_UNCORRECTED,
                           s->ecc_uncorr - d->prev_ecc_uncorr, s->ecc_uncorr);
        d->prev_ecc_uncorr = s->ecc_uncorr;
        d->have_prev_ecc = 1;
    }
    if (s->valid & OTG_F_REASONS) {
        uint64_t cur = s->reasons & OTG_THROTTLE_MASK;
        uint64_t started = cur & ~d->prev_throttle;
        if (started) otg_push_event(st, s->t_ns, i, OTG_EV_THROTTLE_START, started, cur);
        d->prev_throttle = cur;
    }
    if (s->status == OTG_STATUS_LOST) otg_mark_lost(st, i, s->t_ns, d->last_error);
}

/*
 * One tick: sample every device that is not lost. t_ns = 0 stamps each sample with
 * the sampler clock when its device is read; any other value stamps them all with
 * t_ns (sample_once(timestamp_ns=...)). from_loop: give up between devices once a
 * stop was requested, so stop() is bounded by one device's calls.
 */
static void otg_tick(otg_state_t *st, int64_t t_ns, int from_loop)
{
    otg_sample_t s;
    pthread_mutex_lock(&st->tick_lock);
    for (int i = 0; i < st->ndev; i++) {
        int lost;
        if (from_loop && otg_stopping(st)) break;
        pthread_mutex_lock(&st->data_lock);
        lost = st->dev[i].lost;
        pthread_mutex_unlock(&st->data_lock);
        if (lost || !st->inited) continue;
        otg_sample_device(&st->nvml, &st->dev[i], &s, t_ns != 0 ? t_ns : otg_now_ns(st), 0);
        pthread_mutex_lock(&st->data_lock);
        if (!st->dev[i].lost) otg_push_sample(st, i, &s);
        pthread_mutex_unlock(&st->data_lock);
    }
    st->ticks++;
    pthread_mutex_unlock(&st->tick_lock);
}

/* Capability probe: one sample of each device, not stored. Unsupported fields are
 * switched off (reported through `disabled`), unreachable devices marked lost. */
static void otg_probe(otg_state_t *st)
{
    otg_sample_t s;
    pthread_mutex_lock(&st->tick_lock);
    for (int i = 0; i < st->ndev; i++) {
        if (st->dev[i].lost || !st->inited) continue;
        otg_sample_device(&st->nvml, &st->dev[i], &s, otg_now_ns(st), 1);
        if (s.status == OTG_STATUS_LOST) {
            pthread_mutex_lock(&st->data_lock);
            otg_mark_lost(st, i, s.t_ns, st->dev[i].last_error);
            pthread_mutex_unlock(&st->data_lock);
        }
    }
    pthread_mutex_unlock(&st->tick_lock);
}

/* The sampling thread's body: a tick every interval_ns until otg_request_stop(). */
static void otg_loop(otg_state_t *st)
{
    int64_t next = otg_mono_ns();
    while (!otg_stopping(st)) {
        int64_t begin = otg_mono_ns(), now;
        otg_tick(st, 0, 1);
        now = otg_mono_ns();
        st->busy_ns += now - begin;
        next += st->interval_ns;
        if (now - next >= st->interval_ns) {
            /* Ticks that could not be taken on time are dropped, not bunched up. */
            int64_t missed = (now - next) / st->interval_ns;
            pthread_mutex_lock(&st->data_lock);
            st->dropped += (uint64_t)missed;
            pthread_mutex_unlock(&st->data_lock);
            next += missed * st->interval_ns;
        }
        if (next > now) otg_sleep_until(st, next);
    }
}

/* data_lock held: device index for an event's handle, or -1. */
static int otg_device_of(otg_state_t *st, otg_dev_t h)
{
    for (int i = 0; i < st->ndev; i++)
        if (st->dev[i].handle == h) return i;
    return -1;
}

/* The XID waiter thread's body: nvmlEventSetWait with a short timeout until stop. */
static void otg_waiter(otg_state_t *st)
{
    otg_event_data_t ev;
    while (!otg_stopping(st) && st->evset != NULL) {
        otg_ret_t r;
        memset(&ev, 0, sizeof ev);
        r = st->nvml.EventSetWait(st->evset, &ev, OTG_WAIT_MS);
        if (r == OTG_NVML_SUCCESS) {
            int64_t t = otg_now_ns(st);
            pthread_mutex_lock(&st->data_lock);
            int i = otg_device_of(st, ev.device);
            if (i >= 0 && (ev.eventType & OTG_EVENT_XID)) {
                otg_push_event(st, t, i, OTG_EV_XID, ev.eventData, ev.eventType);
                if (ev.eventData == 79ull) otg_mark_lost(st, i, t, 79ull);
            }
            pthread_mutex_unlock(&st->data_lock);
        } else if (r != OTG_NVML_ERROR_TIMEOUT) {
            /* GPU_IS_LOST, UNINITIALIZED, ...: never busy-spin on a failing wait. */
            otg_sleep_until(st, otg_mono_ns() + (int64_t)OTG_WAIT_MS * 1000000ll);
        }
    }
}

/* ---- reading --------------------------------------------------------------- */

static void otg_lock_data(otg_state_t *st) { pthread_mutex_lock(&st->data_lock); }
static void otg_unlock_data(otg_state_t *st) { pthread_mutex_unlock(&st->data_lock); }

/* Fields switched off since the previous call (set atomically by the sampling thread). */
static uint32_t otg_take_disabled(otg_state_t *st, int i)
{
    return __atomic_exchange_n(&st->dev[i].disabled, 0u, __ATOMIC_RELAXED);
}

/* Copy device i's newest sample; 1 when there is one. */
static int otg_latest(otg_state_t *st, int i, otg_sample_t *out)
{
    int found = 0;
    pthread_mutex_lock(&st->data_lock);
    otg_device_t *d = &st->dev[i];
    if (d->head > 0) {
        *out = d->ring[(d->head - 1) % st->cap];
        found = 1;
    }
    pthread_mutex_unlock(&st->data_lock);
    return found;
}

/* data_lock held: the k-th oldest retained sample of d (k < retained). */
static const otg_sample_t *otg_at(const otg_state_t *st, const otg_device_t *d, uint64_t first,
                                  uint64_t k)
{
    return &d->ring[(first + k) % st->cap];
}

/* Sum and count of one sample field over a window: its mean (and valid bit) is set only
 * when some sample had the field. */
typedef struct {
    uint64_t n, sum;
} otg_mean_t;

static void otg_mean_add(otg_mean_t *m, uint64_t v)
{
    m->sum += v;
    m->n++;
}

static void otg_mean_put(const otg_mean_t *m, otg_window_t *w, uint32_t bit, double *mean)
{
    if (m->n == 0) return;
    w->valid |= bit;
    *mean = (double)m->sum / (double)m->n;
}

/*
 * data_lock held: the first k in [0, n) whose sample is not before t (t_k >= t, or
 * t_k > t when `after`), n when every sample is. Samples are in time order, and spans
 * ask about the last moments: the search gallops back from the newest sample (1, 2, 4...
 * samples) and bisects only the bracket it finds, so a recent window touches a few
 * samples at the end of the ring instead of log2(cap) spread over all of it (cache and
 * TLB misses: a full binary search over a cold ring cost ~30 us).
 */
static uint64_t otg_partition(const otg_state_t *st, const otg_device_t *d, uint64_t first,
                              uint64_t n, int64_t t, int after)
{
#define OTG_BEFORE(k)                                                          \
    (after ? otg_at(st, d, first, (k))->t_ns <= t : otg_at(st, d, first, (k))->t_ns < t)
    uint64_t x, y, step = 1;
    if (n == 0 || OTG_BEFORE(n - 1)) return n;
    y = n - 1; /* not before t */
    for (;;) {
        if (step > y) {
            x = 0;
            break;
        }
        x = y - step;
        if (OTG_BEFORE(x)) {
            x++; /* the answer is in (x, y] */
            break;
        }
        y = x;
        step <<= 1;
    }
    while (x < y) {
        uint64_t m = x + (y - x) / 2;
        if (OTG_BEFORE(m)) x = m + 1;
        else y = m;
    }
    return x;
#undef OTG_BEFORE
}

/*
 * Statistics of device i over [s_ns, e_ns] (both inclusive). The rules, shared
 * with the pure twin (_core_py.window):
 *   - used samples: those with s <= t <= e; when there are none, the newest
 *     sample before s (the value in effect); none at all -> return 0;
 *   - means are arithmetic means over used samples that have the field;
 *   - counters (energy, ECC, PCIe, NVLink) are deltas between sample a (the newest
 *     at or before s, else the first used one) and sample b (the last used one);
 *   - energy_j = delta_mJ x (e - s) / (t_b - t_a) / 1000 when both the window and
 *     t_b - t_a span at least the counter's ~100 ms refresh; else
 *     power_mean_w x (e - s) / 1e9;
 *   - GPM metrics: a sample's gpm[k] covers (t - gpm_dt_ns, t]; the window uses the used
 *     samples with t > s (all used ones when there are none) and takes the mean of
 *     gpm[k] weighted by gpm_dt_ns, so adjacent windows partition the GPM intervals.
 * Returns 1 with *w filled, 0 when there is no data.
 */
static int otg_window(otg_state_t *st, int i, int64_t s_ns, int64_t e_ns, otg_window_t *w)
{
    memset(w, 0, sizeof *w);
    if (e_ns < s_ns) return 0;
    pthread_mutex_lock(&st->data_lock);
    const otg_device_t *d = &st->dev[i];
    uint64_t n = d->head < st->cap ? d->head : st->cap;
    uint64_t first = d->head - n;
    uint64_t lo, hi, a, b, f, l;
    lo = otg_partition(st, d, first, n, s_ns, 0); /* first k with t >= s */
    hi = otg_partition(st, d, first, n, e_ns, 1); /* first k with t > e */
    if (hi > lo) {
        f = lo;
        l = hi - 1;
    } else if (lo > 0) {
        f = l = lo - 1;
    } else {
        pthread_mutex_unlock(&st->data_lock);
        return 0;
    }
    /* a: the newest sample at or before s (else the first one used); b: the last used. */
    if (lo < n && otg_at(st, d, first, lo)->t_ns == s_ns) a = lo;
    else a = lo > 0 ? lo - 1 : lo;
    b = l;
    uint64_t n_util = 0, sum_gpu = 0, sum_mem = 0, n_power = 0, sum_power = 0, max_power = 0;
    uint64_t n_reason = 0, n_throttled = 0;
    uint32_t min_gpu = 0, max_gpu = 0;
    otg_mean_t sm = {0, 0}, enc = {0, 0}, dec = {0, 0};
/* The largest value of a sample field over the window (the first sample with it sets it). */
#define OTG_PEAK(bit, field, peak)                                             \
    if (p->valid & (bit)) {                                                    \
        if (!(w->valid & (bit)) || p->field > w->peak) w->peak = p->field;     \
        w->valid |= (bit);                                                     \
    }
    for (uint64_t k = f; k <= l; k++) {
        const otg_sample_t *p = otg_at(st, d, first, k);
        if (p->valid & OTG_F_UTIL) {
            if (n_util == 0 || p->gpu_util < min_gpu) min_gpu = p->gpu_util;
            if (n_util == 0 || p->gpu_util > max_gpu) max_gpu = p->gpu_util;
            sum_gpu += p->gpu_util;
            sum_mem += p->mem_util;
            n_util++;
        }
        OTG_PEAK(OTG_F_MEMORY, mem_used, mem_used_peak)
        if (p->valid & OTG_F_MEMORY) w->mem_total = p->mem_total;
        if (p->valid & OTG_F_POWER) {
            if (n_power == 0 || p->power_mw > max_power) max_power = p->power_mw;
            sum_power += p->power_mw;
            n_power++;
        }
        OTG_PEAK(OTG_F_TEMP, temperature_c, temp_max)
        if (p->valid & OTG_F_SM_CLOCK) otg_mean_add(&sm, p->sm_clock_mhz);
        if (p->valid & OTG_F_REASONS) {
            w->reasons |= p->reasons;
            if (p->reasons & OTG_THROTTLE_MASK) n_throttled++;
            n_reason++;
        }
        if (p->valid & OTG_F_MEM_RESERVED) {
            w->mem_reserved = p->mem_reserved;
            w->valid |= OTG_F_MEM_RESERVED;
        }
        OTG_PEAK(OTG_F_MEM_TEMP, mem_temp_c, mem_temp_max)
        if (p->valid & OTG_F_ENC) otg_mean_add(&enc, p->enc_util);
        if (p->valid & OTG_F_DEC) otg_mean_add(&dec, p->dec_util);
    }
#undef OTG_PEAK
    otg_mean_put(&sm, w, OTG_F_SM_CLOCK, &w->sm_clock_mean);
    otg_mean_put(&enc, w, OTG_F_ENC, &w->enc_util_mean);
    otg_mean_put(&dec, w, OTG_F_DEC, &w->dec_util_mean);
    {
        double gsum[OTG_NGPM], gw[OTG_NGPM];
        uint64_t g0 = f;
        while (g0 <= l && otg_at(st, d, first, g0)->t_ns <= s_ns) g0++;
        if (g0 > l) g0 = f;
        memset(gsum, 0, sizeof gsum);
        memset(gw, 0, sizeof gw);
        for (uint64_t k = g0; k <= l; k++) {
            const otg_sample_t *p = otg_at(st, d, first, k);
            if (!(p->valid & OTG_F_GPM)) continue;
            double dt = (double)p->gpm_dt_ns;
            for (int j = 0; j < OTG_NGPM; j++) {
                if (!(p->gpm_valid & (1u << j))) continue;
                gsum[j] += p->gpm[j] * dt;
                gw[j] += dt;
            }
        }
        for (int j = 0; j < OTG_NGPM; j++) {
            if (gw[j] > 0) {
                w->gpm[j] = gsum[j] / gw[j];
                w->gpm_valid |= 1u << j;
            }
        }
        if (w->gpm_valid) w->valid |= OTG_F_GPM;
    }
    w->samples = l - f + 1;
    if (n_util > 0) {
        w->valid |= OTG_F_UTIL;
        w->gpu_util_mean = (double)sum_gpu / (double)n_util;
        w->gpu_util_min = (double)min_gpu;
        w->gpu_util_max = (double)max_gpu;
        w->mem_util_mean = (double)sum_mem / (double)n_util;
    }
    if (n_power > 0) {
        w->valid |= OTG_F_POWER;
        w->power_mean_w = (double)sum_power / (double)n_power / 1000.0;
        w->power_max_w = (double)max_power / 1000.0;
    }
    if (n_reason > 0) {
        w->valid |= OTG_F_REASONS;
        w->throttled_fraction = (double)n_throttled / (double)n_reason;
    }
    const otg_sample_t *pa = otg_at(st, d, first, a), *pb = otg_at(st, d, first, b);
    uint32_t both = pa->valid & pb->valid;
    /* e_ns >= s_ns, but e_ns - s_ns overflows int64 for windows wider than ~292 years
     * (e.g. [INT64_MIN, INT64_MAX]); the unsigned difference is exact. */
    uint64_t span_ns = (uint64_t)e_ns - (uint64_t)s_ns;
    if (a < b && (both & OTG_F_ENERGY) && pb->energy_mj >= pa->energy_mj &&
        span_ns >= (uint64_t)OTG_ENERGY_MIN_SPAN_NS &&
        pb->t_ns - pa->t_ns >= OTG_ENERGY_MIN_SPAN_NS) {
        w->energy_j = (double)(pb->energy_mj - pa->energy_mj) * (double)span_ns /
                      (double)(pb->t_ns - pa->t_ns) / 1000.0;
        w->energy_from_counter = 1;
        w->valid |= OTG_F_ENERGY;
    } else if (n_power > 0) {
        w->energy_j = w->power_mean_w * (double)span_ns / 1e9;
        w->valid |= OTG_F_ENERGY;
    }
#define OTG_DELTA(bit, field, out)                                             \
    if ((both & (bit)) && pb->field >= pa->field) {                            \
        w->out = pb->field - pa->field;                                        \
        w->valid |= (bit);                                                     \
    }
    OTG_DELTA(OTG_F_ECC_CORR, ecc_corr, ecc_corr_delta)
    OTG_DELTA(OTG_F_ECC_UNCORR, ecc_uncorr, ecc_uncorr_delta)
    OTG_DELTA(OTG_F_PCIE_TX, pcie_tx, pcie_tx)
    OTG_DELTA(OTG_F_PCIE_RX, pcie_rx, pcie_rx)
    OTG_DELTA(OTG_F_NVLINK_TX, nvlink_tx, nvlink_tx)
    OTG_DELTA(OTG_F_NVLINK_RX, nvlink_rx, nvlink_rx)
    OTG_DELTA(OTG_F_PCIE_REPLAY, pcie_replay, pcie_replay_delta)
#undef OTG_DELTA
    w->lost = d->lost && d->lost_t_ns <= e_ns;
    pthread_mutex_unlock(&st->data_lock);
    return 1;
}

/*
 * Copy up to max retained events with s <= t <= e (oldest first), only device
 * `dev` (-1: all) and only kind `kind` (-1: all). Returns the number copied.
 */
static int otg_events_copy(otg_state_t *st, int64_t s_ns, int64_t e_ns, int dev, int kind,
                           otg_event_t *out, int max)
{
    int count = 0;
    pthread_mutex_lock(&st->data_lock);
    /* The common case, a window after the latest event: no walk over the whole ring
     * (up to ev_cap events, on every span of a long run with old events retained). */
    if (st->ev_head == 0 || st->ev_newest_t < s_ns) {
        pthread_mutex_unlock(&st->data_lock);
        return 0;
    }
    uint64_t n = st->ev_head < st->ev_cap ? st->ev_head : st->ev_cap;
    for (uint64_t k = st->ev_head - n; k < st->ev_head && count < max; k++) {
        const otg_event_t *e = &st->events[k % st->ev_cap];
        if (e->t_ns < s_ns || e->t_ns > e_ns) continue;
        if (dev >= 0 && e->dev != dev) continue;
        if (kind >= 0 && e->kind != kind) continue;
        out[count++] = *e;
    }
    pthread_mutex_unlock(&st->data_lock);
    return count;
}

/*
 * In a forked child: no thread of the parent exists and NVML state is not
 * inherited. Re-create the locks (one may have been held at fork time), forget
 * every sample and event (the child exports nothing of the parent's state), and
 * require a new nvmlInit before sampling again. The dlopen handle stays valid.
 */
static void otg_after_fork(otg_state_t *st)
{
    otg_init_locks(st);
    __atomic_store_n(&st->stop, 0, __ATOMIC_RELEASE);
    st->inited = 0;
    st->evset = NULL;
    st->ev_head = st->ev_dropped = 0;
    st->ticks = st->samples = st->dropped = st->overwritten = 0;
    st->busy_ns = 0;
    for (int i = 0; i < st->ndev; i++) {
        otg_device_t *d = &st->dev[i];
        d->head = 0;
        d->lost = 0;
        d->lost_t_ns = 0;
        d->lost_code = 0;
        d->errors = 0;
        d->last_error = 0;
        d->have_prev_ecc = 0;
        d->prev_ecc_uncorr = d->prev_throttle = 0;
        d->handle = NULL;
        d->caps = OTG_F_ALL;
        d->gpm_caps = OTG_GPM_ALL;
        d->gpm_sample[0] = d->gpm_sample[1] = NULL; /* the parent's; NVML state is gone */
        d->gpm_have_prev = 0;
        memset(d->off_code, 0, sizeof d->off_code);
        d->disabled = 0;
    }
}

#endif
