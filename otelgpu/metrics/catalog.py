"""Every metric otelgpu exports, defined once as a :class:`~otelgpu.metrics.spec.MetricSpec`.

One list for every area: the GPU observable instruments (``otelgpu.metrics.gpu``), the
sampler's own health, the step and request metrics of the runtime, the internal
counters, the PyTorch instrumentation and the vLLM instrumentation. Instruments are
created from these specs only (``Runtime.instrument(spec)``); ``docs/metrics*.md`` render
their tables from them (``python -m otelgpu.metrics.markdown``, checked by the tests).

Semantic-convention names (``hw.*``: OpenTelemetry hardware conventions; ``gen_ai.*``:
GenAI conventions; both Development status) where a convention exists, otelgpu's own
``otelgpu.*`` names where none does. Units are UCUM.

Every GPU metric also carries :data:`DEVICE_ATTRIBUTES` (``hw.id`` is the device UUID),
plus ``hw.parent`` for a MIG instance. Sketch metrics are exported as OTLP exponential
histograms plus a ``<name>.quantile`` gauge (attribute ``quantile``).

This module is long on purpose (one row per metric, no logic): the point of the catalog
is that one place lists every metric, so it is not split by area.
"""

from __future__ import annotations

from otelgpu.metrics.spec import Area, Kind, MetricSpec, Status

_SKETCH = Kind.SKETCH
_COUNTER = Kind.COUNTER
_OCOUNTER = Kind.OBSERVABLE_COUNTER
_OUPDOWN = Kind.OBSERVABLE_UP_DOWN_COUNTER
_OGAUGE = Kind.OBSERVABLE_GAUGE
_DEV = Status.SEMCONV_DEVELOPMENT

DEVICE_ATTRIBUTES = ("hw.id", "hw.name", "hw.vendor", "hw.type")
"""Attributes of every per-device GPU series."""

RECOMMENDED_DEVICE_ATTRIBUTES = (
    "hw.model",
    "hw.driver_version",
    "hw.firmware_version",
    "hw.serial_number",
)
"""Also on every per-device GPU series, where NVML can read them (semconv recommended)."""

GPU_TASKS = ("general", "encoder", "decoder")
"""Values of ``hw.gpu.task`` on ``hw.gpu.utilization``."""

HW_STATES = ("ok", "degraded", "predicted_failure", "failed")
"""Values of ``hw.state`` on ``hw.status`` (exactly one is 1 per device)."""


def _gpu(
    name: str,
    kind: Kind,
    unit: str,
    description: str,
    attributes: tuple[str, ...] = (),
    *,
    semconv: bool = False,
    source: str = "",
) -> MetricSpec:
    return MetricSpec(
        name,
        kind,
        unit,
        description,
        Area.GPU,
        attributes,
        _DEV if semconv else Status.OTELGPU,
        source,
    )


# =========================================================================== GPU (hw.*)

GPU_UTILIZATION = _gpu(
    "hw.gpu.utilization",
    _OGAUGE,
    "1",
    "Fraction of time one or more kernels was executing (NVML utilization / 100); "
    "hw.gpu.task encoder / decoder: the video engines' utilization.",
    ("hw.gpu.task",),
    semconv=True,
    source="nvmlDeviceGetUtilizationRates, nvmlDeviceGetEncoder/DecoderUtilization",
)
GPU_MEMORY_USAGE = _gpu(
    "hw.gpu.memory.usage",
    _OUPDOWN,
    "By",
    "GPU memory used, without the driver's reserved memory where NVML has memory v2 "
    "(driver >= 515), as nvidia-smi shows it.",
    semconv=True,
    source="nvmlDeviceGetMemoryInfo_v2 (else v1)",
)
GPU_MEMORY_LIMIT = _gpu(
    "hw.gpu.memory.limit",
    _OUPDOWN,
    "By",
    "GPU memory size.",
    semconv=True,
    source="nvmlDeviceGetMemoryInfo",
)
GPU_MEMORY_UTILIZATION = _gpu(
    "hw.gpu.memory.utilization",
    _OGAUGE,
    "1",
    "Fraction of GPU memory used.",
    semconv=True,
    source="nvmlDeviceGetMemoryInfo",
)
POWER = _gpu(
    "hw.power",
    _OGAUGE,
    "W",
    "Power drawn by the GPU.",
    semconv=True,
    source="nvmlDeviceGetPowerUsage",
)
ENERGY = _gpu(
    "hw.energy",
    _OCOUNTER,
    "J",
    "Energy consumed by the GPU since the driver loaded.",
    semconv=True,
    source="nvmlDeviceGetTotalEnergyConsumption",
)
TEMPERATURE = _gpu(
    "hw.temperature",
    _OGAUGE,
    "Cel",
    "GPU temperature; hw.sensor_location memory: the HBM temperature.",
    ("hw.sensor_location",),
    semconv=True,
    source="nvmlDeviceGetTemperature, nvmlDeviceGetFieldValues (memory temperature)",
)
GPU_IO = _gpu(
    "hw.gpu.io",
    _OCOUNTER,
    "By",
    "Bytes moved over PCIe (NVML PCIe byte counters; they may wrap).",
    ("network.io.direction",),
    semconv=True,
    source="nvmlDeviceGetFieldValues (PCIe TX/RX bytes)",
)
ERRORS = _gpu(
    "hw.errors",
    _OCOUNTER,
    "{error}",
    "ECC memory errors since the driver loaded (volatile counters).",
    ("error.type",),
    semconv=True,
    source="nvmlDeviceGetTotalEccErrors",
)
STATUS = _gpu(
    "hw.status",
    _OUPDOWN,
    "1",
    "1 for the device's current state, 0 for the others: failed (GPU lost), "
    "predicted_failure (row remap failure, or uncorrected ECC errors rising since the "
    "previous collection), degraded (clocks reduced for a hardware reason: hardware "
    "slowdown, hardware thermal slowdown or power brake; or a row remap pending), else ok.",
    ("hw.state",),
    semconv=True,
    source="sampler (device lost, clock-event reasons, ECC, remapped rows)",
)
MEMORY_CONTROLLER_UTILIZATION = _gpu(
    "otelgpu.gpu.memory_controller.utilization",
    _OGAUGE,
    "1",
    "Fraction of time device memory was being read or written (NVML memory utilization).",
    source="nvmlDeviceGetUtilizationRates",
)
MEMORY_WATERMARK = _gpu(
    "otelgpu.gpu.memory.watermark",
    _OGAUGE,
    "By",
    "Peak GPU memory used since the previous collection (catches batch peaks between exports).",
    source="sampler window",
)
CLOCK_SM = _gpu(
    "otelgpu.gpu.clock.sm", _OGAUGE, "Hz", "SM clock frequency.", source="nvmlDeviceGetClockInfo"
)
CLOCK_MEMORY = _gpu(
    "otelgpu.gpu.clock.memory",
    _OGAUGE,
    "Hz",
    "Memory clock frequency.",
    source="nvmlDeviceGetClockInfo",
)
THROTTLE_FRACTION = _gpu(
    "otelgpu.gpu.throttle.fraction",
    _OGAUGE,
    "1",
    "Fraction of time since the previous collection with clocks reduced, per reason "
    "(from NVML's throttle-time counters; reason 'any' = share of samples with any "
    "throttling reason active).",
    ("otelgpu.gpu.throttle.reason",),
    source="nvmlDeviceGetFieldValues (throttle time counters)",
)
THROTTLE_TIME = _gpu(
    "otelgpu.gpu.throttle.time",
    _OCOUNTER,
    "s",
    "Time with clocks reduced, per reason, since the driver loaded (NVML counters).",
    ("otelgpu.gpu.throttle.reason",),
    source="nvmlDeviceGetFieldValues (throttle time counters)",
)
XID = _gpu(
    "otelgpu.gpu.xid",
    _OCOUNTER,
    "{event}",
    "XID errors delivered by the NVML event API since the sampler started, per XID code.",
    ("otelgpu.gpu.xid.code",),
    source="nvmlEventSetWait",
)
NVLINK_IO = _gpu(
    "otelgpu.gpu.nvlink.io",
    _OCOUNTER,
    "By",
    "Bytes moved over NVLink, all links (NVML throughput data counters).",
    ("network.io.direction",),
    source="nvmlDeviceGetFieldValues (NVLink throughput)",
)
FAN_SPEED = _gpu(
    "hw.fan.speed_ratio",
    _OGAUGE,
    "1",
    "Fan speed as a fraction of its maximum (the GPU's fan; hw.type stays gpu).",
    semconv=True,
    source="nvmlDeviceGetFanSpeed",
)
PSTATE = _gpu(
    "otelgpu.gpu.pstate",
    _OGAUGE,
    "{pstate}",
    "Performance state (0 = maximum performance, 15 = minimum).",
    source="nvmlDeviceGetPerformanceState",
)

GPU_MEMORY_RESERVED = _gpu(
    "otelgpu.gpu.memory.reserved",
    _OUPDOWN,
    "By",
    "GPU memory reserved by the driver and firmware; not in hw.gpu.memory.usage.",
    source="nvmlDeviceGetMemoryInfo_v2",
)
TEMPERATURE_LIMIT = _gpu(
    "otelgpu.gpu.temperature.limit",
    _OGAUGE,
    "Cel",
    "Temperature at which the GPU slows its clocks (slowdown) or shuts down (shutdown).",
    ("otelgpu.gpu.temperature.limit_type",),
    source="nvmlDeviceGetTemperatureThreshold (read once at discovery)",
)
PCIE_REPLAYS = _gpu(
    "otelgpu.gpu.pcie.replays",
    _OCOUNTER,
    "{replay}",
    "PCIe link-level retransmissions since the driver loaded (a rising count: a degrading link).",
    source="nvmlDeviceGetFieldValues (PCIe replay counter)",
)
REMAPPED_ROWS = _gpu(
    "otelgpu.gpu.memory.remapped_rows",
    _OUPDOWN,
    "{row}",
    "Memory rows remapped for correctable / uncorrectable errors; pending and failure "
    "are 1 while a remap awaits a GPU reset / after a remap failed.",
    ("otelgpu.gpu.remap.state",),
    source="nvmlDeviceGetFieldValues (remapped rows)",
)
GRAPHICS_ACTIVITY = _gpu(
    "otelgpu.gpu.graphics.activity",
    _OGAUGE,
    "1",
    "Fraction of time the graphics/compute engine was active since the previous collection.",
    source="nvmlGpmMetricsGet (GRAPHICS_UTIL), Hopper and newer",
)
SM_ACTIVITY = _gpu(
    "otelgpu.gpu.sm.activity",
    _OGAUGE,
    "1",
    "Fraction of SMs busy since the previous collection; unlike hw.gpu.utilization it "
    "drops when few SMs do work.",
    source="nvmlGpmMetricsGet (SM_UTIL), Hopper and newer",
)
SM_OCCUPANCY = _gpu(
    "otelgpu.gpu.sm.occupancy",
    _OGAUGE,
    "1",
    "Resident warps as a fraction of the SMs' maximum, since the previous collection.",
    source="nvmlGpmMetricsGet (SM_OCCUPANCY), Hopper and newer",
)
TENSOR_ACTIVITY = _gpu(
    "otelgpu.gpu.tensor.activity",
    _OGAUGE,
    "1",
    "Fraction of time the tensor pipes were busy since the previous collection, any pipe "
    "or per kind (hmma: FP16/BF16/TF32, imma: integer, dfma/dmma: FP64).",
    ("otelgpu.gpu.tensor.pipe",),
    source="nvmlGpmMetricsGet (*_TENSOR_UTIL), Hopper and newer",
)
DRAM_ACTIVITY = _gpu(
    "otelgpu.gpu.dram.activity",
    _OGAUGE,
    "1",
    "DRAM bandwidth used as a fraction of the maximum, since the previous collection.",
    source="nvmlGpmMetricsGet (DRAM_BW_UTIL), Hopper and newer",
)
PIPE_ACTIVITY = _gpu(
    "otelgpu.gpu.pipe.activity",
    _OGAUGE,
    "1",
    "Fraction of time the SMs ran non-tensor FP16 / FP32 / FP64 or integer math since the "
    "previous collection.",
    ("otelgpu.gpu.pipe",),
    source="nvmlGpmMetricsGet (FP16/FP32/FP64/INTEGER_UTIL), Hopper and newer",
)

GPU_METRICS: tuple[MetricSpec, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_USAGE,
    GPU_MEMORY_LIMIT,
    GPU_MEMORY_UTILIZATION,
    POWER,
    ENERGY,
    TEMPERATURE,
    GPU_IO,
    ERRORS,
    STATUS,
    MEMORY_CONTROLLER_UTILIZATION,
    MEMORY_WATERMARK,
    CLOCK_SM,
    CLOCK_MEMORY,
    THROTTLE_FRACTION,
    THROTTLE_TIME,
    XID,
    NVLINK_IO,
    FAN_SPEED,
    PSTATE,
    GPU_MEMORY_RESERVED,
    TEMPERATURE_LIMIT,
    PCIE_REPLAYS,
    REMAPPED_ROWS,
    GRAPHICS_ACTIVITY,
    SM_ACTIVITY,
    SM_OCCUPANCY,
    TENSOR_ACTIVITY,
    DRAM_ACTIVITY,
    PIPE_ACTIVITY,
)
"""Per-device GPU metrics (each carries :data:`DEVICE_ATTRIBUTES`)."""

# =========================================================================== sampler

SAMPLER_DROPPED = MetricSpec(
    "otelgpu.sampler.dropped",
    _OCOUNTER,
    "{sample}",
    "Sampling rounds the GPU sampler skipped because NVML was too slow to keep its interval.",
    Area.SAMPLER,
    source="GpuSampler.dropped",
)

SAMPLER_METRICS: tuple[MetricSpec, ...] = (SAMPLER_DROPPED,)
"""The sampler's own health metrics (no device attributes)."""

# =========================================================================== runtime

_STEP_ATTRS: tuple[str, ...] = ()  # plus the attributes passed to step(attributes=...)
_GEN_AI = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "server.address",
    "server.port",
)

TRAIN_STEP_DURATION = MetricSpec(
    "otelgpu.train.step.duration",
    _SKETCH,
    "s",
    "Wall time of one training step.",
    Area.RUNTIME,
    _STEP_ATTRS,
)
TRAIN_SAMPLES = MetricSpec(
    "otelgpu.train.samples", _COUNTER, "{sample}", "Samples processed.", Area.RUNTIME, _STEP_ATTRS
)
TRAIN_TOKENS = MetricSpec(
    "otelgpu.train.tokens", _COUNTER, "{token}", "Tokens processed.", Area.RUNTIME, _STEP_ATTRS
)
TRAIN_STEPS = MetricSpec(
    "otelgpu.train.steps",
    _COUNTER,
    "{step}",
    "Training steps completed.",
    Area.RUNTIME,
    _STEP_ATTRS,
)
REQUEST_DURATION = MetricSpec(
    "gen_ai.server.request.duration",
    _SKETCH,
    "s",
    "Time from request arrival to its end.",
    Area.RUNTIME,
    (*_GEN_AI, "error.type"),
    _DEV,
)
TIME_TO_FIRST_TOKEN = MetricSpec(
    "gen_ai.server.time_to_first_token",
    _SKETCH,
    "s",
    "Time to the first output token.",
    Area.RUNTIME,
    _GEN_AI,
    _DEV,
)
TIME_PER_OUTPUT_TOKEN = MetricSpec(
    "gen_ai.server.time_per_output_token",
    _SKETCH,
    "s",
    "(duration - time to first token) / (output tokens - 1), per successful request.",
    Area.RUNTIME,
    _GEN_AI,
    _DEV,
)
QUEUE_DURATION = MetricSpec(
    "otelgpu.inference.queue.duration",
    _SKETCH,
    "s",
    "Time a request waited before processing.",
    Area.RUNTIME,
    _GEN_AI,
)
REQUESTS = MetricSpec(
    "otelgpu.inference.requests",
    _COUNTER,
    "{request}",
    "Finished requests by outcome (ok, error, timeout).",
    Area.RUNTIME,
    (*_GEN_AI, "otelgpu.request.outcome"),
)
OUTPUT_TOKENS = MetricSpec(
    "otelgpu.inference.tokens",
    _COUNTER,
    "{token}",
    "Tokens by gen_ai.token.type.",
    Area.RUNTIME,
    (*_GEN_AI, "gen_ai.token.type"),
)
GPU_HEALTH_EVENTS = MetricSpec(
    "otelgpu.gpu.health.events",
    _OCOUNTER,
    "{event}",
    "GPU health events (XID, ECC uncorrected, device lost, throttling start) by kind.",
    Area.RUNTIME,
    ("otelgpu.gpu.event", "hw.id"),
)

# MFU and energy per unit of work (otelgpu.gpu_truth.work).
TRAIN_MFU = MetricSpec(
    "otelgpu.train.mfu",
    _SKETCH,
    "1",
    "Model FLOPs utilization of a step: model FLOPs / (duration x peak FLOP/s of its GPUs).",
    Area.RUNTIME,
    _STEP_ATTRS,
)
TRAIN_MFU_MISMATCHES = MetricSpec(
    "otelgpu.train.mfu.mismatches",
    _COUNTER,
    "{step}",
    "Steps whose MFU and GPM tensor activity disagree sharply, by reason.",
    Area.RUNTIME,
    (*_STEP_ATTRS, "otelgpu.train.mfu.mismatch.reason"),
)
TRAIN_STEP_ENERGY = MetricSpec(
    "otelgpu.train.step.energy",
    _SKETCH,
    "J",
    "GPU energy of one training step (energy counter; integrated power without one).",
    Area.RUNTIME,
    _STEP_ATTRS,
)
TRAIN_ENERGY_PER_SAMPLE = MetricSpec(
    "otelgpu.train.energy.per_sample",
    _SKETCH,
    "J/{sample}",
    "GPU energy of a training step per sample.",
    Area.RUNTIME,
    _STEP_ATTRS,
)
TRAIN_ENERGY_PER_TOKEN = MetricSpec(
    "otelgpu.train.energy.per_token",
    _SKETCH,
    "J/{token}",
    "GPU energy of a training step per token.",
    Area.RUNTIME,
    _STEP_ATTRS,
)
REQUEST_ENERGY = MetricSpec(
    "otelgpu.inference.request.energy",
    _SKETCH,
    "J",
    "GPU energy while a request ran (shared with the requests batched alongside it).",
    Area.RUNTIME,
    _GEN_AI,
)
ENERGY_PER_OUTPUT_TOKEN = MetricSpec(
    "otelgpu.inference.energy.per_output_token",
    _SKETCH,
    "J/{token}",
    "GPU energy while a request ran per output token.",
    Area.RUNTIME,
    _GEN_AI,
)

RUNTIME_METRICS: tuple[MetricSpec, ...] = (
    TRAIN_STEP_DURATION,
    TRAIN_SAMPLES,
    TRAIN_TOKENS,
    TRAIN_STEPS,
    REQUEST_DURATION,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    QUEUE_DURATION,
    REQUESTS,
    OUTPUT_TOKENS,
    GPU_HEALTH_EVENTS,
    TRAIN_MFU,
    TRAIN_MFU_MISMATCHES,
    TRAIN_STEP_ENERGY,
    TRAIN_ENERGY_PER_SAMPLE,
    TRAIN_ENERGY_PER_TOKEN,
    REQUEST_ENERGY,
    ENERGY_PER_OUTPUT_TOKEN,
)
"""Step and request metrics (``otelgpu.step()``, ``otelgpu.request()``, the instrumentors)."""

# =========================================================================== internal

INTERNAL_ERRORS = MetricSpec(
    "otelgpu.internal.errors",
    _OCOUNTER,
    "{error}",
    "Errors otelgpu swallowed to protect the application, by place (otelgpu.where).",
    Area.INTERNAL,
    ("otelgpu.where",),
)
INTERNAL_DROPPED = MetricSpec(
    "otelgpu.internal.dropped",
    _OCOUNTER,
    "{item}",
    "Telemetry dropped on purpose, by signal and reason "
    "(queue_full, export_failed, forked_child, shutdown).",
    Area.INTERNAL,
    ("otelgpu.signal", "otelgpu.reason"),
)
INTERNAL_REJECTED = MetricSpec(
    "otelgpu.internal.rejected",
    _OCOUNTER,
    "{value}",
    "Values passed to step(), request() or an instrumentor that were out of range and not "
    "exported, by field and reason (not_a_number, nan, infinite, negative, too_large).",
    Area.INTERNAL,
    ("otelgpu.field", "otelgpu.reason"),
)
INTERNAL_SKETCH_SERIES = MetricSpec(
    "otelgpu.internal.sketch.series",
    _OGAUGE,
    "{series}",
    "Attribute sets held per sketch metric (otelgpu.metric); bounded by max_series.",
    Area.INTERNAL,
    ("otelgpu.metric",),
)

INTERNAL_METRICS: tuple[MetricSpec, ...] = (
    INTERNAL_ERRORS,
    INTERNAL_DROPPED,
    INTERNAL_REJECTED,
    INTERNAL_SKETCH_SERIES,
)
"""otelgpu's own health (exported even where the application owns the meter provider)."""

# =========================================================================== torch

_COMM_OP = "otelgpu.train.comm.op"
_CHECKPOINT_KIND = "otelgpu.train.checkpoint.kind"
_SKIPPED = "otelgpu.train.optimizer.skipped"
_CUDA_DEVICE = "otelgpu.cuda.device"


def _torch(
    name: str, kind: Kind, unit: str, description: str, attributes: tuple[str, ...] = ()
) -> MetricSpec:
    return MetricSpec(name, kind, unit, description, Area.TORCH, attributes)


DATA_WAIT = _torch(
    "otelgpu.train.data.wait.duration",
    _SKETCH,
    "s",
    "Time one step spent waiting for batches (DataLoader.__next__), summed over its micro-batches.",
)
LOADER_STARTUP = _torch(
    "otelgpu.train.dataloader.startup.duration",
    _SKETCH,
    "s",
    "iter(DataLoader) with workers: worker start-up and first prefetch.",
)
COMM_WAIT = _torch(
    "otelgpu.train.comm.wait.duration",
    _SKETCH,
    "s",
    "Host time blocked in one torch.distributed collective, barrier or Work.wait.",
    (_COMM_OP,),
)
COMM_GPU = _torch(
    "otelgpu.train.comm.gpu.duration",
    _SKETCH,
    "s",
    "GPU-side duration of one collective on a CUDA tensor (CUDA events on the current stream).",
    (_COMM_OP,),
)
STEP_GPU = _torch(
    "otelgpu.train.step.gpu.duration",
    _SKETCH,
    "s",
    "GPU time between consecutive step ends (CUDA events; OTELGPU_TORCH_GPU_STEP_TIME=true).",
)
CHECKPOINT_DURATION = _torch(
    "otelgpu.train.checkpoint.duration",
    _SKETCH,
    "s",
    "Blocking time of one checkpoint save (outermost save only).",
    (_CHECKPOINT_KIND,),
)
CHECKPOINT_SIZE = _torch(
    "otelgpu.train.checkpoint.size",
    _SKETCH,
    "By",
    "Bytes written by one checkpoint save, where known.",
    (_CHECKPOINT_KIND,),
)
OPTIMIZER_STEPS = _torch(
    "otelgpu.train.optimizer.steps",
    _COUNTER,
    "{step}",
    "Optimizer updates (all optimizers), including those GradScaler skipped.",
    (_SKIPPED,),
)
MICRO_BATCHES = _torch(
    "otelgpu.train.micro_batches",
    _COUNTER,
    "{batch}",
    "Backward passes (torch.autograd.backward calls).",
)
OOMS = _torch(
    "otelgpu.train.cuda.ooms",
    _COUNTER,
    "{oom}",
    "CUDA out-of-memory errors raised by the caching allocator (also those a retry loop caught).",
    (_CUDA_DEVICE,),
)
ALLOC_RETRIES = _torch(
    "otelgpu.train.cuda.alloc_retries",
    _COUNTER,
    "{retry}",
    "cudaMalloc retries after flushing the allocator cache (a fragmentation slowdown signal).",
    (_CUDA_DEVICE,),
)
MEMORY_ALLOCATED = _torch(
    "otelgpu.train.cuda.memory.allocated",
    _OGAUGE,
    "By",
    "Bytes allocated by tensors at the end of the latest step.",
    (_CUDA_DEVICE,),
)
MEMORY_RESERVED = _torch(
    "otelgpu.train.cuda.memory.reserved",
    _OGAUGE,
    "By",
    "Bytes reserved by the caching allocator at the end of the latest step.",
    (_CUDA_DEVICE,),
)
MEMORY_PEAK = _torch(
    "otelgpu.train.cuda.memory.peak",
    _OGAUGE,
    "By",
    "Peak allocated bytes (since start, or per step with OTELGPU_TORCH_RESET_PEAK=true).",
    (_CUDA_DEVICE,),
)
DATA_WAIT_RATIO = _torch(
    "otelgpu.train.data.wait.ratio",
    _OGAUGE,
    "1",
    "Share of step time spent waiting for data over the last 512 steps.",
)
COMM_WAIT_RATIO = _torch(
    "otelgpu.train.comm.wait.ratio",
    _OGAUGE,
    "1",
    "Share of step time blocked in collectives over the last 512 steps.",
)
STEP_JITTER = _torch(
    "otelgpu.train.step.jitter",
    _OGAUGE,
    "1",
    "p99 / p50 of step duration over the last 512 steps (1 = perfectly steady).",
)
DDP_COMM = _torch(
    "otelgpu.train.ddp.backward.comm.duration",
    _OGAUGE,
    "s",
    "DDP's own average gradient all-reduce time per backward (sampled iterations).",
)
DDP_COMPUTE = _torch(
    "otelgpu.train.ddp.backward.compute.duration",
    _OGAUGE,
    "s",
    "DDP's own average backward compute time (sampled iterations).",
)
DDP_OVERLAP = _torch(
    "otelgpu.train.ddp.backward.overlap.duration",
    _OGAUGE,
    "s",
    "DDP's own average time gradient all-reduce overlapped backward compute.",
)

TORCH_METRICS: tuple[MetricSpec, ...] = (
    DATA_WAIT,
    LOADER_STARTUP,
    COMM_WAIT,
    COMM_GPU,
    STEP_GPU,
    CHECKPOINT_DURATION,
    CHECKPOINT_SIZE,
    OPTIMIZER_STEPS,
    MICRO_BATCHES,
    OOMS,
    ALLOC_RETRIES,
    MEMORY_ALLOCATED,
    MEMORY_RESERVED,
    MEMORY_PEAK,
    DATA_WAIT_RATIO,
    COMM_WAIT_RATIO,
    STEP_JITTER,
    DDP_COMM,
    DDP_COMPUTE,
    DDP_OVERLAP,
)
"""The PyTorch instrumentation's own metrics (steps themselves: :data:`RUNTIME_METRICS`)."""

# =========================================================================== vLLM

_VLLM_BASE = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")
_VLLM_ENGINE = (*_VLLM_BASE, "otelgpu.vllm.engine")


def _vllm(name: str, kind: Kind, unit: str, description: str, source: str,
          attributes: tuple[str, ...] = ()) -> MetricSpec:  # fmt: skip
    return MetricSpec(
        name, kind, unit, description, Area.VLLM, (*_VLLM_ENGINE, *attributes), source=source
    )


INTER_TOKEN_LATENCY = _vllm(
    "otelgpu.vllm.inter_token_latency",
    _SKETCH,
    "s",
    "Time between consecutive engine outputs of one request",
    "IterationStats.inter_token_latencies_iter",
)
PREFILL_TIME = _vllm(
    "otelgpu.vllm.request.prefill_time",
    _SKETCH,
    "s",
    "Time from first scheduled to first token (prompt processing)",
    "FinishedRequestStats.prefill_time",
)
DECODE_TIME = _vllm(
    "otelgpu.vllm.request.decode_time",
    _SKETCH,
    "s",
    "Time from first token to last token",
    "FinishedRequestStats.decode_time",
)
INFERENCE_TIME = _vllm(
    "otelgpu.vllm.request.inference_time",
    _SKETCH,
    "s",
    "Time from first scheduled to last token (prefill + decode, preemptions included)",
    "FinishedRequestStats.inference_time",
)
REQUESTS_FINISHED = _vllm(
    "otelgpu.vllm.requests.finished",
    _OCOUNTER,
    "{request}",
    "Finished requests by otelgpu.vllm.finish_reason (stop, length, abort, error, ...)",
    "FinishedRequestStats.finish_reason",
    ("otelgpu.vllm.finish_reason",),
)
TOKENS = _vllm(
    "otelgpu.vllm.tokens",
    _OCOUNTER,
    "{token}",
    "Prompt (gen_ai.token.type=input) and generated (output) tokens, counted per engine step "
    "as they are processed (otelgpu.inference.tokens counts them when the request ends)",
    "IterationStats.prompt_token_stats.total, IterationStats.num_generation_tokens",
    ("gen_ai.token.type",),
)
PREEMPTIONS = _vllm(
    "otelgpu.vllm.preemptions",
    _OCOUNTER,
    "{preemption}",
    "Requests preempted by the scheduler (KV cache exhausted)",
    "IterationStats.num_preempted_reqs",
)
PREFIX_CACHE_QUERIES = _vllm(
    "otelgpu.vllm.prefix_cache.queries",
    _OCOUNTER,
    "{token}",
    "Prompt tokens looked up in the prefix cache",
    "SchedulerStats.prefix_cache_stats.queries",
)
PREFIX_CACHE_HITS = _vllm(
    "otelgpu.vllm.prefix_cache.hits",
    _OCOUNTER,
    "{token}",
    "Prompt tokens found in the prefix cache",
    "SchedulerStats.prefix_cache_stats.hits",
)
REQUESTS_RUNNING = _vllm(
    "otelgpu.vllm.requests.running",
    _OGAUGE,
    "{request}",
    "Requests in the running batch (the batch size proxy)",
    "SchedulerStats.num_running_reqs",
)
REQUESTS_WAITING = _vllm(
    "otelgpu.vllm.requests.waiting",
    _OGAUGE,
    "{request}",
    "Requests waiting to be scheduled (queue depth, deferred ones included)",
    "SchedulerStats.num_waiting_reqs + num_skipped_waiting_reqs",
)
KV_CACHE_USAGE = _vllm(
    "otelgpu.vllm.kv_cache.usage",
    _OGAUGE,
    "1",
    "Fraction of KV-cache blocks in use, latest value",
    "SchedulerStats.kv_cache_usage",
)
KV_CACHE_USAGE_PEAK = _vllm(
    "otelgpu.vllm.kv_cache.usage.peak",
    _OGAUGE,
    "1",
    "Highest KV-cache usage fraction seen since the previous export (the memory watermark)",
    "SchedulerStats.kv_cache_usage",
)
PREFIX_CACHE_HIT_RATIO = _vllm(
    "otelgpu.vllm.prefix_cache.hit_ratio",
    _OGAUGE,
    "1",
    "Prefix-cache hits / queries (tokens) since the previous export",
    "SchedulerStats.prefix_cache_stats",
)
REQUEST_RATE = _vllm(
    "otelgpu.vllm.request.rate",
    _OGAUGE,
    "{request}/s",
    "Finished requests per second since the previous export (QPS)",
    "FinishedRequestStats",
)
STARTUP_DURATION = _vllm(
    "otelgpu.vllm.engine.startup.duration",
    _OGAUGE,
    "s",
    "Cold start: process start to engine initialized (model load, KV-cache allocation, "
    "compilation and warm-up included)",
    "StatLoggerBase.log_engine_initialized",
)

VLLM_METRICS: tuple[MetricSpec, ...] = (
    INTER_TOKEN_LATENCY,
    PREFILL_TIME,
    DECODE_TIME,
    INFERENCE_TIME,
    REQUESTS_FINISHED,
    TOKENS,
    PREEMPTIONS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    KV_CACHE_USAGE,
    KV_CACHE_USAGE_PEAK,
    PREFIX_CACHE_HIT_RATIO,
    REQUEST_RATE,
    STARTUP_DURATION,
)
"""The vLLM instrumentation's own metrics (its requests also feed :data:`RUNTIME_METRICS`)."""

VLLM_RUNTIME_SOURCES: dict[str, str] = {
    REQUEST_DURATION.name: "FinishedRequestStats.e2e_latency",
    TIME_TO_FIRST_TOKEN.name: (
        "e2e_latency - decode_time (successful requests with >= 1 output token)"
    ),
    TIME_PER_OUTPUT_TOKEN.name: (
        "decode_time / (num_generation_tokens - 1) (= vLLM's mean_time_per_output_token)"
    ),
    QUEUE_DURATION.name: "FinishedRequestStats.queued_time",
    REQUESTS.name: "finish_reason -> otelgpu.request.outcome",
    OUTPUT_TOKENS.name: "num_prompt_tokens (input), num_generation_tokens (output)",
}
"""What vLLM feeds each runtime request metric from (documented in docs/metrics-vllm.md)."""

# =========================================================================== diagnosis


def _diagnosis(
    name: str, kind: Kind, unit: str, description: str, attributes: tuple[str, ...]
) -> MetricSpec:
    return MetricSpec(name, kind, unit, description, Area.DIAGNOSIS, attributes)


PHASE_DURATION = _diagnosis(
    "otelgpu.train.phase.duration",
    _SKETCH,
    "s",
    "Time one training step spent in one phase (the phases sum to the step time).",
    ("otelgpu.train.phase",),
)
RANK_SKEW = _diagnosis(
    "otelgpu.train.rank.skew",
    _OGAUGE,
    "1",
    "This rank's own work per step (step time minus communication wait) above the median "
    "rank's, as a fraction of the median step time (latest exchange window).",
    ("otelgpu.dist.rank",),
)
FINDINGS = _diagnosis(
    "otelgpu.diagnosis.findings",
    _COUNTER,
    "{finding}",
    "Findings of the diagnosis detectors (stragglers, drift, utilization dips, memory creep).",
    ("otelgpu.diagnosis.kind", "otelgpu.diagnosis.cause"),
)

DIAGNOSIS_METRICS: tuple[MetricSpec, ...] = (PHASE_DURATION, RANK_SKEW, FINDINGS)
"""The diagnosis package's metrics (``otelgpu.diagnosis``; documented in docs/diagnosis.md)."""

# =========================================================================== all

ALL: tuple[MetricSpec, ...] = (
    *GPU_METRICS,
    *SAMPLER_METRICS,
    *RUNTIME_METRICS,
    *INTERNAL_METRICS,
    *TORCH_METRICS,
    *VLLM_METRICS,
    *DIAGNOSIS_METRICS,
)
"""Every metric of otelgpu."""

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in ALL}
if len(BY_NAME) != len(ALL):  # pragma: no cover - a duplicate name is a programming error
    raise RuntimeError("otelgpu.metrics.catalog: duplicate metric name")

STEP_SPAN = "otelgpu.train.step"
"""Name of the training-step span."""


def by_area(area: Area) -> tuple[MetricSpec, ...]:
    """The specs of one area, in catalog order."""
    return tuple(m for m in ALL if m.area is area)
