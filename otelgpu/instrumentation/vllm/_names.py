"""Every metric and attribute name the vLLM instrumentation emits, defined once.

Semantic-convention names (``gen_ai.server.*``, Development status) where one exists; our own
under ``otelgpu.vllm.*`` otherwise (see docs/metrics-vllm.md, which mirrors this table and is
checked against it by the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class MetricName:
    """One instrument: name, OTel instrument kind, UCUM unit, description, vLLM source."""

    name: str
    kind: str  # "histogram" (sketch -> exponential histogram), "counter", "gauge"
    unit: str
    description: str
    source: str


# --- request metrics recorded through ``Runtime.record_request`` (names owned by
# ``otelgpu.otel.names``, shared with ``otelgpu.request()``), fed from FinishedRequestStats:
RUNTIME_METRICS: Final[tuple[tuple[str, str], ...]] = (
    ("gen_ai.server.request.duration", "FinishedRequestStats.e2e_latency"),
    (
        "gen_ai.server.time_to_first_token",
        "e2e_latency - decode_time (successful requests with >= 1 output token)",
    ),
    (
        "gen_ai.server.time_per_output_token",
        "decode_time / (num_generation_tokens - 1) (= vLLM's mean_time_per_output_token)",
    ),
    ("otelgpu.inference.queue.duration", "FinishedRequestStats.queued_time"),
    ("otelgpu.inference.requests", "finish_reason -> otelgpu.request.outcome"),
    ("otelgpu.inference.tokens", "num_prompt_tokens (input), num_generation_tokens (output)"),
)

# --- latency distributions (QuantileSketch -> OTLP exponential histogram + quantile gauge) ---
INTER_TOKEN_LATENCY: Final = MetricName(
    "otelgpu.vllm.inter_token_latency",
    "histogram",
    "s",
    "Time between consecutive engine outputs of one request",
    "IterationStats.inter_token_latencies_iter",
)
PREFILL_TIME: Final = MetricName(
    "otelgpu.vllm.request.prefill_time",
    "histogram",
    "s",
    "Time from first scheduled to first token (prompt processing)",
    "FinishedRequestStats.prefill_time",
)
DECODE_TIME: Final = MetricName(
    "otelgpu.vllm.request.decode_time",
    "histogram",
    "s",
    "Time from first token to last token",
    "FinishedRequestStats.decode_time",
)
INFERENCE_TIME: Final = MetricName(
    "otelgpu.vllm.request.inference_time",
    "histogram",
    "s",
    "Time from first scheduled to last token (prefill + decode, preemptions included)",
    "FinishedRequestStats.inference_time",
)

# --- counters (monotonic, cumulative) ---
REQUESTS_FINISHED: Final = MetricName(
    "otelgpu.vllm.requests.finished",
    "counter",
    "{request}",
    "Finished requests by otelgpu.vllm.finish_reason (stop, length, abort, error, ...)",
    "FinishedRequestStats.finish_reason",
)
TOKENS: Final = MetricName(
    "otelgpu.vllm.tokens",
    "counter",
    "{token}",
    "Prompt (gen_ai.token.type=input) and generated (output) tokens, counted per engine step "
    "as they are processed (otelgpu.inference.tokens counts them when the request ends)",
    "IterationStats.prompt_token_stats.total, IterationStats.num_generation_tokens",
)
PREEMPTIONS: Final = MetricName(
    "otelgpu.vllm.preemptions",
    "counter",
    "{preemption}",
    "Requests preempted by the scheduler (KV cache exhausted)",
    "IterationStats.num_preempted_reqs",
)
PREFIX_CACHE_QUERIES: Final = MetricName(
    "otelgpu.vllm.prefix_cache.queries",
    "counter",
    "{token}",
    "Prompt tokens looked up in the prefix cache",
    "SchedulerStats.prefix_cache_stats.queries",
)
PREFIX_CACHE_HITS: Final = MetricName(
    "otelgpu.vllm.prefix_cache.hits",
    "counter",
    "{token}",
    "Prompt tokens found in the prefix cache",
    "SchedulerStats.prefix_cache_stats.hits",
)

# --- gauges (last value per engine, or a value over the last export interval) ---
REQUESTS_RUNNING: Final = MetricName(
    "otelgpu.vllm.requests.running",
    "gauge",
    "{request}",
    "Requests in the running batch (the batch size proxy)",
    "SchedulerStats.num_running_reqs",
)
REQUESTS_WAITING: Final = MetricName(
    "otelgpu.vllm.requests.waiting",
    "gauge",
    "{request}",
    "Requests waiting to be scheduled (queue depth, deferred ones included)",
    "SchedulerStats.num_waiting_reqs + num_skipped_waiting_reqs",
)
KV_CACHE_USAGE: Final = MetricName(
    "otelgpu.vllm.kv_cache.usage",
    "gauge",
    "1",
    "Fraction of KV-cache blocks in use, latest value",
    "SchedulerStats.kv_cache_usage",
)
KV_CACHE_USAGE_PEAK: Final = MetricName(
    "otelgpu.vllm.kv_cache.usage.peak",
    "gauge",
    "1",
    "Highest KV-cache usage fraction seen since the previous export (the memory watermark)",
    "SchedulerStats.kv_cache_usage",
)
PREFIX_CACHE_HIT_RATIO: Final = MetricName(
    "otelgpu.vllm.prefix_cache.hit_ratio",
    "gauge",
    "1",
    "Prefix-cache hits / queries (tokens) since the previous export",
    "SchedulerStats.prefix_cache_stats",
)
REQUEST_RATE: Final = MetricName(
    "otelgpu.vllm.request.rate",
    "gauge",
    "{request}/s",
    "Finished requests per second since the previous export (QPS)",
    "FinishedRequestStats",
)
STARTUP_DURATION: Final = MetricName(
    "otelgpu.vllm.engine.startup.duration",
    "gauge",
    "s",
    "Cold start: process start to engine initialized (model load, KV-cache allocation, "
    "compilation and warm-up included)",
    "StatLoggerBase.log_engine_initialized",
)

ALL: Final[tuple[MetricName, ...]] = (
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

# --- attributes ---
ATTR_PROVIDER: Final = "gen_ai.provider.name"
ATTR_MODEL: Final = "gen_ai.request.model"
ATTR_ENGINE: Final = "otelgpu.vllm.engine"
ATTR_FINISH_REASON: Final = "otelgpu.vllm.finish_reason"
ATTR_TOKEN_TYPE: Final = "gen_ai.token.type"

PROVIDER: Final = "vllm"
STARTUP_SPAN_NAME: Final = "vllm.engine.startup"
