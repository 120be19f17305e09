/*
 * Event sets and delivery of scripted events (XIDs, ECC errors, GPU lost).
 *
 * Which scenario events become NVML events:
 *   xid  -> nvmlEventTypeXidCriticalError, eventData = the Xid code
 *   lost -> nvmlEventTypeXidCriticalError, eventData = 79 (fallen off the bus)
 *   ecc  -> nvmlEventTypeSingleBitEccError if it adds corrected errors and
 *           nvmlEventTypeDoubleBitEccError if it adds uncorrected ones, at its start time
 * An event is delivered once per (set, device), in time order, only if it occurred at
 * or after the device's registration ("events that occurred before this call are not
 * recorded"). nvmlEventSetWait_v2 returns at once when one is due, otherwise it blocks
 * up to the timeout (woken early when the virtual clock moves or an event is injected)
 * and then returns TIMEOUT, or GPU_IS_LOST when a registered device has fallen off the
 * bus; it never busy-returns.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"

#define SET_MAGIC 0x65767473u

struct sim_event_set {
    unsigned int magic;
    unsigned long long generation;
    unsigned long long mask[SIM_MAX_GPUS];
    long long reg_ns[SIM_MAX_GPUS];
    unsigned char delivered[SIM_MAX_EVENTS][SIM_MAX_GPUS]; /* bit per sub-event */
    struct sim_event_set *next;
};

static struct sim_event_set *g_sets;

static int valid_set(nvmlEventSet_t set) {
    for (struct sim_event_set *s = g_sets; s; s = s->next)
        if (s == set) return s->magic == SET_MAGIC;
    return 0;
}

static void set_clear(struct sim_event_set *s) {
    memset(s->mask, 0, sizeof(s->mask));
    memset(s->reg_ns, 0, sizeof(s->reg_ns));
    memset(s->delivered, 0, sizeof(s->delivered));
    s->generation = g_sim.generation;
}

/* Registrations do not survive a new scenario (devices may differ). Lock held. */
void sim_events_reset(void) {
    for (struct sim_event_set *s = g_sets; s; s = s->next) set_clear(s);
}

void sim_events_notify(void) { pthread_cond_broadcast(&g_sim.cond); }

int sim_event_set_register(nvmlEventSet_t set, int gi, unsigned long long types, long long now) {
    if (!valid_set(set)) return -1;
    if (set->generation != g_sim.generation) set_clear(set);
    if (!set->mask[gi]) set->reg_ns[gi] = now;
    set->mask[gi] |= types;
    return 0;
}

/* Sub-events of scenario event e: (type, data) pairs; returns how many. */
static int sub_events(const sim_event *e, unsigned long long type[2], unsigned long long data[2]) {
    switch (e->kind) {
    case EV_XID:
        type[0] = EVT_XID;
        data[0] = (unsigned long long)e->a;
        return 1;
    case EV_LOST:
        type[0] = EVT_XID;
        data[0] = 79;
        return 1;
    case EV_ECC: {
        int n = 0;
        if (e->a > 0) type[n] = EVT_SBE, data[n++] = 0;
        if (e->b > 0) type[n] = EVT_DBE, data[n++] = 0;
        return n;
    }
    default:
        return 0;
    }
}

/* Find the earliest due, undelivered event; lock held. Returns 1 and fills out. */
static int next_due(struct sim_event_set *s, long long now, nvmlEventData_t *out, long long *next_future) {
    int best_i = -1, best_g = -1, best_k = -1;
    long long best_t = 0;
    unsigned long long bt = 0, bd = 0;
    *next_future = -1;
    for (int i = 0; i < g_sim.nevents; i++) {
        const sim_event *e = &g_sim.events[i];
        unsigned long long type[2], data[2];
        int n = sub_events(e, type, data);
        for (int g = 0; g < g_sim.gpu_count && n; g++) {
            if (e->gpu != -1 && e->gpu != g) continue;
            if (!s->mask[g] || e->start_ns < s->reg_ns[g]) continue;
            for (int k = 0; k < n; k++) {
                if (!(s->mask[g] & type[k]) || (s->delivered[i][g] & (1u << k))) continue;
                if (e->start_ns > now) {
                    if (*next_future < 0 || e->start_ns < *next_future) *next_future = e->start_ns;
                    continue;
                }
                if (best_i < 0 || e->start_ns < best_t) {
                    best_i = i, best_g = g, best_k = k, best_t = e->start_ns;
                    bt = type[k], bd = data[k];
                }
            }
        }
    }
    if (best_i < 0) return 0;
    s->delivered[best_i][best_g] |= (unsigned char)(1u << best_k);
    out->device = &g_devices[best_g];
    out->eventType = bt;
    out->eventData = bd;
    out->gpuInstanceId = 0xFFFFFFFFu;
    out->computeInstanceId = 0xFFFFFFFFu;
    return 1;
}

static int registered_lost(struct sim_event_set *s, long long now) {
    for (int g = 0; g < g_sim.gpu_count; g++)
        if (s->mask[g] && sim_is_lost(g, now)) return 1;
    return 0;
}

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static nvmlReturn_t do_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    sim_lock();
    g_sim.calls++;
    if (g_sim.refcount <= 0) {
        sim_unlock();
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!data || !valid_set(set)) {
        sim_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    long long deadline = mono_ns() + (long long)timeout_ms * 1000000LL;
    nvmlReturn_t rc;
    for (;;) {
        if (set->generation != g_sim.generation) set_clear(set);
        long long now = sim_now_ns(), future;
        if (next_due(set, now, data, &future)) {
            rc = NVML_SUCCESS;
            break;
        }
        long long mono = mono_ns();
        if (mono >= deadline) {
            rc = registered_lost(set, now) ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_TIMEOUT;
            break;
        }
        long long wake = deadline;
        if (!g_sim.virtual_clock && future >= 0 && mono + (future - now) < wake) wake = mono + (future - now);
        struct timespec ts = {wake / 1000000000LL, wake % 1000000000LL};
        pthread_cond_timedwait(&g_sim.cond, &g_sim.lock, &ts);
        if (!valid_set(set)) { /* freed by another thread while we slept */
            rc = NVML_ERROR_INVALID_ARGUMENT;
            break;
        }
    }
    sim_unlock();
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    sim_lock();
    g_sim.calls++;
    if (g_sim.refcount <= 0) {
        sim_unlock();
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!set) {
        sim_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    struct sim_event_set *s = calloc(1, sizeof(*s));
    if (!s) {
        sim_unlock();
        return NVML_ERROR_MEMORY;
    }
    s->magic = SET_MAGIC;
    s->generation = g_sim.generation;
    s->next = g_sets;
    g_sets = s;
    *set = s;
    sim_unlock();
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    sim_lock();
    g_sim.calls++;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    for (struct sim_event_set **p = &g_sets; *p; p = &(*p)->next)
        if (*p == set) {
            *p = set->next;
            set->magic = 0;
            free(set);
            rc = NVML_SUCCESS;
            break;
        }
    if (rc == NVML_SUCCESS) pthread_cond_broadcast(&g_sim.cond);
    if (g_sim.refcount <= 0 && rc == NVML_SUCCESS) rc = NVML_SUCCESS; /* freeing is always allowed */
    sim_unlock();
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return do_wait(set, data, timeout_ms);
}

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
} nvmlEventData_v1_t;

SIM_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data, unsigned int timeout_ms) {
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t full;
    nvmlReturn_t rc = do_wait(set, &full, timeout_ms);
    if (rc == NVML_SUCCESS) {
        data->device = full.device;
        data->eventType = full.eventType;
        data->eventData = full.eventData;
    }
    return rc;
}
