/*
 * GPU Performance Monitoring (GPM): nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc,
 * nvmlGpmSampleFree, nvmlGpmSampleGet and nvmlGpmMetricsGet, consistent with the
 * scenario's workload.
 *
 * Model. Each GPM metric is the time average, between the two samples, of a percent
 * function of scenario time:
 *   GRAPHICS_UTIL                  = util(t)                  (the utilization pattern)
 *   activity k (SM_UTIL, tensor...) = gpm[k](t) when the scenario gives a pattern,
 *                                     else gpm_ratio[k] x util(t)
 *   PCIE_TX/RX_PER_SEC, NVLINK_TOTAL_TX/RX_PER_SEC (MiB/s) = delta of the simulated
 *                                     PCIe / NVLink byte counters / delta t / 2^20
 * so a memory-bound scenario (utilization 95 %, tensor pattern 10 %) reads 95 % / 10 %,
 * and a data-starved one whose sm_active pattern collapses shows it while util stays
 * high. A sample holds the integrals of those functions up to its time (midpoint rule
 * on the library's 10 ms grid, exact for piecewise-constant inputs on the grid);
 * nvmlGpmMetricsGet divides their difference by the elapsed time, as the hardware
 * counters do (two samples at the same instant -- a frozen virtual clock -- give the
 * values at that instant).
 *
 * Support: a device supports GPM when its architecture is Hopper (9) or newer and the
 * scenario does not list "gpm" as unsupported; elsewhere isSupportedDevice = 0 and
 * nvmlGpmSampleGet returns NVML_ERROR_NOT_SUPPORTED (as on A100 and consumer cards).
 * With gpm_no_permission the device is supported but nvmlGpmSampleGet answers
 * NVML_ERROR_NO_PERMISSION (a host that restricts profiling counters).
 *
 * Every function takes g_sim.lock, like the rest of the library.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define GPM_SAMPLE_MAGIC 0x67706d73u
#define GPM_NINT (GPM_NACT + 1) /* + graphics utilization */

struct sim_gpm_sample {
    unsigned int magic;
    int gpu, filled;
    unsigned long long generation;
    long long t_ns;
    double cum[GPM_NINT];     /* integral of percent x seconds */
    double pcie_tx, pcie_rx;  /* cumulative bytes (sim_integ) */
    double nvlink_tx, nvlink_rx;
};

/* Integration state per GPU, reset whenever a new scenario is loaded (generation). */
static struct {
    unsigned long long generation;
    long long t_ns;
    double cum[GPM_NINT];
} g_gpm[SIM_MAX_GPUS];

static double clamp_pct(double v) { return v < 0 ? 0 : (v > 100 ? 100 : v); }

/* Percent value of activity k (GPM_NACT = graphics util) on GPU gi at time t. */
static double activity(int gi, int k, long long t) {
    const sim_gpu_config *g = &g_sim.gpu[gi];
    double util = sim_util_gpu(gi, t);
    if (k == GPM_NACT) return util;
    if (g->gpm[k].kind != PAT_NONE) return clamp_pct(sim_pattern_eval(&g->gpm[k], (double)t / 1e9));
    return clamp_pct(g->gpm_ratio[k] * util);
}

static void gpm_integrate(int gi, long long t) {
    if (g_gpm[gi].generation != g_sim.generation || t < g_gpm[gi].t_ns) {
        if (g_gpm[gi].generation == g_sim.generation && !g_sim.virtual_clock) return;
        memset(&g_gpm[gi], 0, sizeof(g_gpm[gi]));
        g_gpm[gi].generation = g_sim.generation;
    }
    while (g_gpm[gi].t_ns < t) {
        long long a = g_gpm[gi].t_ns;
        long long b = (a / SIM_STEP_NS + 1) * SIM_STEP_NS;
        if (b > t) b = t;
        long long m = a + (b - a) / 2;
        double dt = (double)(b - a) / 1e9;
        for (int k = 0; k < GPM_NINT; k++) g_gpm[gi].cum[k] += activity(gi, k, m) * dt;
        g_gpm[gi].t_ns = b;
    }
}

static int gpm_supported(int gi) {
    const sim_gpu_config *g = &g_sim.gpu[gi];
    return g->arch >= 9 && !(g->unsupported & FEAT_GPM);
}

static nvmlReturn_t leave(nvmlReturn_t rc, long long lat) {
    sim_unlock();
    sim_sleep_us(lat);
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support) {
    int gi = -1;
    long long now = 0, lat = 0;
    nvmlReturn_t rc = sim_enter_device(dev, &gi, &now, &lat);
    if (rc) return leave(rc, lat);
    if (!support) return leave(NVML_ERROR_INVALID_ARGUMENT, lat);
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, lat);
    support->isSupportedDevice = (unsigned int)gpm_supported(gi);
    return leave(NVML_SUCCESS, lat);
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gpm_sample *s = calloc(1, sizeof(*s));
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = GPM_SAMPLE_MAGIC;
    s->gpu = -1;
    *sample = s;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    int gi = -1;
    long long now = 0, lat = 0;
    nvmlReturn_t rc = sim_enter_device(dev, &gi, &now, &lat);
    if (rc) return leave(rc, lat);
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return leave(NVML_ERROR_INVALID_ARGUMENT, lat);
    if (!gpm_supported(gi)) return leave(NVML_ERROR_NOT_SUPPORTED, lat);
    if (g_sim.gpu[gi].gpm_no_permission) return leave(NVML_ERROR_NO_PERMISSION, lat);
    sim_integrate(gi, now);
    gpm_integrate(gi, now);
    const sim_integ *in = &g_sim.integ[gi];
    sample->gpu = gi;
    sample->filled = 1;
    sample->generation = g_sim.generation;
    sample->t_ns = now;
    memcpy(sample->cum, g_gpm[gi].cum, sizeof(sample->cum));
    sample->pcie_tx = in->pcie_tx_bytes;
    sample->pcie_rx = in->pcie_rx_bytes;
    sample->nvlink_tx = in->nvlink_tx_bytes;
    sample->nvlink_rx = in->nvlink_rx_bytes;
    return leave(NVML_SUCCESS, lat);
}

static const struct {
    unsigned int id;
    int source; /* 0..GPM_NACT: activity index; -1..-4: PCIe TX/RX, NVLink RX/TX */
    const char *short_name, *long_name, *unit;
} METRICS[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, GPM_NACT, "gr_util", "graphics engine utilization", "%"},
    {NVML_GPM_METRIC_SM_UTIL, GPM_SM_ACTIVE, "sm_util", "SM utilization", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, GPM_SM_OCCUPANCY, "sm_occupancy", "SM occupancy", "%"},
    {NVML_GPM_METRIC_INTEGER_UTIL, GPM_INTEGER, "integer_util", "integer pipe utilization", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, GPM_TENSOR, "any_tensor_util", "tensor pipe utilization", "%"},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, GPM_DFMA, "dfma_tensor_util", "DFMA tensor utilization", "%"},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, GPM_HMMA, "hmma_tensor_util", "HMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_DMMA_TENSOR_UTIL, GPM_DMMA, "dmma_tensor_util", "DMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, GPM_IMMA, "imma_tensor_util", "IMMA tensor utilization", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, GPM_DRAM, "dram_bw_util", "DRAM bandwidth utilization", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, GPM_FP64, "fp64_util", "FP64 pipe utilization", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, GPM_FP32, "fp32_util", "FP32 pipe utilization", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, GPM_FP16, "fp16_util", "FP16 pipe utilization", "%"},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, -1, "pcie_tx", "PCIe transmit bandwidth", "MiB/sec"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, -2, "pcie_rx", "PCIe receive bandwidth", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, -3, "nvlink_total_rx", "NVLink read bandwidth", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, -4, "nvlink_total_tx", "NVLink write bandwidth", "MiB/sec"},
};

SIM_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg) {
    sim_lock();
    g_sim.calls++;
    if (g_sim.refcount <= 0) return leave(NVML_ERROR_UNINITIALIZED, 0);
    if (!mg) return leave(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (mg->version != NVML_GPM_METRICS_GET_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 0);
    const struct sim_gpm_sample *a = mg->sample1, *b = mg->sample2;
    if (!a || !b || a->magic != GPM_SAMPLE_MAGIC || b->magic != GPM_SAMPLE_MAGIC || !a->filled ||
        !b->filled || a->gpu != b->gpu || a->generation != b->generation || b->t_ns < a->t_ns)
        return leave(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (mg->numMetrics > 477u) return leave(NVML_ERROR_INVALID_ARGUMENT, 0);
    const sim_gpu_config *g = &g_sim.gpu[a->gpu];
    double dt = (double)(b->t_ns - a->t_ns) / 1e9;
    for (unsigned int i = 0; i < mg->numMetrics; i++) {
        nvmlGpmMetric_t *m = &mg->metrics[i];
        m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        m->value = 0.0;
        memset(&m->metricInfo, 0, sizeof(m->metricInfo));
        for (size_t k = 0; k < sizeof(METRICS) / sizeof(METRICS[0]); k++) {
            if (METRICS[k].id != m->metricId) continue;
            int src = METRICS[k].source;
            if (src <= -3 && (g->nvlink_links <= 0 || (g->unsupported & FEAT_NVLINK))) break;
            if (src < 0 && src >= -2 && (g->unsupported & FEAT_PCIE)) break;
            double v;
            if (dt <= 0) {
                /* Both samples at one instant (a frozen virtual clock): the values at t. */
                double u = sim_util_gpu(a->gpu, a->t_ns) / 100.0 / 1048576.0;
                if (src >= 0) v = activity(a->gpu, src, a->t_ns);
                else if (src == -1) v = g->pcie_tx_bps * u;
                else if (src == -2) v = g->pcie_rx_bps * u;
                else if (src == -3) v = g->nvlink_rx_bps * u;
                else v = g->nvlink_tx_bps * u;
            } else if (src >= 0) v = (b->cum[src] - a->cum[src]) / dt;
            else if (src == -1) v = (b->pcie_tx - a->pcie_tx) / dt / 1048576.0;
            else if (src == -2) v = (b->pcie_rx - a->pcie_rx) / dt / 1048576.0;
            else if (src == -3) v = (b->nvlink_rx - a->nvlink_rx) / dt / 1048576.0;
            else v = (b->nvlink_tx - a->nvlink_tx) / dt / 1048576.0;
            m->value = v < 0 ? 0.0 : v;
            m->nvmlReturn = NVML_SUCCESS;
            m->metricInfo.shortName = (char *)METRICS[k].short_name;
            m->metricInfo.longName = (char *)METRICS[k].long_name;
            m->metricInfo.unit = (char *)METRICS[k].unit;
            break;
        }
    }
    return leave(NVML_SUCCESS, 0);
}
