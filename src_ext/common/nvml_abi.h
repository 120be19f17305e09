/*
 * The NVML ABI subset otelgpu uses: types, structs and constants, declared once for
 * both the native sampler (src_ext/sampler, which calls NVML through dlsym) and the
 * simulated library (src_ext/sim, which implements it).
 *
 * Layouts follow nvml.h (NVML_API_VERSION 13) for the LP64 ABIs (x86-64, aarch64);
 * their sizes are checked at compile time against pynvml's ctypes declarations (end of
 * this file). Opaque handle tags can be renamed by the includer (the simulator
 * defines them as its own device and event-set structs):
 *   #define OTG_NVML_DEVICE_TAG sim_device   before including this header.
 */
#ifndef OTG_NVML_ABI_H
#define OTG_NVML_ABI_H

#ifndef OTG_NVML_DEVICE_TAG
#define OTG_NVML_DEVICE_TAG nvmlDevice_st
#endif
#ifndef OTG_NVML_EVENT_SET_TAG
#define OTG_NVML_EVENT_SET_TAG nvmlEventSet_st
#endif
#ifndef OTG_NVML_GPM_SAMPLE_TAG
#define OTG_NVML_GPM_SAMPLE_TAG nvmlGpmSample_st
#endif

typedef unsigned int nvmlReturn_t;

typedef struct OTG_NVML_DEVICE_TAG *nvmlDevice_t;
typedef struct OTG_NVML_EVENT_SET_TAG *nvmlEventSet_t;
typedef struct OTG_NVML_GPM_SAMPLE_TAG *nvmlGpmSample_t;

#define NVML_STRUCT_VERSION(s, v) ((unsigned int)(sizeof(s) | ((v) << 24U)))

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;                 /* 8 */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;           /* 24 */
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;                                                               /* 40 */
#define OTG_NVML_MEMORY_V2_VERSION NVML_STRUCT_VERSION(nvmlMemory_v2_t, 2U)  /* 0x02000028 */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;                                                                 /* 68 */
typedef struct {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v1_t;                                                              /* 52 */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;                                                             /* 24 */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;                                                /* 32 */
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;                                               /* 40 */
typedef struct {
    unsigned int version, processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;                                                /* 24 */
typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;                                                                   /* 8 */
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;                                                              /* 40 */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;                                                               /* 32 */
typedef struct { unsigned int version, sensorType; int temperature; } nvmlTemperature_t;
typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;

/* ---- GPU Performance Monitoring (GPM, Hopper and newer) ---------------------------
 * nvmlGpmQueryDeviceSupport says whether a device has it; nvmlGpmSampleGet fills an
 * opaque sample (allocated by nvmlGpmSampleAlloc); nvmlGpmMetricsGet computes
 * metrics between two samples of one device taken >= 100 ms apart. The library reads
 * only the first numMetrics entries of `metrics`, so the array length (which grows
 * with each header release: NVML_GPM_METRIC_MAX) is the caller's choice. */
#define NVML_GPM_SUPPORT_VERSION 1u
#define NVML_GPM_METRICS_GET_VERSION 1u
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;   /* 8 */
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;                                                               /* 40 */
#define OTG_GPM_MAX_REQUEST 32 /* metrics one otelgpu call asks for at most */
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[OTG_GPM_MAX_REQUEST];
} nvmlGpmMetricsGet_t;

/* GPM metric ids (nvmlGpmMetricId_t) otelgpu reads. */
#define NVML_GPM_METRIC_GRAPHICS_UTIL 1
#define NVML_GPM_METRIC_SM_UTIL 2
#define NVML_GPM_METRIC_SM_OCCUPANCY 3
#define NVML_GPM_METRIC_INTEGER_UTIL 4
#define NVML_GPM_METRIC_ANY_TENSOR_UTIL 5
#define NVML_GPM_METRIC_DFMA_TENSOR_UTIL 6
#define NVML_GPM_METRIC_HMMA_TENSOR_UTIL 7
#define NVML_GPM_METRIC_DMMA_TENSOR_UTIL 8
#define NVML_GPM_METRIC_IMMA_TENSOR_UTIL 9
#define NVML_GPM_METRIC_DRAM_BW_UTIL 10
#define NVML_GPM_METRIC_FP64_UTIL 11
#define NVML_GPM_METRIC_FP32_UTIL 12
#define NVML_GPM_METRIC_FP16_UTIL 13
#define NVML_GPM_METRIC_PCIE_TX_PER_SEC 20
#define NVML_GPM_METRIC_PCIE_RX_PER_SEC 21
#define NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC 60
#define NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC 61

/* Layouts as pynvml declares them (x86-64 / aarch64 LP64): checked at compile time. */
#define OTG_ABI_SIZE(t, n) _Static_assert(sizeof(t) == (n), "NVML ABI: sizeof " #t)
OTG_ABI_SIZE(nvmlUtilization_t, 8);
OTG_ABI_SIZE(nvmlMemory_t, 24);
OTG_ABI_SIZE(nvmlMemory_v2_t, 40);
OTG_ABI_SIZE(nvmlPciInfo_t, 68);
OTG_ABI_SIZE(nvmlProcessInfo_t, 24);
OTG_ABI_SIZE(nvmlProcessUtilizationSample_t, 32);
OTG_ABI_SIZE(nvmlProcessUtilizationInfo_v1_t, 40);
OTG_ABI_SIZE(nvmlProcessesUtilizationInfo_t, 24);
OTG_ABI_SIZE(nvmlValue_t, 8);
OTG_ABI_SIZE(nvmlSample_t, 16);
OTG_ABI_SIZE(nvmlFieldValue_t, 40);
OTG_ABI_SIZE(nvmlEventData_t, 32);
OTG_ABI_SIZE(nvmlTemperature_t, 12);
OTG_ABI_SIZE(nvmlViolationTime_t, 16);
OTG_ABI_SIZE(nvmlBAR1Memory_t, 24);
OTG_ABI_SIZE(nvmlGpmSupport_t, 8);
OTG_ABI_SIZE(nvmlGpmMetric_t, 40);
_Static_assert(__builtin_offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "NVML ABI: GPM metrics");
#undef OTG_ABI_SIZE

/* Field ids (nvmlDeviceGetFieldValues) and other constants used on both sides. */
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION 83
#define NVML_FI_DEV_PCIE_REPLAY_COUNTER 94
#define NVML_FI_DEV_REMAPPED_COR 142
#define NVML_FI_DEV_REMAPPED_UNC 143
#define NVML_FI_DEV_REMAPPED_PENDING 144
#define NVML_FI_DEV_REMAPPED_FAILURE 145
#define NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0
#define NVML_TEMPERATURE_THRESHOLD_SLOWDOWN 1

#endif
