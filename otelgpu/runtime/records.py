"""One finished training step or inference request, as the runtime records it.

Times are ``time.time_ns()`` nanoseconds, durations seconds. The recorders check every
caller-supplied count and duration (``otelgpu._values``): an out-of-range value is
dropped and counted, never exported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context

OUTCOMES = ("ok", "error", "timeout")
"""Outcomes of an inference request (attribute ``otelgpu.request.outcome``)."""

DEFAULT_OPERATION = "chat"
"""``gen_ai.operation.name`` of ``otelgpu.request()`` when none is given."""

DEFAULT_PROVIDER = "_OTHER"
"""``gen_ai.provider.name`` of ``otelgpu.request()`` when none is given: the GenAI
conventions' fallback for a value they do not list. Pass ``provider=`` naming the serving
system (``vllm``, ``sglang``, ``tgi``, ``triton``...); the vLLM integration sets ``vllm``."""


@dataclass(slots=True)
class StepRecord:
    """A training step ``[start_ns, end_ns]``.

    Attributes:
        step: the step number (default: the runtime's next one).
        samples, tokens: processed in the step (counters and throughput attributes).
        flops: model FLOPs of the step (``otelgpu.train.mfu``; ``otelgpu.gpu_truth``).
        attributes: added to the span and to every step metric.
        span_attributes: added to the span only.
        devices: GPU UUIDs the GPU context is restricted to (default: every sampled GPU).
        name: span name.
        context: parent context of the span.
        failed: the exception that ended the step, if any (span status ERROR).
        events: span events of the step, ``(name, time ns, attributes)``; a step with
            events is always exported (tail-keeping sampling).
    """

    start_ns: int
    end_ns: int
    step: int | None = None
    samples: float | None = None
    tokens: float | None = None
    attributes: Mapping[str, Any] | None = None
    span_attributes: Mapping[str, Any] | None = None
    devices: Sequence[str] | None = None
    name: str | None = None
    flops: float | None = None
    context: Context | None = None
    failed: BaseException | None = None
    events: Sequence[tuple[str, int, Mapping[str, Any]]] = ()


@dataclass(slots=True)
class RequestRecord:
    """An inference request ``[start_ns, end_ns]``.

    Attributes:
        model: ``gen_ai.request.model``.
        operation: ``gen_ai.operation.name``.
        provider: ``gen_ai.provider.name``.
        first_token_ns: when the first output token was produced.
        output_tokens, input_tokens: token counts.
        queue_time_s: time before processing started.
        outcome: ``ok``, ``error`` or ``timeout`` (anything else counts as ``error``).
        error_type: ``error.type`` of a failed request.
        attributes: added to the span and to every request metric.
        span_attributes: added to the span only.
        devices: GPU UUIDs the GPU context is restricted to (default: every sampled GPU).
        context: parent context of the span.
        exception: recorded on the span.
        response_id: ``gen_ai.response.id`` (the server's id of the completion).
        response_model: ``gen_ai.response.model`` (the model that answered).
        server_address, server_port: ``server.address`` / ``server.port`` of the serving
            endpoint, where known (span and metric attributes).
    """

    start_ns: int
    end_ns: int
    model: str | None = None
    operation: str = DEFAULT_OPERATION
    provider: str = DEFAULT_PROVIDER
    first_token_ns: int | None = None
    output_tokens: int = 0
    input_tokens: int | None = None
    queue_time_s: float | None = None
    outcome: str = "ok"
    error_type: str | None = None
    attributes: Mapping[str, Any] | None = None
    span_attributes: Mapping[str, Any] | None = None
    devices: Sequence[str] | None = None
    context: Context | None = None
    exception: BaseException | None = None
    response_id: str | None = None
    response_model: str | None = None
    server_address: str | None = None
    server_port: int | None = None


__all__ = [
    "DEFAULT_OPERATION",
    "DEFAULT_PROVIDER",
    "OUTCOMES",
    "RequestRecord",
    "StepRecord",
]
