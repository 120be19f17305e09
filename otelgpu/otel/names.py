"""Names, units and kinds of the metrics the pipeline records (steps, requests, internals).

Defined once here; ``docs/metrics.md`` documents the same table (a test keeps them in step).
Semantic-convention names where they exist (``gen_ai.server.*``), ``otelgpu.*`` otherwise.
Sketch histograms are exported as OTLP exponential histograms plus a ``<name>.quantile``
gauge (attribute ``quantile``).
"""

from __future__ import annotations

from typing import NamedTuple


class MetricName(NamedTuple):
    name: str
    kind: str  # "sketch" | "counter" | "observable_counter" | "observable_gauge"
    unit: str
    description: str


TRAIN_STEP_DURATION = MetricName(
    "otelgpu.train.step.duration", "sketch", "s", "Wall time of one training step."
)
TRAIN_SAMPLES = MetricName("otelgpu.train.samples", "counter", "{sample}", "Samples processed.")
TRAIN_TOKENS = MetricName("otelgpu.train.tokens", "counter", "{token}", "Tokens processed.")
TRAIN_STEPS = MetricName("otelgpu.train.steps", "counter", "{step}", "Training steps completed.")

REQUEST_DURATION = MetricName(
    "gen_ai.server.request.duration", "sketch", "s", "Time from request arrival to its end."
)
TIME_TO_FIRST_TOKEN = MetricName(
    "gen_ai.server.time_to_first_token", "sketch", "s", "Time to the first output token."
)
TIME_PER_OUTPUT_TOKEN = MetricName(
    "gen_ai.server.time_per_output_token",
    "sketch",
    "s",
    "(duration - time to first token) / (output tokens - 1), per successful request.",
)
QUEUE_DURATION = MetricName(
    "otelgpu.inference.queue.duration", "sketch", "s", "Time a request waited before processing."
)
REQUESTS = MetricName(
    "otelgpu.inference.requests",
    "counter",
    "{request}",
    "Finished requests by outcome (ok, error, timeout).",
)
OUTPUT_TOKENS = MetricName(
    "otelgpu.inference.tokens", "counter", "{token}", "Tokens by gen_ai.token.type."
)

GPU_HEALTH_EVENTS = MetricName(
    "otelgpu.gpu.health.events",
    "observable_counter",
    "{event}",
    "GPU health events (XID, ECC uncorrected, device lost, throttling start) by kind.",
)
INTERNAL_ERRORS = MetricName(
    "otelgpu.internal.errors",
    "observable_counter",
    "{error}",
    "Errors otelgpu swallowed to protect the application, by place (otelgpu.where).",
)
INTERNAL_DROPPED = MetricName(
    "otelgpu.internal.dropped",
    "observable_counter",
    "{item}",
    "Telemetry dropped on purpose, by signal and reason "
    "(queue_full, export_failed, forked_child, shutdown).",
)
INTERNAL_SKETCH_SERIES = MetricName(
    "otelgpu.internal.sketch.series",
    "observable_gauge",
    "{series}",
    "Attribute sets held per sketch metric (otelgpu.metric); bounded by max_series.",
)

ALL: tuple[MetricName, ...] = (
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
    INTERNAL_ERRORS,
    INTERNAL_DROPPED,
    INTERNAL_SKETCH_SERIES,
)

STEP_SPAN = "otelgpu.train.step"
"""Name of the training-step span."""
