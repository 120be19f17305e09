"""Metric, span-attribute and event names of the torch instrumentation (one table).

``docs/metrics-torch.md`` documents the same table; a test keeps the two in step. The
step span itself, ``otelgpu.train.step.duration``, ``otelgpu.train.steps``,
``otelgpu.train.samples`` and ``otelgpu.train.tokens`` belong to the runtime
(``otelgpu.otel.names``) and are recorded through ``Runtime.finish_step``.
"""

from __future__ import annotations

from typing import NamedTuple


class TorchMetric(NamedTuple):
    name: str
    kind: str  # "sketch" (exponential histogram + quantile gauges) | "counter" | "gauge"
    unit: str
    description: str
    attributes: tuple[str, ...] = ()


# Metric attributes.
ATTR_COMM_OP = "otelgpu.train.comm.op"
ATTR_CHECKPOINT_KIND = "otelgpu.train.checkpoint.kind"
ATTR_SKIPPED = "otelgpu.train.optimizer.skipped"
ATTR_DEVICE = "otelgpu.cuda.device"

DATA_WAIT = TorchMetric(
    "otelgpu.train.data.wait.duration",
    "sketch",
    "s",
    "Time one step spent waiting for batches (DataLoader.__next__), summed over its micro-batches.",
)
LOADER_STARTUP = TorchMetric(
    "otelgpu.train.dataloader.startup.duration",
    "sketch",
    "s",
    "iter(DataLoader) with workers: worker start-up and first prefetch.",
)
COMM_WAIT = TorchMetric(
    "otelgpu.train.comm.wait.duration",
    "sketch",
    "s",
    "Host time blocked in one torch.distributed collective, barrier or Work.wait.",
    (ATTR_COMM_OP,),
)
COMM_GPU = TorchMetric(
    "otelgpu.train.comm.gpu.duration",
    "sketch",
    "s",
    "GPU-side duration of one collective on a CUDA tensor (CUDA events on the current stream).",
    (ATTR_COMM_OP,),
)
STEP_GPU = TorchMetric(
    "otelgpu.train.step.gpu.duration",
    "sketch",
    "s",
    "GPU time between consecutive step ends (CUDA events; OTELGPU_TORCH_GPU_STEP_TIME=true).",
)
CHECKPOINT_DURATION = TorchMetric(
    "otelgpu.train.checkpoint.duration",
    "sketch",
    "s",
    "Blocking time of one checkpoint save (outermost save only).",
    (ATTR_CHECKPOINT_KIND,),
)
CHECKPOINT_SIZE = TorchMetric(
    "otelgpu.train.checkpoint.size",
    "sketch",
    "By",
    "Bytes written by one checkpoint save, where known.",
    (ATTR_CHECKPOINT_KIND,),
)
OPTIMIZER_STEPS = TorchMetric(
    "otelgpu.train.optimizer.steps",
    "counter",
    "{step}",
    "Optimizer updates (all optimizers), including those GradScaler skipped.",
    (ATTR_SKIPPED,),
)
MICRO_BATCHES = TorchMetric(
    "otelgpu.train.micro_batches",
    "counter",
    "{batch}",
    "Backward passes (torch.autograd.backward calls).",
)
OOMS = TorchMetric(
    "otelgpu.train.cuda.ooms",
    "counter",
    "{oom}",
    "CUDA out-of-memory errors raised by the caching allocator (also those a retry loop caught).",
    (ATTR_DEVICE,),
)
ALLOC_RETRIES = TorchMetric(
    "otelgpu.train.cuda.alloc_retries",
    "counter",
    "{retry}",
    "cudaMalloc retries after flushing the allocator cache (a fragmentation slowdown signal).",
    (ATTR_DEVICE,),
)
MEMORY_ALLOCATED = TorchMetric(
    "otelgpu.train.cuda.memory.allocated",
    "gauge",
    "By",
    "Bytes allocated by tensors at the end of the latest step.",
    (ATTR_DEVICE,),
)
MEMORY_RESERVED = TorchMetric(
    "otelgpu.train.cuda.memory.reserved",
    "gauge",
    "By",
    "Bytes reserved by the caching allocator at the end of the latest step.",
    (ATTR_DEVICE,),
)
MEMORY_PEAK = TorchMetric(
    "otelgpu.train.cuda.memory.peak",
    "gauge",
    "By",
    "Peak allocated bytes (since start, or per step with OTELGPU_TORCH_RESET_PEAK=true).",
    (ATTR_DEVICE,),
)
DATA_WAIT_RATIO = TorchMetric(
    "otelgpu.train.data.wait.ratio",
    "gauge",
    "1",
    "Share of step time spent waiting for data over the last 512 steps.",
)
COMM_WAIT_RATIO = TorchMetric(
    "otelgpu.train.comm.wait.ratio",
    "gauge",
    "1",
    "Share of step time blocked in collectives over the last 512 steps.",
)
STEP_JITTER = TorchMetric(
    "otelgpu.train.step.jitter",
    "gauge",
    "1",
    "p99 / p50 of step duration over the last 512 steps (1 = perfectly steady).",
)
DDP_COMM = TorchMetric(
    "otelgpu.train.ddp.backward.comm.duration",
    "gauge",
    "s",
    "DDP's own average gradient all-reduce time per backward (sampled iterations).",
)
DDP_COMPUTE = TorchMetric(
    "otelgpu.train.ddp.backward.compute.duration",
    "gauge",
    "s",
    "DDP's own average backward compute time (sampled iterations).",
)
DDP_OVERLAP = TorchMetric(
    "otelgpu.train.ddp.backward.overlap.duration",
    "gauge",
    "s",
    "DDP's own average time gradient all-reduce overlapped backward compute.",
)

TORCH_METRICS: tuple[TorchMetric, ...] = (
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

# Step-span attributes (seconds unless the name says bytes).
SPAN_MICRO_BATCHES = "otelgpu.train.micro_batches"
SPAN_OPTIMIZER_STEPS = "otelgpu.train.optimizer_steps"
SPAN_SKIPPED = "otelgpu.train.step.skipped"
SPAN_DATA_WAIT = "otelgpu.train.data.wait"
SPAN_COMM_WAIT = "otelgpu.train.comm.wait"
SPAN_COMPUTE = "otelgpu.train.compute"
SPAN_COMM_GPU = "otelgpu.train.comm.gpu"
SPAN_STEP_GPU = "otelgpu.train.step.gpu"
SPAN_CHECKPOINT = "otelgpu.train.checkpoint"
SPAN_LOADER_STARTUP = "otelgpu.train.dataloader.startup"
SPAN_OPTIMIZER = "otelgpu.train.optimizer.duration"
SPAN_MEM_ALLOCATED = "otelgpu.train.cuda.memory.allocated"
SPAN_MEM_RESERVED = "otelgpu.train.cuda.memory.reserved"
SPAN_MEM_PEAK = "otelgpu.train.cuda.memory.peak"

SPAN_ATTRIBUTES: tuple[str, ...] = (
    SPAN_MICRO_BATCHES,
    SPAN_OPTIMIZER_STEPS,
    SPAN_SKIPPED,
    SPAN_DATA_WAIT,
    SPAN_COMM_WAIT,
    SPAN_COMPUTE,
    SPAN_COMM_GPU,
    SPAN_STEP_GPU,
    SPAN_CHECKPOINT,
    SPAN_LOADER_STARTUP,
    SPAN_OPTIMIZER,
    SPAN_MEM_ALLOCATED,
    SPAN_MEM_RESERVED,
    SPAN_MEM_PEAK,
)

EVENT_OOM = "otelgpu.train.cuda.oom"
"""Span event on the step in which the allocator ran out of memory."""
