/*
 * Parser of the normalized scenario text.
 *
 * The Python side (otelgpu.sim.scenario) validates the human-written TOML and emits
 * this line-oriented form; this parser only has to be strict, not friendly. Format
 * (one item per line, '#' comments and blank lines ignored):
 *
 *   otelgpu-sim-config 1
 *   clock=virtual|wall          epoch_ns=<int>        init_error=<nvmlReturn_t>
 *   latency_us=<int>            driver_version=<str>  nvml_version=<str>
 *   cuda_version=<int>          gpu_count=<1..16>
 *   gpu.<i>.<key>=<value>       (keys: see GPU_KEYS below; patterns see sim_model.c)
 *   proc=<gpu> <pid> <mem_bytes> <start_ns> <end_ns> <sm_util> <graphics> <name...>
 *   event=<gpu> <kind> <start_ns> <dur_ns> <a> <b> <c> <d>
 *
 * Returns 0 on success, or -1 with a message naming the line in err.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

enum key_type { K_STR, K_UINT, K_ULL, K_INT, K_DOUBLE, K_PATTERN, K_CC };

typedef struct {
    const char *name;
    int type;
    size_t offset;
    size_t size; /* for strings */
} gpu_key;

#define F(name, type, field) {name, type, offsetof(sim_gpu_config, field), sizeof(((sim_gpu_config *)0)->field)}

static const gpu_key GPU_KEYS[] = {
    /* GPM activity (sim_gpm.c), index order of the GPM_* enum in sim.h */
    F("gpm_no_permission", K_INT, gpm_no_permission),
    F("gpm.sm_active", K_PATTERN, gpm[0]),
    F("gpm_ratio.sm_active", K_DOUBLE, gpm_ratio[0]),
    F("gpm.sm_occupancy", K_PATTERN, gpm[1]),
    F("gpm_ratio.sm_occupancy", K_DOUBLE, gpm_ratio[1]),
    F("gpm.tensor", K_PATTERN, gpm[2]),
    F("gpm_ratio.tensor", K_DOUBLE, gpm_ratio[2]),
    F("gpm.hmma", K_PATTERN, gpm[3]),
    F("gpm_ratio.hmma", K_DOUBLE, gpm_ratio[3]),
    F("gpm.imma", K_PATTERN, gpm[4]),
    F("gpm_ratio.imma", K_DOUBLE, gpm_ratio[4]),
    F("gpm.dfma", K_PATTERN, gpm[5]),
    F("gpm_ratio.dfma", K_DOUBLE, gpm_ratio[5]),
    F("gpm.dmma", K_PATTERN, gpm[6]),
    F("gpm_ratio.dmma", K_DOUBLE, gpm_ratio[6]),
    F("gpm.dram", K_PATTERN, gpm[7]),
    F("gpm_ratio.dram", K_DOUBLE, gpm_ratio[7]),
    F("gpm.fp16", K_PATTERN, gpm[8]),
    F("gpm_ratio.fp16", K_DOUBLE, gpm_ratio[8]),
    F("gpm.fp32", K_PATTERN, gpm[9]),
    F("gpm_ratio.fp32", K_DOUBLE, gpm_ratio[9]),
    F("gpm.fp64", K_PATTERN, gpm[10]),
    F("gpm_ratio.fp64", K_DOUBLE, gpm_ratio[10]),
    F("gpm.integer", K_PATTERN, gpm[11]),
    F("gpm_ratio.integer", K_DOUBLE, gpm_ratio[11]),
    F("name", K_STR, name),
    F("uuid", K_STR, uuid),
    F("serial", K_STR, serial),
    F("bus_id", K_STR, bus_id),
    F("pci_device_id", K_UINT, pci_device_id),
    F("pci_subsystem_id", K_UINT, pci_subsystem_id),
    F("memory_bytes", K_ULL, memory_bytes),
    F("reserved_bytes", K_ULL, reserved_bytes),
    F("bar1_bytes", K_ULL, bar1_bytes),
    F("arch", K_UINT, arch),
    F("cc", K_CC, cc_major),
    F("power_limit_mw", K_UINT, power_limit_mw),
    F("default_limit_mw", K_UINT, default_limit_mw),
    F("min_limit_mw", K_UINT, min_limit_mw),
    F("max_limit_mw", K_UINT, max_limit_mw),
    F("idle_power_w", K_DOUBLE, idle_power_w),
    F("max_power_w", K_DOUBLE, max_power_w),
    F("sm_clock_max", K_UINT, sm_clock_max),
    F("sm_clock_idle", K_UINT, sm_clock_idle),
    F("mem_clock", K_UINT, mem_clock),
    F("video_clock", K_UINT, video_clock),
    F("ecc", K_INT, ecc),
    F("fans", K_INT, fans),
    F("nvlink_links", K_INT, nvlink_links),
    F("pcie_gen", K_INT, pcie_gen),
    F("pcie_width", K_INT, pcie_width),
    F("pcie_gen_max", K_INT, pcie_gen_max),
    F("pcie_width_max", K_INT, pcie_width_max),
    F("ambient_c", K_DOUBLE, ambient_c),
    F("thermal_c_per_w", K_DOUBLE, thermal_c_per_w),
    F("thermal_tau_s", K_DOUBLE, thermal_tau_s),
    F("slowdown_c", K_DOUBLE, slowdown_c),
    F("shutdown_c", K_DOUBLE, shutdown_c),
    F("mem_temp_offset_c", K_DOUBLE, mem_temp_offset_c),
    F("thermal_clock_factor", K_DOUBLE, thermal_clock_factor),
    F("pcie_tx_bps", K_DOUBLE, pcie_tx_bps),
    F("pcie_rx_bps", K_DOUBLE, pcie_rx_bps),
    F("nvlink_tx_bps", K_DOUBLE, nvlink_tx_bps),
    F("nvlink_rx_bps", K_DOUBLE, nvlink_rx_bps),
    F("ecc_agg_corrected", K_ULL, ecc_agg_corrected),
    F("ecc_agg_uncorrected", K_ULL, ecc_agg_uncorrected),
    F("unsupported", K_UINT, unsupported),
    F("mig_capable", K_UINT, mig_capable),
    F("util", K_PATTERN, util),
    F("mem_util", K_PATTERN, mem_util),
    F("mem_used", K_PATTERN, mem_used),
    F("power", K_PATTERN, power),
};
#undef F

static int parse_ull(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_ll(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

/* Patterns: "none" | "constant v" | "square high low period low_s offset" |
 * "ramp from to start dur" | "bursts base peak period dur seed" | "steps n t0 v0 ..." */
int sim_parse_pattern(const char *text, sim_pattern *p) {
    char kind[16];
    int used = 0;
    memset(p, 0, sizeof(*p));
    if (sscanf(text, "%15s%n", kind, &used) != 1) return -1;
    const char *rest = text + used;
    int n = 0;
    if (!strcmp(kind, "none")) {
        p->kind = PAT_NONE;
        return 0;
    }
    if (!strcmp(kind, "constant")) {
        p->kind = PAT_CONSTANT;
        return sscanf(rest, "%lf %n", &p->a, &n) == 1 && rest[n] == 0 ? 0 : -1;
    }
    if (!strcmp(kind, "square")) {
        p->kind = PAT_SQUARE;
        if (sscanf(rest, "%lf %lf %lf %lf %lf %n", &p->a, &p->b, &p->c, &p->d, &p->e, &n) != 5 ||
            rest[n] != 0 || p->c <= 0)
            return -1;
        return 0;
    }
    if (!strcmp(kind, "ramp")) {
        p->kind = PAT_RAMP;
        if (sscanf(rest, "%lf %lf %lf %lf %n", &p->a, &p->b, &p->c, &p->d, &n) != 4 || rest[n] != 0 ||
            p->d < 0)
            return -1;
        return 0;
    }
    if (!strcmp(kind, "bursts")) {
        p->kind = PAT_BURSTS;
        unsigned long long seed;
        if (sscanf(rest, "%lf %lf %lf %lf %llu %n", &p->a, &p->b, &p->c, &p->d, &seed, &n) != 5 ||
            rest[n] != 0 || p->c <= 0 || p->d < 0 || p->d > p->c)
            return -1;
        p->seed = seed;
        return 0;
    }
    if (!strcmp(kind, "steps")) {
        p->kind = PAT_STEPS;
        int count;
        if (sscanf(rest, "%d %n", &count, &n) != 1 || count < 1 || count > SIM_MAX_STEPS) return -1;
        rest += n;
        for (int i = 0; i < count; i++) {
            if (sscanf(rest, "%lf %lf %n", &p->step_t[i], &p->step_v[i], &n) != 2) return -1;
            rest += n;
        }
        p->nsteps = count;
        return *rest == 0 ? 0 : -1;
    }
    return -1;
}

int sim_parse_event(const char *line, sim_event *ev, char *err, size_t errlen) {
    int n = 0;
    memset(ev, 0, sizeof(*ev));
    if (sscanf(line, "%d %d %lld %lld %lf %lf %lf %lf %n", &ev->gpu, &ev->kind, &ev->start_ns,
               &ev->dur_ns, &ev->a, &ev->b, &ev->c, &ev->d, &n) != 8 ||
        line[n] != 0) {
        snprintf(err, errlen, "malformed event '%s'", line);
        return -1;
    }
    if (ev->kind < EV_XID || ev->kind > EV_SLOW || ev->dur_ns < 0 || ev->gpu < -1 ||
        ev->gpu >= SIM_MAX_GPUS) {
        snprintf(err, errlen, "invalid event '%s'", line);
        return -1;
    }
    return 0;
}

static int parse_proc(const char *line, sim_proc *p) {
    int n = 0;
    memset(p, 0, sizeof(*p));
    if (sscanf(line, "%d %u %llu %lld %lld %lf %d %n", &p->gpu, &p->pid, &p->mem_bytes, &p->start_ns,
               &p->end_ns, &p->sm_util, &p->graphics, &n) != 7)
        return -1;
    if (p->gpu < 0 || p->gpu >= SIM_MAX_GPUS) return -1;
    snprintf(p->name, sizeof(p->name), "%s", line + n);
    return 0;
}

static int set_gpu_key(sim_gpu_config *g, const char *key, const char *value) {
    for (size_t i = 0; i < sizeof(GPU_KEYS) / sizeof(GPU_KEYS[0]); i++) {
        const gpu_key *k = &GPU_KEYS[i];
        if (strcmp(k->name, key)) continue;
        char *field = (char *)g + k->offset;
        unsigned long long u;
        long long s;
        switch (k->type) {
        case K_STR:
            if (strlen(value) >= k->size) return -1;
            memcpy(field, value, strlen(value) + 1);
            return 0;
        case K_UINT:
            if (parse_ull(value, &u) || u > 0xFFFFFFFFULL) return -1;
            *(unsigned int *)field = (unsigned int)u;
            return 0;
        case K_ULL:
            if (parse_ull(value, &u)) return -1;
            *(unsigned long long *)field = u;
            return 0;
        case K_INT:
            if (parse_ll(value, &s)) return -1;
            *(int *)field = (int)s;
            return 0;
        case K_DOUBLE:
            return parse_double(value, (double *)field);
        case K_PATTERN:
            return sim_parse_pattern(value, (sim_pattern *)field);
        case K_CC:
            return sscanf(value, "%u %u", &g->cc_major, &g->cc_minor) == 2 ? 0 : -1;
        default:
            return -1;
        }
    }
    return -1;
}

static int set_top_key(sim_state *st, const char *key, const char *value) {
    long long v;
    if (!strcmp(key, "clock")) {
        if (!strcmp(value, "virtual")) st->virtual_clock = 1;
        else if (!strcmp(value, "wall")) st->virtual_clock = 0;
        else return -1;
        return 0;
    }
    if (!strcmp(key, "driver_version")) {
        snprintf(st->driver_version, sizeof(st->driver_version), "%s", value);
        return 0;
    }
    if (!strcmp(key, "nvml_version")) {
        snprintf(st->nvml_version, sizeof(st->nvml_version), "%s", value);
        return 0;
    }
    if (parse_ll(value, &v)) return -1;
    if (!strcmp(key, "epoch_ns")) st->epoch_ns = v;
    else if (!strcmp(key, "init_error")) st->init_error = (unsigned int)v;
    else if (!strcmp(key, "latency_us")) st->latency_us = v;
    else if (!strcmp(key, "cuda_version")) st->cuda_version = (int)v;
    else if (!strcmp(key, "gpu_count")) {
        if (v < 0 || v > SIM_MAX_GPUS) return -1;
        st->gpu_count = (int)v;
    } else return -1;
    return 0;
}

int sim_parse_config(const char *text, sim_state *st, char *err, size_t errlen) {
    const char *p = text;
    int lineno = 0, header = 0;
    char line[4096];
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        if (len >= sizeof(line)) {
            snprintf(err, errlen, "line %d: too long", lineno);
            return -1;
        }
        memcpy(line, p, len);
        line[len] = 0;
        p = nl ? nl + 1 : p + len;
        while (len && (line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = 0;
        if (!len || line[0] == '#') continue;
        if (!header) {
            if (strcmp(line, "otelgpu-sim-config 1")) {
                snprintf(err, errlen, "line %d: expected header 'otelgpu-sim-config 1'", lineno);
                return -1;
            }
            header = 1;
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq) {
            snprintf(err, errlen, "line %d: expected key=value: '%s'", lineno, line);
            return -1;
        }
        *eq = 0;
        const char *key = line, *value = eq + 1;
        int rc;
        if (!strcmp(key, "proc")) {
            if (st->nprocs >= SIM_MAX_PROCS) {
                snprintf(err, errlen, "line %d: more than %d processes", lineno, SIM_MAX_PROCS);
                return -1;
            }
            rc = parse_proc(value, &st->procs[st->nprocs]);
            if (!rc) st->nprocs++;
        } else if (!strcmp(key, "event")) {
            if (st->nevents >= SIM_MAX_EVENTS) {
                snprintf(err, errlen, "line %d: more than %d events", lineno, SIM_MAX_EVENTS);
                return -1;
            }
            rc = sim_parse_event(value, &st->events[st->nevents], err, errlen);
            if (!rc) st->nevents++;
        } else if (!strncmp(key, "gpu.", 4)) {
            char *dot;
            long idx = strtol(key + 4, &dot, 10);
            if (dot == key + 4 || *dot != '.' || idx < 0 || idx >= SIM_MAX_GPUS) rc = -1;
            else rc = set_gpu_key(&st->gpu[idx], dot + 1, value);
        } else {
            rc = set_top_key(st, key, value);
        }
        if (rc) {
            snprintf(err, errlen, "line %d: invalid %s=%s", lineno, key, value);
            return -1;
        }
    }
    if (!header) {
        snprintf(err, errlen, "empty configuration");
        return -1;
    }
    int scripted = st->nevents;
    for (int i = 0; i < scripted; i++)
        if (sim_add_companions(st, i)) {
            snprintf(err, errlen, "more than %d events with the Xid 48 companions", SIM_MAX_EVENTS);
            return -1;
        }
    return 0;
}
