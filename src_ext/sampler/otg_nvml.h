/*
 * otelgpu native sampler: the NVML subset it calls, looked up at run time.
 *
 * No link-time dependency on libnvidia-ml: otg_nvml_load() dlopen()s the library
 * (the soname libnvidia-ml.so.1, or the path in OTELGPU_NVML_LIBRARY resolved by
 * Python) and fills a table of function pointers with dlsym(). A NULL pointer
 * means "this driver lacks the function" and switches the matching sample field
 * off (capability probing, otg_sampler.h). Newer names are preferred
 * (…ClocksEventReasons before …ClocksThrottleReasons, _v2 before v1).
 *
 * Types and structs come from common/nvml_abi.h, shared with the simulated library;
 * only the functions the sampler uses are declared here.
 */
#ifndef OTG_NVML_H
#define OTG_NVML_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "common/nvml_abi.h"

typedef nvmlReturn_t otg_ret_t;

#define OTG_NVML_SUCCESS 0u
#define OTG_NVML_ERROR_UNINITIALIZED 1u
#define OTG_NVML_ERROR_NO_PERMISSION 4u
#define OTG_NVML_ERROR_NOT_SUPPORTED 3u
#define OTG_NVML_ERROR_NOT_FOUND 6u
#define OTG_NVML_ERROR_TIMEOUT 10u
#define OTG_NVML_ERROR_LIBRARY_NOT_FOUND 12u
#define OTG_NVML_ERROR_FUNCTION_NOT_FOUND 13u
#define OTG_NVML_ERROR_GPU_IS_LOST 15u
#define OTG_NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25u
#define OTG_NVML_ERROR_UNKNOWN 999u

typedef nvmlDevice_t otg_dev_t;
typedef nvmlEventSet_t otg_evset_t;
typedef nvmlUtilization_t otg_utilization_t;
typedef nvmlMemory_t otg_memory_t;
typedef nvmlValue_t otg_value_t;
typedef nvmlFieldValue_t otg_field_value_t;
typedef nvmlEventData_t otg_event_data_t;

#define OTG_TEMPERATURE_GPU 0u
#define OTG_CLOCK_SM 1u
#define OTG_CLOCK_MEM 2u
#define OTG_EVENT_XID 0x8ull
#define OTG_SCOPE_ALL_LINKS 0xFFFFFFFFu

typedef struct {
    void *lib;
    char error[512];
    otg_ret_t (*Init)(void);
    otg_ret_t (*Shutdown)(void);
    otg_ret_t (*DeviceGetHandleByUUID)(const char *, otg_dev_t *);
    otg_ret_t (*DeviceGetUtilizationRates)(otg_dev_t, otg_utilization_t *);
    otg_ret_t (*DeviceGetMemoryInfo)(otg_dev_t, otg_memory_t *);
    otg_ret_t (*DeviceGetMemoryInfo_v2)(otg_dev_t, nvmlMemory_v2_t *);
    otg_ret_t (*DeviceGetEncoderUtilization)(otg_dev_t, unsigned int *, unsigned int *);
    otg_ret_t (*DeviceGetDecoderUtilization)(otg_dev_t, unsigned int *, unsigned int *);
    otg_ret_t (*GpmQueryDeviceSupport)(otg_dev_t, nvmlGpmSupport_t *);
    otg_ret_t (*GpmSampleAlloc)(nvmlGpmSample_t *);
    otg_ret_t (*GpmSampleFree)(nvmlGpmSample_t);
    otg_ret_t (*GpmSampleGet)(otg_dev_t, nvmlGpmSample_t);
    otg_ret_t (*GpmMetricsGet)(nvmlGpmMetricsGet_t *);
    otg_ret_t (*DeviceGetPowerUsage)(otg_dev_t, unsigned int *);
    otg_ret_t (*DeviceGetTemperature)(otg_dev_t, unsigned int, unsigned int *);
    otg_ret_t (*DeviceGetClockInfo)(otg_dev_t, unsigned int, unsigned int *);
    otg_ret_t (*DeviceGetCurrentClocksEventReasons)(otg_dev_t, unsigned long long *);
    otg_ret_t (*DeviceGetFieldValues)(otg_dev_t, int, otg_field_value_t *);
    otg_ret_t (*DeviceGetFanSpeed)(otg_dev_t, unsigned int *);
    otg_ret_t (*DeviceGetPerformanceState)(otg_dev_t, unsigned int *);
    otg_ret_t (*EventSetCreate)(otg_evset_t *);
    otg_ret_t (*DeviceRegisterEvents)(otg_dev_t, unsigned long long, otg_evset_t);
    otg_ret_t (*DeviceGetSupportedEventTypes)(otg_dev_t, unsigned long long *);
    otg_ret_t (*EventSetWait)(otg_evset_t, otg_event_data_t *, unsigned int);
    otg_ret_t (*EventSetFree)(otg_evset_t);
} otg_nvml_t;

/* dlsym() into a function pointer without the ISO C object/function cast warning. */
#define OTG_SYM(t, field, name)                                         \
    do {                                                                \
        if ((t)->field == NULL) *(void **)(&(t)->field) = dlsym((t)->lib, (name)); \
    } while (0)

/* Load the library and resolve the table. Returns 0, or -1 with t->error set. */
static int otg_nvml_load(otg_nvml_t *t, const char *path)
{
    memset(t, 0, sizeof *t);
    t->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (t->lib == NULL) {
        const char *why = dlerror();
        snprintf(t->error, sizeof t->error, "cannot load %s: %s", path, why ? why : "?");
        return -1;
    }
    OTG_SYM(t, Init, "nvmlInit_v2");
    OTG_SYM(t, Init, "nvmlInit");
    OTG_SYM(t, Shutdown, "nvmlShutdown");
    OTG_SYM(t, DeviceGetHandleByUUID, "nvmlDeviceGetHandleByUUID");
    OTG_SYM(t, DeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates");
    OTG_SYM(t, DeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
    OTG_SYM(t, DeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
    OTG_SYM(t, DeviceGetEncoderUtilization, "nvmlDeviceGetEncoderUtilization");
    OTG_SYM(t, DeviceGetDecoderUtilization, "nvmlDeviceGetDecoderUtilization");
    OTG_SYM(t, GpmQueryDeviceSupport, "nvmlGpmQueryDeviceSupport");
    OTG_SYM(t, GpmSampleAlloc, "nvmlGpmSampleAlloc");
    OTG_SYM(t, GpmSampleFree, "nvmlGpmSampleFree");
    OTG_SYM(t, GpmSampleGet, "nvmlGpmSampleGet");
    OTG_SYM(t, GpmMetricsGet, "nvmlGpmMetricsGet");
    OTG_SYM(t, DeviceGetPowerUsage, "nvmlDeviceGetPowerUsage");
    OTG_SYM(t, DeviceGetTemperature, "nvmlDeviceGetTemperature");
    OTG_SYM(t, DeviceGetClockInfo, "nvmlDeviceGetClockInfo");
    OTG_SYM(t, DeviceGetCurrentClocksEventReasons, "nvmlDeviceGetCurrentClocksEventReasons");
    OTG_SYM(t, DeviceGetCurrentClocksEventReasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
    OTG_SYM(t, DeviceGetFieldValues, "nvmlDeviceGetFieldValues");
    OTG_SYM(t, DeviceGetFanSpeed, "nvmlDeviceGetFanSpeed");
    OTG_SYM(t, DeviceGetPerformanceState, "nvmlDeviceGetPerformanceState");
    OTG_SYM(t, EventSetCreate, "nvmlEventSetCreate");
    OTG_SYM(t, DeviceRegisterEvents, "nvmlDeviceRegisterEvents");
    OTG_SYM(t, DeviceGetSupportedEventTypes, "nvmlDeviceGetSupportedEventTypes");
    OTG_SYM(t, EventSetWait, "nvmlEventSetWait_v2");
    OTG_SYM(t, EventSetWait, "nvmlEventSetWait");
    OTG_SYM(t, EventSetFree, "nvmlEventSetFree");
    if (t->Init == NULL || t->DeviceGetHandleByUUID == NULL) {
        snprintf(t->error, sizeof t->error,
                 "%s lacks nvmlInit_v2/nvmlInit or nvmlDeviceGetHandleByUUID", path);
        return -1;
    }
    return 0;
}

/* Any integer-typed field value as an unsigned 64-bit number (valueType per nvml.h). */
static unsigned long long otg_field_u64(const otg_field_value_t *f)
{
    switch (f->valueType) {
    case 0: return f->value.dVal > 0 ? (unsigned long long)f->value.dVal : 0ull;
    case 1: return f->value.uiVal;
    case 2: return f->value.ulVal;
    case 4: return f->value.sllVal > 0 ? (unsigned long long)f->value.sllVal : 0ull;
    case 5: return f->value.siVal > 0 ? (unsigned long long)f->value.siVal : 0ull;
    case 6: return f->value.usVal;
    default: return f->value.ullVal;
    }
}

#endif
