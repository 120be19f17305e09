/*
 * otelgpu simulated NVML: shared internal declarations.
 *
 * The library is split into:
 *   sim_config.c  - parser of the normalized scenario text the Python side produces;
 *   sim_model.c   - the device model: time functions, integration of cumulative
 *                   counters (energy, throttle ns, PCIe/NVLink bytes), temperature;
 *   sim_nvml.c    - the exported NVML API (tiers A and B of nvml.md);
 *   sim_events.c  - event sets and XID delivery (nvmlEventSetWait_v2 blocks);
 *   sim_control.c - otelgpu_sim_* control entry points (clock, inject, configure);
 *   sim_stubs.c   - every other commonly looked-up symbol -> NVML_ERROR_NOT_SUPPORTED.
 *
 * Thread-safety: one process-wide mutex (g_sim.lock) protects all state; every
 * exported function takes it. Per-call latency sleeps happen outside the lock.
 * Only symbols marked SIM_EXPORT are visible (the library is built with
 * -fvisibility=hidden).
 */
#ifndef OTELGPU_SIM_H
#define OTELGPU_SIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_EXPORT __attribute__((visibility("default")))

/* ---- NVML ABI ------------------------------------------------------------ */

/* Types and structs: one declaration shared with the native sampler. */
#define OTG_NVML_DEVICE_TAG sim_device
#define OTG_NVML_EVENT_SET_TAG sim_event_set
#define OTG_NVML_GPM_SAMPLE_TAG sim_gpm_sample
#include "common/nvml_abi.h"

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)

/* value types */
enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULONG = 2, VT_ULL = 3, VT_SLL = 4, VT_SINT = 5 };

/* clock-event reasons (bitmask) */
#define REASON_GPU_IDLE 0x1ULL
#define REASON_APP_CLOCKS 0x2ULL
#define REASON_SW_POWER_CAP 0x4ULL
#define REASON_HW_SLOWDOWN 0x8ULL
#define REASON_SYNC_BOOST 0x10ULL
#define REASON_SW_THERMAL 0x20ULL
#define REASON_HW_THERMAL 0x40ULL
#define REASON_HW_POWER_BRAKE 0x80ULL
#define REASON_DISPLAY_CLOCK 0x100ULL
#define REASON_SUPPORTED 0x1FFULL

/* event types */
#define EVT_SBE 0x1ULL
#define EVT_DBE 0x2ULL
#define EVT_PSTATE 0x4ULL
#define EVT_XID 0x8ULL
#define EVT_CLOCK 0x10ULL
#define EVT_SUPPORTED (EVT_SBE | EVT_DBE | EVT_XID)

/* ---- Scenario model ------------------------------------------------------ */

#define SIM_MAX_GPUS 16
#define SIM_MAX_STEPS 64
#define SIM_MAX_PROCS 256
#define SIM_MAX_EVENTS 4096
#define SIM_STEP_NS 10000000LL /* integration grid: 10 ms */

enum pattern_kind { PAT_NONE = 0, PAT_CONSTANT, PAT_SQUARE, PAT_RAMP, PAT_BURSTS, PAT_STEPS };

/* A time function v(t), t in seconds since scenario start. */
typedef struct {
    int kind;
    double a, b, c, d, e; /* meaning depends on kind, see sim_model.c */
    uint64_t seed;
    int nsteps;
    double step_t[SIM_MAX_STEPS], step_v[SIM_MAX_STEPS];
} sim_pattern;

/* Features a device can lack (NOT_SUPPORTED). */
enum {
    FEAT_ECC = 1 << 0,
    FEAT_FAN = 1 << 1,
    FEAT_POWER = 1 << 2,
    FEAT_ENERGY = 1 << 3,
    FEAT_TEMPERATURE = 1 << 4,
    FEAT_NVLINK = 1 << 5,
    FEAT_REMAPPED_ROWS = 1 << 6,
    FEAT_PCIE = 1 << 7,
    FEAT_PROCESSES = 1 << 8,
    FEAT_UTILIZATION = 1 << 9,
    FEAT_CLOCK_REASONS = 1 << 10,
    FEAT_MEMORY_V2 = 1 << 11,
    FEAT_CLOCKS = 1 << 12,
    FEAT_PSTATE = 1 << 13,
    FEAT_EVENTS = 1 << 14,
    FEAT_SAMPLES = 1 << 15,
    FEAT_RETIRED_PAGES = 1 << 16,
    FEAT_GPM = 1 << 17, /* GPU Performance Monitoring (also needs arch >= Hopper) */
};

/* GPM activity metrics the simulator models (sim_gpm.c); index into sim_gpu_config.gpm. */
enum {
    GPM_SM_ACTIVE, GPM_SM_OCCUPANCY, GPM_TENSOR, GPM_HMMA, GPM_IMMA, GPM_DFMA, GPM_DMMA,
    GPM_DRAM, GPM_FP16, GPM_FP32, GPM_FP64, GPM_INTEGER, GPM_NACT
};

typedef struct {
    char name[96], uuid[96], serial[32], bus_id[32];
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_bytes, reserved_bytes, bar1_bytes;
    unsigned int arch, cc_major, cc_minor;
    unsigned int power_limit_mw, default_limit_mw, min_limit_mw, max_limit_mw;
    double idle_power_w, max_power_w;
    unsigned int sm_clock_max, sm_clock_idle, mem_clock, video_clock;
    int ecc, fans, nvlink_links, pcie_gen, pcie_width, pcie_gen_max, pcie_width_max;
    double ambient_c, thermal_c_per_w, thermal_tau_s, slowdown_c, shutdown_c, mem_temp_offset_c;
    double thermal_clock_factor;
    double pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps; /* bytes/s at 100% util */
    unsigned long long ecc_agg_corrected, ecc_agg_uncorrected;       /* lifetime baselines */
    unsigned int unsupported;                                         /* FEAT_* bits */
    unsigned int mig_capable;
    sim_pattern util, mem_util, mem_used, power;
    /* GPM activity k in percent: gpm[k](t) when given, else gpm_ratio[k] x util(t). */
    sim_pattern gpm[GPM_NACT];
    double gpm_ratio[GPM_NACT];
    int gpm_no_permission; /* GPM calls answer NVML_ERROR_NO_PERMISSION (restricted host) */
} sim_gpu_config;

enum event_kind {
    EV_XID = 1,      /* a: xid code, b: XID48_* flags */
    EV_LOST = 2,     /* gpu falls off the bus (delivers xid 79) */
    EV_ECC = 3,      /* a: corrected, b: uncorrected, spread over duration */
    EV_THROTTLE = 4, /* a: reason mask, b: clock factor, c: power cap W (0 = none) */
    EV_REMAP = 5,    /* a: correctable rows, b: uncorrectable, c: pending, d: failure */
    EV_SLOW = 6,     /* a: extra latency per call, microseconds */
};

typedef struct {
    int gpu; /* -1 = every GPU */
    int kind;
    long long start_ns, dur_ns;
    double a, b, c, d;
} sim_event;

typedef struct {
    int gpu;
    unsigned int pid;
    unsigned long long mem_bytes;
    long long start_ns, end_ns; /* end_ns < 0: runs forever */
    double sm_util;            /* <0: the device's utilization */
    int graphics;
    char name[128];
} sim_proc;

/* Integration state of one GPU (cumulative counters up to t_ns). */
typedef struct {
    long long t_ns;
    double energy_mj;
    double temp_c;
    double throttle_ns[10]; /* index = bit number of the reason */
    double pcie_tx_bytes, pcie_rx_bytes, nvlink_tx_bytes, nvlink_rx_bytes;
} sim_integ;

struct sim_device {
    unsigned int index;
    unsigned int magic;
};

#define SIM_DEVICE_MAGIC 0x6f746770u

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* broadcast when time moves or an event is injected */
    int configured;
    int refcount;
    int virtual_clock;
    long long virtual_ns;       /* virtual clock position */
    long long epoch_ns;         /* wall time (ns since 1970) of scenario t = 0 */
    long long mono_origin_ns;   /* CLOCK_MONOTONIC at t = 0 (wall-clock mode) */
    unsigned int init_error;
    long long latency_us;       /* every call */
    char driver_version[80], nvml_version[80];
    int cuda_version;
    int gpu_count;
    sim_gpu_config gpu[SIM_MAX_GPUS];
    sim_integ integ[SIM_MAX_GPUS];
    int nprocs;
    sim_proc procs[SIM_MAX_PROCS];
    int nevents;
    sim_event events[SIM_MAX_EVENTS];
    /* indices into events[] by kind, so per-step scans skip unrelated events */
    int n_throttle, n_lost, n_slow;
    int idx_throttle[SIM_MAX_EVENTS], idx_lost[SIM_MAX_EVENTS], idx_slow[SIM_MAX_EVENTS];
    long long thermal_lost_ns[SIM_MAX_GPUS]; /* when the GPU reached shutdown_c; -1 = never */
    unsigned long long generation; /* bumped on each configure */
    unsigned long long calls;      /* NVML calls served (diagnostics) */
    char last_error[512];
} sim_state;

extern sim_state g_sim;
extern struct sim_device g_devices[SIM_MAX_GPUS];

/* sim_config.c */
int sim_parse_config(const char *text, sim_state *out, char *err, size_t errlen);
int sim_parse_event(const char *line, sim_event *ev, char *err, size_t errlen);
int sim_parse_pattern(const char *text, sim_pattern *p);

/* sim_model.c: all functions expect g_sim.lock held. */
long long sim_now_ns(void);
long long sim_epoch_us(long long t_ns);
double sim_pattern_eval(const sim_pattern *p, double t_s);
double sim_util_gpu(int gpu, long long t_ns);
double sim_util_mem(int gpu, long long t_ns);
double sim_power_w(int gpu, long long t_ns);
unsigned long long sim_reasons(int gpu, long long t_ns);
double sim_clock_factor(int gpu, long long t_ns);
unsigned int sim_sm_clock(int gpu, long long t_ns);
unsigned long long sim_mem_used(int gpu, long long t_ns);
void sim_integrate(int gpu, long long t_ns);
int sim_is_lost(int gpu, long long t_ns);
void sim_ecc_counts(int gpu, long long t_ns, unsigned long long *corr, unsigned long long *unc);
void sim_remap_counts(int gpu, long long t_ns, unsigned int out[4]);
long long sim_latency_us(int gpu, long long t_ns);
int sim_proc_alive(const sim_proc *p, long long t_ns);
void sim_reset_integration(void);
void sim_index_events(void);

/* Xid 48 (double-bit ECC) comes with what a real Ampere+/Hopper board raises alongside
 * it; EV_XID b holds these flags. */
#define XID48_UNCONTAINED 1 /* Xid 95 (uncontained: GPU reset needed) instead of 94 */
#define XID48_ALONE 2       /* no companions: just the Xid 48 event */
int sim_add_companions(sim_state *st, int i);

/* sim_events.c */
void sim_events_reset(void);
void sim_events_notify(void);

/* Lock helpers (sim_nvml.c). */
void sim_lock(void);
void sim_unlock(void);
void sim_sleep_us(long long us);
/* Lock; count the call; check initialisation, the handle (-> *gi) and loss; set *now and
 * the call's latency *lat (0 until known). The lock stays held whatever it returns. */
nvmlReturn_t sim_enter_device(nvmlDevice_t dev, int *gi, long long *now, long long *lat);

#endif
