/*
 * The exported NVML API of the simulator: tiers A and B of nvml.md (section 3).
 *
 * Conventions every function follows:
 *   - UNINITIALIZED unless nvmlInit* succeeded more often than nvmlShutdown ran;
 *   - INVALID_ARGUMENT for a NULL output pointer or a handle that is not ours;
 *   - GPU_IS_LOST for every device call from the time the scenario drops the GPU;
 *   - NOT_SUPPORTED for features the scenario's device lacks (no ECC on GeForce...);
 *   - the scenario's per-call latency is slept after the lock is released, so a slow
 *     simulated driver never serialises the other callers.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "sim.h"

sim_state g_sim;
struct sim_device g_devices[SIM_MAX_GPUS];

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_sync(void) {
    pthread_mutex_init(&g_sim.lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_sim.cond, &ca);
    pthread_condattr_destroy(&ca);
}

/* fork(): hold the lock across it so the child never inherits it mid-update; the child
 * gets fresh synchronisation objects (no thread of the parent exists there). */
static void fork_prepare(void) { pthread_mutex_lock(&g_sim.lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g_sim.lock); }
static void fork_child(void) { init_sync(); }

static void sim_once(void) {
    init_sync();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    for (unsigned i = 0; i < SIM_MAX_GPUS; i++) {
        g_devices[i].index = i;
        g_devices[i].magic = SIM_DEVICE_MAGIC;
    }
}

void sim_lock(void) {
    pthread_once(&g_once, sim_once);
    pthread_mutex_lock(&g_sim.lock);
}

void sim_unlock(void) { pthread_mutex_unlock(&g_sim.lock); }

void sim_sleep_us(long long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ---- configuration ------------------------------------------------------- */

/* Replace the scenario (under the lock). Keeps the lock, the condition variable and
 * the init refcount (clients of the previous scenario still hold their inits); resets
 * clocks, counters and event sets. */
int sim_apply_config(const char *text, char *err, size_t errlen) {
    sim_state *tmp = calloc(1, sizeof(*tmp));
    if (!tmp) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (sim_parse_config(text, tmp, err, errlen)) {
        free(tmp);
        return -1;
    }
    if (!tmp->epoch_ns) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        tmp->epoch_ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    sim_lock();
    int refcount = g_sim.refcount;
    unsigned long long gen = g_sim.generation, calls = g_sim.calls;
    size_t off = offsetof(sim_state, configured);
    memcpy((char *)&g_sim + off, (char *)tmp + off, sizeof(sim_state) - off);
    /* Only nvmlInit/nvmlShutdown move the refcount, as in the real library -- except that a
     * scenario whose driver fails to initialise is a machine where no init can be held. */
    g_sim.refcount = g_sim.init_error ? 0 : refcount;
    g_sim.generation = gen + 1;
    g_sim.calls = calls;
    g_sim.configured = 1;
    g_sim.virtual_ns = 0;
    sim_index_events();
    sim_reset_integration();
    sim_events_reset();
    pthread_cond_broadcast(&g_sim.cond);
    sim_unlock();
    free(tmp);
    return 0;
}

static int g_env_warned;

/* Load the scenario named by OTELGPU_SIM_CONFIG (a normalized file); lock NOT held. */
static nvmlReturn_t load_from_env(void) {
    const char *path = getenv("OTELGPU_SIM_CONFIG");
    char err[512];
    if (!path || !*path) {
        if (!__atomic_exchange_n(&g_env_warned, 1, __ATOMIC_SEQ_CST))
            fprintf(stderr,
                    "otelgpu simulated NVML: no scenario loaded (set OTELGPU_SIM_CONFIG or use "
                    "`otelgpu sim run`); reporting NVML_ERROR_DRIVER_NOT_LOADED\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "otelgpu simulated NVML: cannot open OTELGPU_SIM_CONFIG=%s\n", path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)(size > 0 ? size : 0) + 1);
    if (!text) {
        fclose(f);
        return NVML_ERROR_MEMORY;
    }
    size_t got = fread(text, 1, (size_t)(size > 0 ? size : 0), f);
    text[got] = 0;
    fclose(f);
    int rc = sim_apply_config(text, err, sizeof(err));
    free(text);
    if (rc) {
        fprintf(stderr, "otelgpu simulated NVML: %s: %s\n", path, err);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* ---- lifecycle ----------------------------------------------------------- */

static nvmlReturn_t do_init(void) {
    sim_lock();
    int configured = g_sim.configured;
    sim_unlock();
    if (!configured) {
        nvmlReturn_t rc = load_from_env();
        if (rc) return rc;
    }
    sim_lock();
    nvmlReturn_t rc = g_sim.init_error;
    long long lat = g_sim.latency_us;
    if (!rc) g_sim.refcount++;
    sim_unlock();
    sim_sleep_us(lat);
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
SIM_EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
SIM_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

SIM_EXPORT nvmlReturn_t nvmlShutdown(void) {
    sim_lock();
    nvmlReturn_t rc = g_sim.refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_sim.refcount > 0) g_sim.refcount--;
    sim_unlock();
    return rc;
}

SIM_EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- call scaffolding ---------------------------------------------------- */

/* Lock, check initialisation; for device calls also the handle and lost state, and
 * bring the integrated counters up to now. Leaves the lock held. */
static nvmlReturn_t enter(long long *lat) {
    sim_lock();
    g_sim.calls++;
    *lat = 0;
    if (g_sim.refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    *lat = sim_latency_us(-1, sim_now_ns());
    return NVML_SUCCESS;
}

static int handle_index(nvmlDevice_t dev) {
    if (!dev) return -1;
    if (dev < g_devices || dev >= g_devices + SIM_MAX_GPUS) return -1;
    if (dev->magic != SIM_DEVICE_MAGIC || (int)dev->index >= g_sim.gpu_count) return -1;
    return (int)dev->index;
}

nvmlReturn_t sim_enter_device(nvmlDevice_t dev, int *gi, long long *now, long long *lat) {
    sim_lock();
    g_sim.calls++;
    *lat = 0;
    if (g_sim.refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    *gi = handle_index(dev);
    if (*gi < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *now = sim_now_ns();
    *lat = sim_latency_us(*gi, *now);
    if (sim_is_lost(*gi, *now)) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

static nvmlReturn_t enter_dev(nvmlDevice_t dev, int *gi, long long *now, long long *lat) {
    nvmlReturn_t rc = sim_enter_device(dev, gi, now, lat);
    if (rc == NVML_SUCCESS) sim_integrate(*gi, *now);
    return rc;
}

#define CALL()                                                                                    \
    long long lat_ = 0;                                                                           \
    do {                                                                                          \
        nvmlReturn_t e_ = enter(&lat_);                                                           \
        if (e_) {                                                                                 \
            sim_unlock();                                                                         \
            sim_sleep_us(lat_);                                                                   \
            return e_;                                                                            \
        }                                                                                         \
    } while (0)

#define CALL_DEV(dev)                                                                             \
    int gi = -1;                                                                                  \
    long long now = 0, lat_ = 0;                                                                  \
    do {                                                                                          \
        nvmlReturn_t e_ = enter_dev(dev, &gi, &now, &lat_);                                       \
        if (e_) {                                                                                 \
            sim_unlock();                                                                         \
            sim_sleep_us(lat_);                                                                   \
            return e_;                                                                            \
        }                                                                                         \
    } while (0);                                                                                  \
    const sim_gpu_config *G = &g_sim.gpu[gi];                                                     \
    (void)G;                                                                                      \
    (void)now

#define LEAVE(rc)                                                                                 \
    do {                                                                                          \
        nvmlReturn_t r_ = (rc);                                                                   \
        sim_unlock();                                                                             \
        sim_sleep_us(lat_);                                                                       \
        return r_;                                                                                \
    } while (0)

#define NEED(ptr)                                                                                 \
    do {                                                                                          \
        if (!(ptr)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);                                           \
    } while (0)

#define FEATURE(bit)                                                                              \
    do {                                                                                          \
        if (G->unsupported & (bit)) LEAVE(NVML_ERROR_NOT_SUPPORTED);                              \
    } while (0)

/* A versioned struct argument: present (else INVALID_ARGUMENT), its feature supported
 * (else NOT_SUPPORTED), then of struct version v (else ARGUMENT_VERSION_MISMATCH). */
#define NEED_STRUCT(ptr, feature, type, v)                                                        \
    do {                                                                                          \
        NEED(ptr);                                                                                \
        FEATURE(feature);                                                                         \
        if ((ptr)->version != NVML_STRUCT_VERSION(type, v))                                       \
            LEAVE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);                                          \
    } while (0)

static nvmlReturn_t copy_str(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(s);
    if (n + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

static unsigned int round_u(double v) { return v <= 0 ? 0u : (unsigned int)floor(v + 0.5); }

/* ---- system --------------------------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    CALL();
    LEAVE(copy_str(buf, len, g_sim.driver_version));
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned int len) {
    CALL();
    LEAVE(copy_str(buf, len, g_sim.nvml_version));
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    CALL();
    NEED(v);
    *v = g_sim.cuda_version;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return nvmlSystemGetCudaDriverVersion(v);
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *buf, unsigned int len) {
    CALL();
    NEED(buf);
    for (int i = 0; i < g_sim.nprocs; i++)
        if (g_sim.procs[i].pid == pid) {
            /* NVML truncates process names rather than failing */
            if (!len) LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
            snprintf(buf, len, "%s", g_sim.procs[i].name);
            LEAVE(NVML_SUCCESS);
        }
    LEAVE(NVML_ERROR_NOT_FOUND);
}

/* ---- enumeration ---------------------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    CALL();
    NEED(count);
    *count = (unsigned int)g_sim.gpu_count;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev) {
    CALL();
    NEED(dev);
    if (index >= (unsigned int)g_sim.gpu_count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    lat_ = sim_latency_us((int)index, sim_now_ns());
    if (sim_is_lost((int)index, sim_now_ns())) LEAVE(NVML_ERROR_GPU_IS_LOST);
    *dev = &g_devices[index];
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *dev) {
    return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev) {
    CALL();
    NEED(uuid);
    NEED(dev);
    for (int i = 0; i < g_sim.gpu_count; i++)
        if (!strcmp(g_sim.gpu[i].uuid, uuid)) {
            if (sim_is_lost(i, sim_now_ns())) LEAVE(NVML_ERROR_GPU_IS_LOST);
            *dev = &g_devices[i];
            LEAVE(NVML_SUCCESS);
        }
    LEAVE(NVML_ERROR_NOT_FOUND);
}

/* Parse "[domain:]bus:device[.function]" (hex) into a comparable tuple. */
static int parse_bus_id(const char *s, unsigned int *dom, unsigned int *bus, unsigned int *devn) {
    unsigned int a, b, c, fn;
    if (sscanf(s, "%x:%x:%x.%x", &a, &b, &c, &fn) >= 3) {
        *dom = a, *bus = b, *devn = c;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x", &b, &c, &fn) >= 2) {
        *dom = 0, *bus = b, *devn = c;
        return 0;
    }
    return -1;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *dev) {
    CALL();
    NEED(bus_id);
    NEED(dev);
    unsigned int d, b, n;
    if (parse_bus_id(bus_id, &d, &b, &n)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_sim.gpu_count; i++) {
        unsigned int d2, b2, n2;
        if (!parse_bus_id(g_sim.gpu[i].bus_id, &d2, &b2, &n2) && d == d2 && b == b2 && n == n2) {
            if (sim_is_lost(i, sim_now_ns())) LEAVE(NVML_ERROR_GPU_IS_LOST);
            *dev = &g_devices[i];
            LEAVE(NVML_SUCCESS);
        }
    }
    LEAVE(NVML_ERROR_NOT_FOUND);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *dev) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, dev);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    CALL_DEV(dev);
    NEED(index);
    *index = (unsigned int)gi;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    return nvmlDeviceGetIndex(dev, minor);
}

/* ---- identity ------------------------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *buf, unsigned int len) {
    CALL_DEV(dev);
    LEAVE(copy_str(buf, len, G->name));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *buf, unsigned int len) {
    CALL_DEV(dev);
    LEAVE(copy_str(buf, len, G->uuid));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char *buf, unsigned int len) {
    CALL_DEV(dev);
    LEAVE(copy_str(buf, len, G->serial));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t dev, char *buf, unsigned int len) {
    CALL_DEV(dev);
    LEAVE(copy_str(buf, len, "900-SIM-0000-000"));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char *buf, unsigned int len) {
    CALL_DEV(dev);
    LEAVE(copy_str(buf, len, "96.00.00.00.00"));
}

static void fill_pci(const sim_gpu_config *g, nvmlPciInfo_t *p) {
    unsigned int d = 0, b = 0, n = 0;
    parse_bus_id(g->bus_id, &d, &b, &n);
    memset(p, 0, sizeof(*p));
    snprintf(p->busId, sizeof(p->busId), "%08X:%02X:%02X.0", d, b, n);
    snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "%04X:%02X:%02X.0", d & 0xFFFFu, b & 0xFFu,
             n & 0xFFu);
    p->domain = d;
    p->bus = b;
    p->device = n;
    p->pciDeviceId = g->pci_device_id;
    p->pciSubSystemId = g->pci_subsystem_id;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    CALL_DEV(dev);
    NEED(pci);
    fill_pci(G, pci);
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_v1_t *pci) {
    CALL_DEV(dev);
    NEED(pci);
    nvmlPciInfo_t full;
    fill_pci(G, &full);
    memset(pci, 0, sizeof(*pci));
    memcpy(pci->busId, full.busIdLegacy, sizeof(pci->busId));
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int *arch) {
    CALL_DEV(dev);
    NEED(arch);
    *arch = G->arch;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor) {
    CALL_DEV(dev);
    NEED(major);
    NEED(minor);
    *major = (int)G->cc_major;
    *minor = (int)G->cc_minor;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t dev, unsigned int *brand) {
    CALL_DEV(dev);
    NEED(brand);
    /* NVML_BRAND_GEFORCE = 5, NVML_BRAND_NVIDIA = 14 (data-center parts on recent drivers) */
    *brand = strstr(G->name, "GeForce") ? 5u : 14u;
    LEAVE(NVML_SUCCESS);
}

/* ---- memory and utilization ----------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    CALL_DEV(dev);
    NEED(m);
    unsigned long long used = sim_mem_used(gi, now);
    m->total = G->memory_bytes;
    m->used = used + G->reserved_bytes; /* v1 'used' includes the reserved memory */
    m->free = G->memory_bytes - m->used;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    CALL_DEV(dev);
    NEED_STRUCT(m, FEAT_MEMORY_V2, nvmlMemory_v2_t, 2U);
    m->total = G->memory_bytes;
    m->reserved = G->reserved_bytes;
    m->used = sim_mem_used(gi, now);
    m->free = G->memory_bytes - G->reserved_bytes - m->used;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t dev, nvmlBAR1Memory_t *m) {
    CALL_DEV(dev);
    NEED(m);
    m->bar1Total = G->bar1_bytes;
    m->bar1Used = G->bar1_bytes ? 2ULL << 20 : 0;
    m->bar1Free = m->bar1Total - m->bar1Used;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    CALL_DEV(dev);
    NEED(u);
    FEATURE(FEAT_UTILIZATION);
    u->gpu = round_u(sim_util_gpu(gi, now));
    u->memory = round_u(sim_util_mem(gi, now));
    LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t codec_util(nvmlDevice_t dev, unsigned int *util, unsigned int *period) {
    CALL_DEV(dev);
    NEED(util);
    NEED(period);
    *util = 0;
    *period = 167000;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) {
    return codec_util(d, u, p);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) {
    return codec_util(d, u, p);
}

/* ---- temperature, fans, power, energy ------------------------------------- */

static double gpu_temp(int gi) { return g_sim.integ[gi].temp_c; }

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, unsigned int sensor, unsigned int *t) {
    CALL_DEV(dev);
    NEED(t);
    FEATURE(FEAT_TEMPERATURE);
    if (sensor != 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *t = round_u(gpu_temp(gi));
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_t *t) {
    CALL_DEV(dev);
    NEED_STRUCT(t, FEAT_TEMPERATURE, nvmlTemperature_t, 1U);
    if (t->sensorType != 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    t->temperature = (int)round_u(gpu_temp(gi));
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, unsigned int type,
                                                           unsigned int *t) {
    CALL_DEV(dev);
    NEED(t);
    FEATURE(FEAT_TEMPERATURE);
    switch (type) {
    case 0: *t = round_u(G->shutdown_c); break;       /* SHUTDOWN */
    case 1: *t = round_u(G->slowdown_c); break;       /* SLOWDOWN */
    case 2: *t = round_u(G->shutdown_c - 5.0); break; /* MEM_MAX */
    case 3: *t = round_u(G->slowdown_c - 3.0); break; /* GPU_MAX */
    default: LEAVE(NVML_ERROR_NOT_SUPPORTED);
    }
    LEAVE(NVML_SUCCESS);
}

static unsigned int fan_percent(int gi) {
    double f = 30.0 + (gpu_temp(gi) - 30.0) * 1.4;
    return round_u(f < 30 ? 30 : (f > 100 ? 100 : f));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t dev, unsigned int *n) {
    CALL_DEV(dev);
    NEED(n);
    if (G->fans <= 0 || (G->unsupported & FEAT_FAN)) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *n = (unsigned int)G->fans;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t dev, unsigned int fan, unsigned int *s) {
    CALL_DEV(dev);
    NEED(s);
    if (G->fans <= 0 || (G->unsupported & FEAT_FAN)) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (fan >= (unsigned int)G->fans) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *s = fan_percent(gi);
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t dev, unsigned int *s) {
    return nvmlDeviceGetFanSpeed_v2(dev, 0, s);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t dev, unsigned int *p) {
    CALL_DEV(dev);
    NEED(p);
    FEATURE(FEAT_PSTATE);
    *p = sim_util_gpu(gi, now) > 0 ? 0u : 8u;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t dev, unsigned int *p) {
    return nvmlDeviceGetPerformanceState(dev, p);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) {
    CALL_DEV(dev);
    NEED(mw);
    FEATURE(FEAT_POWER);
    *mw = round_u(sim_power_w(gi, now) * 1000.0);
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *mj) {
    CALL_DEV(dev);
    NEED(mj);
    FEATURE(FEAT_ENERGY);
    if (G->arch < 5) LEAVE(NVML_ERROR_NOT_SUPPORTED); /* Volta+ only */
    *mj = (unsigned long long)floor(g_sim.integ[gi].energy_mj);
    LEAVE(NVML_SUCCESS);
}

#define POWER_GETTER(fn, field)                                                                   \
    SIM_EXPORT nvmlReturn_t fn(nvmlDevice_t dev, unsigned int *mw) {                              \
        CALL_DEV(dev);                                                                            \
        NEED(mw);                                                                                 \
        FEATURE(FEAT_POWER);                                                                      \
        *mw = G->field;                                                                           \
        LEAVE(NVML_SUCCESS);                                                                      \
    }

POWER_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit_mw)
POWER_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_limit_mw)
POWER_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, default_limit_mw)

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t dev, unsigned int *lo,
                                                                     unsigned int *hi) {
    CALL_DEV(dev);
    NEED(lo);
    NEED(hi);
    FEATURE(FEAT_POWER);
    *lo = G->min_limit_mw;
    *hi = G->max_limit_mw;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t dev, unsigned int *mode) {
    CALL_DEV(dev);
    NEED(mode);
    FEATURE(FEAT_POWER);
    *mode = 1;
    LEAVE(NVML_SUCCESS);
}

/* ---- clocks and clock-event reasons --------------------------------------- */

static nvmlReturn_t clock_value(int gi, long long now, unsigned int type, int max, unsigned int *mhz) {
    const sim_gpu_config *g = &g_sim.gpu[gi];
    switch (type) {
    case 0: /* GRAPHICS */
    case 1: /* SM */
        *mhz = max ? g->sm_clock_max : sim_sm_clock(gi, now);
        return NVML_SUCCESS;
    case 2: *mhz = g->mem_clock; return NVML_SUCCESS;
    case 3: *mhz = g->video_clock; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, unsigned int type, unsigned int *mhz) {
    CALL_DEV(dev);
    NEED(mhz);
    FEATURE(FEAT_CLOCKS);
    LEAVE(clock_value(gi, now, type, 0, mhz));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, unsigned int type, unsigned int *mhz) {
    CALL_DEV(dev);
    NEED(mhz);
    FEATURE(FEAT_CLOCKS);
    LEAVE(clock_value(gi, now, type, 1, mhz));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t dev, unsigned int type, unsigned int id,
                                           unsigned int *mhz) {
    CALL_DEV(dev);
    NEED(mhz);
    FEATURE(FEAT_CLOCKS);
    if (id > 3) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    LEAVE(clock_value(gi, now, type, id != 0, mhz));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t dev, unsigned int type,
                                                       unsigned int *mhz) {
    return nvmlDeviceGetMaxClockInfo(dev, type, mhz);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t dev, unsigned int type,
                                                              unsigned int *mhz) {
    return nvmlDeviceGetMaxClockInfo(dev, type, mhz);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t dev, unsigned int type,
                                                           unsigned int *mhz) {
    return nvmlDeviceGetMaxClockInfo(dev, type, mhz);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) {
    CALL_DEV(dev);
    NEED(r);
    FEATURE(FEAT_CLOCK_REASONS);
    *r = sim_reasons(gi, now);
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *r) {
    return nvmlDeviceGetCurrentClocksEventReasons(dev, r);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) {
    CALL_DEV(dev);
    NEED(r);
    FEATURE(FEAT_CLOCK_REASONS);
    *r = REASON_SUPPORTED;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t dev,
                                                                    unsigned long long *r) {
    return nvmlDeviceGetSupportedClocksEventReasons(dev, r);
}

static unsigned long long throttle_ns(int gi, int bit) {
    return (unsigned long long)llround(g_sim.integ[gi].throttle_ns[bit]);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t dev, unsigned int policy,
                                                     nvmlViolationTime_t *v) {
    CALL_DEV(dev);
    NEED(v);
    FEATURE(FEAT_CLOCK_REASONS);
    /* PERF_POLICY_POWER=0, THERMAL=1, SYNC_BOOST=2, BOARD_LIMIT=3, LOW_UTILIZATION=4,
     * RELIABILITY=5, TOTAL_APP_CLOCKS=10, TOTAL_BASE_CLOCKS=11 */
    static const int bit_of[] = {2, 5, 4, -1, 0, -1};
    if (policy > 5 && policy != 10 && policy != 11) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    v->referenceTime = (unsigned long long)sim_epoch_us(now);
    v->violationTime = (policy <= 5 && bit_of[policy] >= 0) ? throttle_ns(gi, bit_of[policy]) : 0;
    LEAVE(NVML_SUCCESS);
}

/* ---- field values ---------------------------------------------------------- */

static nvmlReturn_t field_value(int gi, long long now, nvmlFieldValue_t *f) {
    const sim_gpu_config *g = &g_sim.gpu[gi];
    const sim_integ *s = &g_sim.integ[gi];
    unsigned long long corr, unc;
    unsigned int rows[4];
    f->valueType = VT_ULL;
    switch (f->fieldId) {
    case 1: /* ECC_CURRENT */
    case 2: /* ECC_PENDING */
        if (!g->ecc || (g->unsupported & FEAT_ECC)) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT;
        f->value.uiVal = 1;
        return NVML_SUCCESS;
    case 3: case 4: case 5: case 6: /* ECC SBE/DBE volatile/aggregate totals */
        if (!g->ecc || (g->unsupported & FEAT_ECC)) return NVML_ERROR_NOT_SUPPORTED;
        sim_ecc_counts(gi, now, &corr, &unc);
        if (f->fieldId == 3) f->value.ullVal = corr;
        else if (f->fieldId == 4) f->value.ullVal = unc;
        else if (f->fieldId == 5) f->value.ullVal = g->ecc_agg_corrected + corr;
        else f->value.ullVal = g->ecc_agg_uncorrected + unc;
        return NVML_SUCCESS;
    case 29: case 30: case 31: /* retired pages: replaced by row remapping on Ampere+ */
        if (g->arch >= 7 || !g->ecc) return NVML_ERROR_NOT_SUPPORTED;
        f->value.ullVal = 0;
        return NVML_SUCCESS;
    case 74: f->value.ullVal = throttle_ns(gi, 2); break;  /* SW power cap */
    case 76: f->value.ullVal = throttle_ns(gi, 4); break;  /* sync boost */
    case 77: f->value.ullVal = 0; break;                   /* board limit */
    case 78: f->value.ullVal = throttle_ns(gi, 0); break;  /* low utilization */
    case 79: f->value.ullVal = 0; break;                   /* reliability */
    case 269: f->value.ullVal = throttle_ns(gi, 5); break; /* SW thermal */
    case 270: f->value.ullVal = throttle_ns(gi, 6); break; /* HW thermal */
    case 271: f->value.ullVal = throttle_ns(gi, 7); break; /* HW power brake */
    case 82: /* MEMORY_TEMP */
        if (g->unsupported & FEAT_TEMPERATURE) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT;
        f->value.uiVal = round_u(s->temp_c + g->mem_temp_offset_c);
        return NVML_SUCCESS;
    case 83: case 191: /* TOTAL_ENERGY_CONSUMPTION, ENERGY (mJ) */
        if ((g->unsupported & FEAT_ENERGY) || g->arch < 5) return NVML_ERROR_NOT_SUPPORTED;
        f->value.ullVal = (unsigned long long)floor(s->energy_mj);
        return NVML_SUCCESS;
    case 91: /* NVLINK_LINK_COUNT */
        f->valueType = VT_UINT;
        f->value.uiVal = (g->unsupported & FEAT_NVLINK) ? 0u : (unsigned int)g->nvlink_links;
        return NVML_SUCCESS;
    case 94: case 95: /* PCIe replay / rollover */
        if (g->unsupported & FEAT_PCIE) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT;
        f->value.uiVal = 0;
        return NVML_SUCCESS;
    case 138: case 139: case 140: case 141: { /* NVLink throughput, KiB cumulative */
        if (g->nvlink_links <= 0 || (g->unsupported & FEAT_NVLINK)) return NVML_ERROR_NOT_SUPPORTED;
        double bytes = (f->fieldId % 2 == 0) ? s->nvlink_tx_bytes : s->nvlink_rx_bytes;
        if (f->fieldId >= 140) bytes *= 1.0625; /* raw counters include protocol overhead */
        if (f->scopeId != 0xFFFFFFFFu) {
            if (f->scopeId >= (unsigned int)g->nvlink_links) return NVML_ERROR_INVALID_ARGUMENT;
            bytes /= g->nvlink_links;
        }
        f->value.ullVal = (unsigned long long)floor(bytes / 1024.0);
        return NVML_SUCCESS;
    }
    case 142: case 143: case 144: case 145: /* remapped rows */
        if (g->arch < 7 || !g->ecc || (g->unsupported & (FEAT_REMAPPED_ROWS | FEAT_ECC)))
            return NVML_ERROR_NOT_SUPPORTED;
        sim_remap_counts(gi, now, rows);
        f->valueType = VT_UINT;
        f->value.uiVal = rows[f->fieldId - 142];
        return NVML_SUCCESS;
    case 185: case 186: /* POWER_AVERAGE / POWER_INSTANT, mW */
        if (g->unsupported & FEAT_POWER) return NVML_ERROR_NOT_SUPPORTED;
        if (f->scopeId != 0 && f->scopeId != 1) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT;
        f->value.uiVal = round_u(sim_power_w(gi, now) * 1000.0);
        return NVML_SUCCESS;
    case 197: case 198: /* PCIe bytes (cumulative) */
        if (g->unsupported & FEAT_PCIE) return NVML_ERROR_NOT_SUPPORTED;
        f->value.ullVal = (unsigned long long)floor(f->fieldId == 197 ? s->pcie_tx_bytes : s->pcie_rx_bytes);
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
    /* throttle counters fall through here */
    if (g->unsupported & FEAT_CLOCK_REASONS) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    CALL_DEV(dev);
    NEED(values);
    if (count < 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    long long ts = sim_epoch_us(now);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = ts;
        f->latencyUsec = 0;
        memset(&f->value, 0, sizeof(f->value));
        f->nvmlReturn = field_value(gi, now, f);
    }
    LEAVE(NVML_SUCCESS);
}

/* ---- processes ------------------------------------------------------------- */

static unsigned int procs_on(int gi, long long now, int graphics, const sim_proc **out, unsigned int cap) {
    unsigned int n = 0;
    for (int i = 0; i < g_sim.nprocs; i++) {
        const sim_proc *p = &g_sim.procs[i];
        if (p->gpu != gi || p->graphics != graphics || !sim_proc_alive(p, now)) continue;
        if (out && n < cap) out[n] = p;
        n++;
    }
    return n;
}

/* Two-call convention of nvml.md section 5: a size query (count 0) with no processes is
 * SUCCESS; a short buffer is INSUFFICIENT_SIZE with *count set. stride selects v1 (16
 * bytes) or v2/v3 (24 bytes) entries. */
static nvmlReturn_t running_procs(nvmlDevice_t dev, unsigned int *count, void *infos, size_t stride,
                                  int graphics) {
    CALL_DEV(dev);
    NEED(count);
    FEATURE(FEAT_PROCESSES);
    const sim_proc *list[SIM_MAX_PROCS];
    unsigned int n = procs_on(gi, now, graphics, list, SIM_MAX_PROCS);
    if (*count < n) {
        *count = n;
        LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *count = n;
    if (n && !infos) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < n; i++) {
        char *slot = (char *)infos + i * stride;
        if (stride == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)slot;
            p->pid = list[i]->pid;
            p->usedGpuMemory = list[i]->mem_bytes;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)slot;
            p->pid = list[i]->pid;
            p->usedGpuMemory = list[i]->mem_bytes;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    LEAVE(NVML_SUCCESS);
}

/* The exported process lists: each a running_procs() of its entry size and kind
 * (0 compute, 1 graphics, 2 MPS: no MPS clients are simulated). */
#define RUNNING_PROCS(fn, info_t, graphics)                                                       \
    SIM_EXPORT nvmlReturn_t fn(nvmlDevice_t d, unsigned int *c, info_t *i) {                      \
        return running_procs(d, c, i, sizeof(info_t), graphics);                                  \
    }

RUNNING_PROCS(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, 0)
RUNNING_PROCS(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t, 0)
RUNNING_PROCS(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 0)
RUNNING_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, 1)
RUNNING_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t, 1)
RUNNING_PROCS(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 1)
RUNNING_PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, 2)

static double proc_sm_util(int gi, long long now, const sim_proc *p) {
    return p->sm_util >= 0 ? p->sm_util : sim_util_gpu(gi, now);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
                                                        unsigned int *count, unsigned long long last_seen) {
    CALL_DEV(dev);
    NEED(count);
    FEATURE(FEAT_PROCESSES);
    const sim_proc *list[SIM_MAX_PROCS];
    unsigned int n = procs_on(gi, now, 0, list, SIM_MAX_PROCS);
    unsigned long long ts = (unsigned long long)sim_epoch_us(now);
    if (!n || (last_seen && last_seen >= ts)) LEAVE(NVML_ERROR_NOT_FOUND);
    if (!s || *count < n) {
        *count = n;
        LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        s[i].pid = list[i]->pid;
        s[i].timeStamp = ts;
        s[i].smUtil = round_u(proc_sm_util(gi, now, list[i]));
        s[i].memUtil = round_u(sim_util_mem(gi, now));
        s[i].encUtil = 0;
        s[i].decUtil = 0;
    }
    *count = n;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t dev,
                                                              nvmlProcessesUtilizationInfo_t *info) {
    CALL_DEV(dev);
    NEED_STRUCT(info, FEAT_PROCESSES, nvmlProcessesUtilizationInfo_t, 1U);
    const sim_proc *list[SIM_MAX_PROCS];
    unsigned int n = procs_on(gi, now, 0, list, SIM_MAX_PROCS);
    unsigned long long ts = (unsigned long long)sim_epoch_us(now);
    if (!n || (info->lastSeenTimeStamp && info->lastSeenTimeStamp >= ts)) LEAVE(NVML_ERROR_NOT_FOUND);
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t *u = &info->procUtilArray[i];
        memset(u, 0, sizeof(*u));
        u->timeStamp = ts;
        u->pid = list[i]->pid;
        u->smUtil = round_u(proc_sm_util(gi, now, list[i]));
        u->memUtil = round_u(sim_util_mem(gi, now));
    }
    info->processSamplesCount = n;
    LEAVE(NVML_SUCCESS);
}

/* ---- samples ---------------------------------------------------------------- */

#define SAMPLE_PERIOD_NS 100000000LL /* the simulated driver samples every 100 ms */
#define SAMPLE_BUFFER 120            /* and keeps the last 12 s */

static int sample_value(int gi, unsigned int type, long long t, unsigned int *v) {
    switch (type) {
    case 0: *v = round_u(sim_power_w(gi, t) * 1000.0); return 0;    /* TOTAL_POWER mW */
    case 1: *v = round_u(sim_util_gpu(gi, t)); return 0;            /* GPU_UTILIZATION */
    case 2: *v = round_u(sim_util_mem(gi, t)); return 0;            /* MEMORY_UTILIZATION */
    case 3: case 4: *v = 0; return 0;                               /* ENC / DEC */
    case 5: *v = sim_sm_clock(gi, t); return 0;                     /* PROCESSOR_CLK */
    case 6: *v = g_sim.gpu[gi].mem_clock; return 0;                 /* MEMORY_CLK */
    default: return -1;
    }
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t dev, unsigned int type, unsigned long long last_seen,
                                             unsigned int *val_type, unsigned int *count, nvmlSample_t *samples) {
    CALL_DEV(dev);
    NEED(val_type);
    NEED(count);
    FEATURE(FEAT_SAMPLES);
    unsigned int probe;
    if (sample_value(gi, type, 0, &probe)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *val_type = VT_UINT;
    if (!samples) { /* size query: SUCCESS with the buffer size */
        *count = SAMPLE_BUFFER;
        LEAVE(NVML_SUCCESS);
    }
    long long last_t = (now / SAMPLE_PERIOD_NS) * SAMPLE_PERIOD_NS;
    long long first_t = last_t - (SAMPLE_BUFFER - 1) * SAMPLE_PERIOD_NS;
    if (first_t < 0) first_t = 0;
    unsigned int n = 0;
    for (long long t = first_t; t <= last_t && n < *count; t += SAMPLE_PERIOD_NS) {
        unsigned long long ts = (unsigned long long)sim_epoch_us(t);
        if (ts <= last_seen) continue;
        samples[n].timeStamp = ts;
        samples[n].sampleValue.ullVal = 0;
        sample_value(gi, type, t, &samples[n].sampleValue.uiVal);
        n++;
    }
    *count = n;
    LEAVE(n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND);
}

/* ---- ECC, retired pages, remapped rows ------------------------------------ */

#define ECC_FEATURE()                                                                             \
    do {                                                                                          \
        if (!G->ecc || (G->unsupported & FEAT_ECC)) LEAVE(NVML_ERROR_NOT_SUPPORTED);              \
    } while (0)

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, unsigned int *cur, unsigned int *pending) {
    CALL_DEV(dev);
    NEED(cur);
    NEED(pending);
    ECC_FEATURE();
    *cur = *pending = 1;
    LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t ecc_total(int gi, long long now, unsigned int err_type, unsigned int ctr_type,
                              unsigned long long *out) {
    const sim_gpu_config *g = &g_sim.gpu[gi];
    unsigned long long corr, unc;
    if (err_type > 1 || ctr_type > 1) return NVML_ERROR_INVALID_ARGUMENT;
    sim_ecc_counts(gi, now, &corr, &unc);
    unsigned long long v = err_type == 0 ? corr : unc;
    if (ctr_type == 1) v += err_type == 0 ? g->ecc_agg_corrected : g->ecc_agg_uncorrected;
    *out = v;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, unsigned int err_type, unsigned int ctr_type,
                                                    unsigned long long *count) {
    CALL_DEV(dev);
    NEED(count);
    ECC_FEATURE();
    LEAVE(ecc_total(gi, now, err_type, ctr_type, count));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t dev, unsigned int err_type,
                                                        unsigned int ctr_type, unsigned int loc,
                                                        unsigned long long *count) {
    CALL_DEV(dev);
    NEED(count);
    ECC_FEATURE();
    if (loc > 7) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long v = 0;
    nvmlReturn_t rc = ecc_total(gi, now, err_type, ctr_type, &v);
    *count = loc == 2 ? v : 0; /* every simulated error is in device memory (DRAM) */
    LEAVE(rc);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, unsigned int cause, unsigned int *count,
                                                  unsigned long long *addrs) {
    CALL_DEV(dev);
    NEED(count);
    (void)addrs;
    ECC_FEATURE();
    if (G->arch >= 7 || (G->unsupported & FEAT_RETIRED_PAGES)) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (cause > 1) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t dev, unsigned int cause, unsigned int *count,
                                                     unsigned long long *addrs, unsigned long long *ts) {
    (void)ts;
    return nvmlDeviceGetRetiredPages(dev, cause, count, addrs);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, unsigned int *pending) {
    CALL_DEV(dev);
    NEED(pending);
    ECC_FEATURE();
    if (G->arch >= 7 || (G->unsupported & FEAT_RETIRED_PAGES)) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *pending = 0;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc,
                                                  unsigned int *pending, unsigned int *failure) {
    CALL_DEV(dev);
    NEED(corr);
    NEED(unc);
    NEED(pending);
    NEED(failure);
    ECC_FEATURE();
    if (G->arch < 7 || (G->unsupported & FEAT_REMAPPED_ROWS)) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    unsigned int rows[4];
    sim_remap_counts(gi, now, rows);
    *corr = rows[0];
    *unc = rows[1];
    *pending = rows[2];
    *failure = rows[3];
    LEAVE(NVML_SUCCESS);
}

/* ---- PCIe and NVLink -------------------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, unsigned int counter, unsigned int *kbs) {
    CALL_DEV(dev);
    NEED(kbs);
    FEATURE(FEAT_PCIE);
    if (counter > 1) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    double rate = (counter == 0 ? G->pcie_tx_bps : G->pcie_rx_bps) * sim_util_gpu(gi, now) / 100.0;
    *kbs = round_u(rate / 1000.0);
    LEAVE(NVML_SUCCESS);
}

#define PCIE_GETTER(fn, field)                                                                    \
    SIM_EXPORT nvmlReturn_t fn(nvmlDevice_t dev, unsigned int *v) {                               \
        CALL_DEV(dev);                                                                            \
        NEED(v);                                                                                  \
        FEATURE(FEAT_PCIE);                                                                       \
        *v = (unsigned int)(field);                                                               \
        LEAVE(NVML_SUCCESS);                                                                      \
    }

PCIE_GETTER(nvmlDeviceGetPcieReplayCounter, 0)
PCIE_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, G->pcie_gen)
PCIE_GETTER(nvmlDeviceGetCurrPcieLinkWidth, G->pcie_width)
PCIE_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, G->pcie_gen_max)
PCIE_GETTER(nvmlDeviceGetMaxPcieLinkWidth, G->pcie_width_max)
PCIE_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, G->pcie_gen_max)

#define NVLINK_FEATURE(link)                                                                      \
    do {                                                                                          \
        if (G->nvlink_links <= 0 || (G->unsupported & FEAT_NVLINK)) LEAVE(NVML_ERROR_NOT_SUPPORTED); \
        if ((link) >= (unsigned int)G->nvlink_links) LEAVE(NVML_ERROR_INVALID_ARGUMENT);           \
    } while (0)

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *active) {
    CALL_DEV(dev);
    NEED(active);
    NVLINK_FEATURE(link);
    *active = 1;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, unsigned int counter,
                                                        unsigned long long *v) {
    CALL_DEV(dev);
    NEED(v);
    NVLINK_FEATURE(link);
    if (counter > 4) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *v = 0;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t dev, unsigned int link, unsigned int *version) {
    CALL_DEV(dev);
    NEED(version);
    NVLINK_FEATURE(link);
    *version = G->arch >= 9 ? 4u : 3u;
    LEAVE(NVML_SUCCESS);
}

/* ---- modes, MIG ----------------------------------------------------------- */

#define MODE_GETTER(fn, value)                                                                    \
    SIM_EXPORT nvmlReturn_t fn(nvmlDevice_t dev, unsigned int *v) {                               \
        CALL_DEV(dev);                                                                            \
        NEED(v);                                                                                  \
        *v = (value);                                                                             \
        LEAVE(NVML_SUCCESS);                                                                      \
    }

MODE_GETTER(nvmlDeviceGetComputeMode, 0u)     /* NVML_COMPUTEMODE_DEFAULT */
MODE_GETTER(nvmlDeviceGetPersistenceMode, 1u) /* enabled, as on managed nodes */
MODE_GETTER(nvmlDeviceGetDisplayActive, 0u)
MODE_GETTER(nvmlDeviceGetDisplayMode, 0u)
MODE_GETTER(nvmlDeviceIsMigDeviceHandle, 0u)

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *cur, unsigned int *pending) {
    CALL_DEV(dev);
    NEED(cur);
    NEED(pending);
    if (!G->mig_capable) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *cur = *pending = 0;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    CALL_DEV(dev);
    NEED(count);
    if (!G->mig_capable) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *count = 7;
    LEAVE(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index,
                                                            nvmlDevice_t *mig) {
    CALL_DEV(dev);
    NEED(mig);
    (void)index;
    if (!G->mig_capable) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    LEAVE(NVML_ERROR_NOT_FOUND); /* MIG is disabled: every slot is empty */
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *dev) {
    CALL_DEV(mig);
    NEED(dev);
    LEAVE(NVML_ERROR_INVALID_ARGUMENT); /* not a MIG handle */
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    CALL_DEV(dev);
    NEED(id);
    LEAVE(NVML_ERROR_INVALID_ARGUMENT);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id) {
    CALL_DEV(dev);
    NEED(id);
    LEAVE(NVML_ERROR_INVALID_ARGUMENT);
}

/* ---- events (registration needs the device scaffolding, waiting is in sim_events.c) */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    CALL_DEV(dev);
    NEED(types);
    FEATURE(FEAT_EVENTS);
    *types = (G->ecc && !(G->unsupported & FEAT_ECC)) ? EVT_SUPPORTED : EVT_XID;
    LEAVE(NVML_SUCCESS);
}

int sim_event_set_register(nvmlEventSet_t set, int gi, unsigned long long types, long long now);

SIM_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    CALL_DEV(dev);
    FEATURE(FEAT_EVENTS);
    unsigned long long supported = (G->ecc && !(G->unsupported & FEAT_ECC)) ? EVT_SUPPORTED : EVT_XID;
    if (types & ~supported) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (sim_event_set_register(set, gi, types, now)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    LEAVE(NVML_SUCCESS);
}
