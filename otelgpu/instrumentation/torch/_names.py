"""Attribute, span-attribute and event names of the torch instrumentation.

The torch metrics themselves are rows of ``otelgpu.metrics.catalog`` (``TORCH_METRICS``);
``docs/metrics-torch.md`` documents both, checked by the tests. The step span,
``otelgpu.train.step.duration``, ``otelgpu.train.steps``, ``otelgpu.train.samples`` and
``otelgpu.train.tokens`` belong to the runtime and are recorded through it.
"""

from __future__ import annotations

# Metric attributes.
ATTR_COMM_OP = "otelgpu.train.comm.op"
ATTR_CHECKPOINT_KIND = "otelgpu.train.checkpoint.kind"
ATTR_SKIPPED = "otelgpu.train.optimizer.skipped"
ATTR_DEVICE = "otelgpu.cuda.device"

# Step-span attributes (seconds unless the name says bytes).
SPAN_MICRO_BATCHES = "otelgpu.train.micro_batches"
SPAN_OPTIMIZER_STEPS = "otelgpu.train.optimizer_steps"
SPAN_SKIPPED = "otelgpu.train.step.skipped"
SPAN_STEP_RULE = "otelgpu.train.step.rule"
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
    SPAN_STEP_RULE,
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
