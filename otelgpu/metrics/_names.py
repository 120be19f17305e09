"""Every metric otelgpu exports, defined once: name, instrument, unit, attributes.

Semantic-convention names (``hw.*``, OpenTelemetry semconv v1.37+, Development
status) where a convention exists; otelgpu's own ``otelgpu.*`` names where none
does (clocks, throttling, XIDs, NVLink, fan, P-state, the memory watermark).
Units are UCUM. ``docs/metrics.md`` documents the same table; a test keeps them equal.

Every GPU metric also carries the device attributes ``hw.id`` (UUID), ``hw.name``,
``hw.vendor`` and ``hw.type`` (``gpu``), plus ``hw.parent`` for a MIG instance.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE_ATTRIBUTES = ("hw.id", "hw.name", "hw.vendor", "hw.type")


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name, observable instrument kind, UCUM unit and extra attributes."""

    name: str
    instrument: str  # "gauge" | "counter" | "updowncounter" (all observable)
    unit: str
    description: str
    attributes: tuple[str, ...] = ()  # beyond DEVICE_ATTRIBUTES
    semconv: bool = False  # an OpenTelemetry semantic convention


GPU_UTILIZATION = MetricSpec(
    "hw.gpu.utilization",
    "gauge",
    "1",
    "Fraction of time one or more kernels was executing (NVML utilization / 100).",
    ("hw.gpu.task",),
    semconv=True,
)
GPU_MEMORY_USAGE = MetricSpec(
    "hw.gpu.memory.usage", "updowncounter", "By", "GPU memory used.", semconv=True
)
GPU_MEMORY_LIMIT = MetricSpec(
    "hw.gpu.memory.limit", "updowncounter", "By", "GPU memory size.", semconv=True
)
GPU_MEMORY_UTILIZATION = MetricSpec(
    "hw.gpu.memory.utilization", "gauge", "1", "Fraction of GPU memory used.", semconv=True
)
POWER = MetricSpec("hw.power", "gauge", "W", "Power drawn by the GPU.", semconv=True)
ENERGY = MetricSpec(
    "hw.energy", "counter", "J", "Energy consumed by the GPU since the driver loaded.", semconv=True
)
TEMPERATURE = MetricSpec(
    "hw.temperature", "gauge", "Cel", "GPU temperature.", ("hw.sensor_location",), semconv=True
)
GPU_IO = MetricSpec(
    "hw.gpu.io",
    "counter",
    "By",
    "Bytes moved over PCIe (NVML PCIe byte counters; they may wrap).",
    ("network.io.direction",),
    semconv=True,
)
ERRORS = MetricSpec(
    "hw.errors",
    "counter",
    "{error}",
    "ECC memory errors since the driver loaded (volatile counters).",
    ("error.type",),
    semconv=True,
)
STATUS = MetricSpec(
    "hw.status",
    "updowncounter",
    "1",
    "1 for the device's current state (ok, failed once the GPU is lost), 0 otherwise.",
    ("hw.state",),
    semconv=True,
)
MEMORY_CONTROLLER_UTILIZATION = MetricSpec(
    "otelgpu.gpu.memory_controller.utilization",
    "gauge",
    "1",
    "Fraction of time device memory was being read or written (NVML memory utilization).",
)
MEMORY_WATERMARK = MetricSpec(
    "otelgpu.gpu.memory.watermark",
    "gauge",
    "By",
    "Peak GPU memory used since the previous collection (catches batch peaks between exports).",
)
CLOCK_SM = MetricSpec("otelgpu.gpu.clock.sm", "gauge", "MHz", "SM clock frequency.")
CLOCK_MEMORY = MetricSpec("otelgpu.gpu.clock.memory", "gauge", "MHz", "Memory clock frequency.")
THROTTLE_FRACTION = MetricSpec(
    "otelgpu.gpu.throttle.fraction",
    "gauge",
    "1",
    "Fraction of time since the previous collection with clocks reduced, per reason "
    "(from NVML's throttle-time counters; reason 'any' = share of samples with any "
    "throttling reason active).",
    ("otelgpu.gpu.throttle.reason",),
)
THROTTLE_TIME = MetricSpec(
    "otelgpu.gpu.throttle.time",
    "counter",
    "s",
    "Time with clocks reduced, per reason, since the driver loaded (NVML counters).",
    ("otelgpu.gpu.throttle.reason",),
)
XID = MetricSpec(
    "otelgpu.gpu.xid",
    "counter",
    "{event}",
    "XID errors delivered by the NVML event API since the sampler started, per XID code.",
    ("otelgpu.gpu.xid.code",),
)
NVLINK_IO = MetricSpec(
    "otelgpu.gpu.nvlink.io",
    "counter",
    "By",
    "Bytes moved over NVLink, all links (NVML throughput data counters).",
    ("network.io.direction",),
)
FAN_SPEED = MetricSpec(
    "otelgpu.gpu.fan.speed", "gauge", "1", "Fan speed as a fraction of its maximum."
)
PSTATE = MetricSpec(
    "otelgpu.gpu.pstate", "gauge", "1", "Performance state (0 = maximum performance, 15 = minimum)."
)
SAMPLER_DROPPED = MetricSpec(
    "otelgpu.sampler.dropped",
    "counter",
    "{sample}",
    "Sampling rounds the GPU sampler skipped because NVML was too slow to keep its interval.",
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
)
"""Per-device GPU metrics (each carries DEVICE_ATTRIBUTES)."""

SAMPLER_METRICS: tuple[MetricSpec, ...] = (SAMPLER_DROPPED,)
"""The sampler's own health metrics (no device attributes)."""

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in (*GPU_METRICS, *SAMPLER_METRICS)}
