/*
 * Control entry points of the simulator (prefix otelgpu_sim_, never nvml*), called by
 * otelgpu.sim through ctypes. All are thread-safe.
 *
 *   int  otelgpu_sim_configure(const char *text)    normalized scenario; resets all state
 *   int  otelgpu_sim_unconfigure(void)              back to "no scenario"; the nvmlInit
 *                                                   refcount is kept (see below)
 *   const char *otelgpu_sim_last_error(void)        message of the last failed call
 *   long long otelgpu_sim_now_ns(void)              scenario time (ns since start)
 *   long long otelgpu_sim_epoch_ns(void)            wall time (ns since 1970) of t = 0
 *   int  otelgpu_sim_set_time_ns(long long t)       virtual clock only; may go back
 *   int  otelgpu_sim_advance_ns(long long dt)       virtual clock only; dt >= 0
 *   int  otelgpu_sim_inject(const char *event)      one "event=" line body; "now" allowed
 *                                                   as start (scenario time of the call)
 *   int  otelgpu_sim_is_virtual(void), otelgpu_sim_gpu_count(void)
 *   unsigned long long otelgpu_sim_calls(void)      NVML calls served so far
 *   int  otelgpu_sim_refcount(void)
 *   const char *otelgpu_sim_features(void)          "name=bit,..." of the FEAT_* bits
 * Return 0 on success, -1 with otelgpu_sim_last_error() set otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "sim.h"

int sim_apply_config(const char *text, char *err, size_t errlen);

static __thread char t_error[512];

static int fail(const char *msg) {
    snprintf(t_error, sizeof(t_error), "%s", msg);
    return -1;
}

SIM_EXPORT const char *otelgpu_sim_last_error(void) { return t_error; }

SIM_EXPORT int otelgpu_sim_configure(const char *text) {
    char err[512];
    if (!text) return fail("no configuration text");
    if (sim_apply_config(text, err, sizeof(err))) return fail(err);
    return 0;
}

/* The nvmlInit refcount survives unloading a scenario, as it survives everything in the
 * real library: only nvmlShutdown lowers it. Zeroing it here let a client that still held
 * an init (a sampler collected later) cancel the init of the next client with its late
 * nvmlShutdown -- that client then read UNINITIALIZED and saw no fault. */
SIM_EXPORT int otelgpu_sim_unconfigure(void) {
    sim_lock();
    g_sim.configured = 0;
    g_sim.gpu_count = 0;
    g_sim.nevents = 0;
    g_sim.nprocs = 0;
    sim_index_events();
    g_sim.generation++;
    sim_events_reset();
    sim_events_notify();
    sim_unlock();
    return 0;
}

/* A getter: one value of the state, read under the lock. */
#define LOCKED_GETTER(type, fn, value)                                                            \
    SIM_EXPORT type fn(void) {                                                                    \
        sim_lock();                                                                               \
        type v_ = (value);                                                                        \
        sim_unlock();                                                                             \
        return v_;                                                                                \
    }

LOCKED_GETTER(long long, otelgpu_sim_now_ns, sim_now_ns())
LOCKED_GETTER(long long, otelgpu_sim_epoch_ns, g_sim.epoch_ns)
LOCKED_GETTER(int, otelgpu_sim_is_virtual, g_sim.virtual_clock)
LOCKED_GETTER(int, otelgpu_sim_gpu_count, g_sim.gpu_count)
LOCKED_GETTER(int, otelgpu_sim_refcount, g_sim.refcount)
LOCKED_GETTER(unsigned long long, otelgpu_sim_calls, g_sim.calls)

/* fail() for a caller holding the lock: releases it first. */
static int unlock_fail(const char *msg) {
    sim_unlock();
    return fail(msg);
}

/* Take the lock for a move of the virtual clock: 0 with the lock held, or -1 (lock
 * released, error set) when no scenario runs on a virtual clock. */
static int lock_virtual_clock(void) {
    sim_lock();
    if (!g_sim.configured || !g_sim.virtual_clock)
        return unlock_fail("the simulator is not running on a virtual clock");
    return 0;
}

SIM_EXPORT int otelgpu_sim_set_time_ns(long long t) {
    if (t < 0) return fail("time must be >= 0");
    if (lock_virtual_clock()) return -1;
    g_sim.virtual_ns = t;
    sim_events_notify();
    sim_unlock();
    return 0;
}

SIM_EXPORT int otelgpu_sim_advance_ns(long long dt) {
    if (dt < 0) return fail("advance must be >= 0");
    if (lock_virtual_clock()) return -1;
    g_sim.virtual_ns += dt;
    sim_events_notify();
    sim_unlock();
    return 0;
}

SIM_EXPORT int otelgpu_sim_inject(const char *line) {
    char buf[512], err[512];
    sim_event ev;
    if (!line || strlen(line) >= sizeof(buf) - 32) return fail("event line missing or too long");
    sim_lock();
    if (!g_sim.configured) return unlock_fail("no scenario is loaded");
    /* replace a literal "now" start time by the current scenario time */
    int gpu, kind, used = 0;
    char start[32];
    if (sscanf(line, "%d %d %31s %n", &gpu, &kind, start, &used) == 3 && !strcmp(start, "now"))
        snprintf(buf, sizeof(buf), "%d %d %lld %s", gpu, kind, sim_now_ns(), line + used);
    else
        snprintf(buf, sizeof(buf), "%s", line);
    if (sim_parse_event(buf, &ev, err, sizeof(err))) return unlock_fail(err);
    if (ev.gpu >= g_sim.gpu_count) return unlock_fail("no such GPU index");
    if (g_sim.nevents >= SIM_MAX_EVENTS) return unlock_fail("event table full");
    g_sim.events[g_sim.nevents++] = ev;
    if (sim_add_companions(&g_sim, g_sim.nevents - 1)) {
        g_sim.nevents--;
        sim_index_events();
        return unlock_fail("event table full");
    }
    sim_index_events();
    sim_events_notify();
    sim_unlock();
    return 0;
}

/* The feature bits (FEAT_*) by their scenario names, "name=bit,..." -- so the Python
 * side's FEATURES table is checked against this one, module to module, not copied. */
SIM_EXPORT const char *otelgpu_sim_features(void) {
    static char text[512];
    static const struct { const char *name; unsigned int bit; } table[] = {
        {"ecc", FEAT_ECC}, {"fan", FEAT_FAN}, {"power", FEAT_POWER}, {"energy", FEAT_ENERGY},
        {"temperature", FEAT_TEMPERATURE}, {"nvlink", FEAT_NVLINK},
        {"remapped_rows", FEAT_REMAPPED_ROWS}, {"pcie", FEAT_PCIE},
        {"processes", FEAT_PROCESSES}, {"utilization", FEAT_UTILIZATION},
        {"clock_reasons", FEAT_CLOCK_REASONS}, {"memory_v2", FEAT_MEMORY_V2},
        {"clocks", FEAT_CLOCKS}, {"pstate", FEAT_PSTATE}, {"events", FEAT_EVENTS},
        {"samples", FEAT_SAMPLES}, {"retired_pages", FEAT_RETIRED_PAGES}, {"gpm", FEAT_GPM},
    };
    sim_lock();
    if (!text[0]) {
        size_t off = 0;
        for (size_t i = 0; i < sizeof(table) / sizeof(table[0]) && off < sizeof(text); i++)
            off += (size_t)snprintf(text + off, sizeof(text) - off, "%s%s=%u", i ? "," : "",
                                    table[i].name, table[i].bit);
    }
    sim_unlock();
    return text;
}
