"""``otelgpu.step()`` and ``otelgpu.request()``: the manual-instrumentation context managers.

Both work with or without ``instrument()`` (without it they only time). They are
thread- and asyncio-safe: the span is made current through OpenTelemetry's
contextvars-based context, and all per-call state lives on the object the ``with``
statement returns. Neither raises into the application; an exception from the ``with``
body is recorded on the span and re-raised untouched. A block of 2 ms or more is finished
(GPU context, attributes, metrics, the span's end at the block's end time) on otelgpu's
deferred thread rather than in the host's exit (``otelgpu.runtime.deferral``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from otelgpu import _runtime
from otelgpu._runtime import Runtime
from otelgpu.otel import host_cadence, host_work
from otelgpu.runtime.records import (
    DEFAULT_OPERATION,
    DEFAULT_PROVIDER,
    RequestRecord,
    StepRecord,
)

# ========================================================================= span scope


_Scope = TypeVar("_Scope", bound="_SpanScope")


class _SpanScope:
    """What ``StepContext`` and ``RequestContext`` share: a span made current for the
    ``with`` block (sync or async), the block's times, and a finish that never raises.

    Subclasses implement :meth:`_start` (the live span) and :meth:`_finish` (record the
    step or request; ``exc`` is what left the block).
    """

    __slots__ = ("_runtime", "_span", "_start_ns", "_token", "end_ns")

    _where = "scope"

    def __init__(self) -> None:
        self.end_ns: int | None = None
        self._runtime: Runtime | None = None
        self._span: trace.Span | None = None
        self._token: object = None
        self._start_ns = 0

    @property
    def duration_s(self) -> float | None:
        """Duration in seconds once the block has ended."""
        return None if self.end_ns is None else (self.end_ns - self._start_ns) / 1e9

    def _start(self, runtime: Runtime) -> trace.Span:
        raise NotImplementedError

    def _exited(self, exc: BaseException | None) -> None:
        """Runs at exit with or without a runtime (e.g. to set the outcome)."""

    def _finish(self, runtime: Runtime, span: trace.Span, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _enter(self) -> None:
        runtime = _runtime.current()
        self._start_ns = time.time_ns()
        if runtime is None:
            return
        try:
            span = self._start(runtime)
            self._token = otel_context.attach(trace.set_span_in_context(span))
            self._span = span
            self._runtime = runtime
        except Exception as exc:  # noqa: BLE001 - hot path
            runtime.report_error(f"{self._where} enter", exc)
            return
        host_work.opened()  # otelgpu's background slices wait for the block's end
        host_cadence.began(self._start_ns)  # ... and keep clear of the next one's start

    def __enter__(self: _Scope) -> _Scope:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    async def __aenter__(self: _Scope) -> _Scope:
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__(*exc_info)  # the block's end: the same as a sync one's

    def _exit(self, exc: BaseException | None) -> None:
        self.end_ns = time.time_ns()
        self._exited(exc)
        runtime, span = self._runtime, self._span
        if runtime is None or span is None:
            return
        self._runtime = self._span = None
        try:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001
            runtime.report_error(f"{self._where} exit", err)
        try:
            self._finish(runtime, span, exc)
        finally:
            host_work.closed()  # after the finish: it is the host's time too


# =============================================================================== step


class StepContext(_SpanScope):
    """``with otelgpu.step(samples=…, tokens=…) as s:`` -- one training step.

    On exit: a span ``otelgpu.train.step`` (step number, duration, samples/tokens and
    their throughput, GPU context of exactly that window, health events as span events),
    the duration into the ``otelgpu.train.step.duration`` sketch, and the counters.
    ``s.samples`` / ``s.tokens`` may be set inside the block (e.g. once the batch is known).
    Counts that are out of range (negative, NaN, infinite, over 2**53) are dropped and
    counted in ``otelgpu.internal.rejected``, never raised. ``flops``: model FLOPs of the
    step (e.g. from ``otelgpu.gpu_truth.flops``), for ``otelgpu.train.mfu``.
    """

    __slots__ = ("attributes", "flops", "samples", "step", "tokens")

    _where = "step"

    def __init__(
        self,
        samples: float | None = None,
        tokens: float | None = None,
        *,
        step: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        flops: float | None = None,
    ) -> None:
        super().__init__()
        self.flops = flops
        self.samples = samples
        self.tokens = tokens
        self.step = step
        self.attributes = attributes

    def _start(self, runtime: Runtime) -> trace.Span:
        if self.step is None:
            self.step = runtime.next_step_number()
        return runtime.start_step_span(StepRecord(self._start_ns, self._start_ns))

    def _finish(self, runtime: Runtime, span: trace.Span, exc: BaseException | None) -> None:
        # steps of 2 ms or more finish on the deferred thread (otelgpu.runtime.deferral)
        runtime.step_finisher.finish(
            span,
            StepRecord(
                self._start_ns,
                self.end_ns or self._start_ns,
                step=self.step or 0,
                samples=self.samples,
                tokens=self.tokens,
                attributes=self.attributes,
                failed=exc,
                flops=self.flops,
            ),
            failed=exc is not None,
        )


step = StepContext
"""A training step (context manager, sync or async): the class itself, so the call and
the ``with`` target share one signature; see :class:`StepContext`."""


# ============================================================================ request


class RequestContext(_SpanScope):
    """``with otelgpu.request(model=…) as r:`` -- one inference request.

    Inside the block: ``r.scheduled()`` (queue ends), ``r.first_token()``, ``r.tokens(n)``
    (output tokens, cumulative), ``r.input_tokens(n)``, ``r.error(kind)`` (``"timeout"``
    makes the outcome ``timeout``; anything else ``error`` with ``error.type=kind``).
    An exception leaving the block sets outcome ``error`` (``timeout`` for TimeoutError).
    On exit: a SERVER span ``{operation} {model}`` with TTFT, time per output token,
    tokens, queue time, outcome and the GPU context; the ``gen_ai.server.*`` sketches.
    ``provider`` is ``gen_ai.provider.name``: name the serving system (``vllm``, ``tgi``...);
    the default is the conventions' fallback ``_OTHER``. ``server_address``/``server_port``
    become ``server.address``/``server.port`` (span and metrics); ``r.response(id=…,
    model=…)`` sets ``gen_ai.response.id`` / ``gen_ai.response.model`` on the span.
    """

    __slots__ = (
        "_error_type",
        "_first_token_ns",
        "_input_tokens",
        "_outcome",
        "_output_tokens",
        "_queue_time_s",
        "_response_id",
        "_response_model",
        "_scheduled_ns",
        "attributes",
        "model",
        "operation",
        "provider",
        "server_address",
        "server_port",
    )

    _where = "request"

    def __init__(
        self,
        model: str | None = None,
        *,
        operation: str = DEFAULT_OPERATION,
        provider: str = DEFAULT_PROVIDER,
        queue_time_s: float | None = None,
        attributes: Mapping[str, Any] | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.server_address = server_address
        self.server_port = server_port
        self._response_id: str | None = None
        self._response_model: str | None = None
        self.operation = operation
        self.provider = provider
        self.attributes = attributes
        self._queue_time_s = queue_time_s
        self._first_token_ns: int | None = None
        self._scheduled_ns: int | None = None
        self._output_tokens = 0
        self._input_tokens: int | None = None
        self._outcome = "ok"
        self._error_type: str | None = None

    # ---------------------------------------------------------------- inside the block
    def scheduled(self) -> None:
        """The request left the queue now (queue time = now - start)."""
        if self._scheduled_ns is None:
            self._scheduled_ns = time.time_ns()

    def first_token(self) -> None:
        """The first output token was produced now (only the first call counts)."""
        if self._first_token_ns is None:
            self._first_token_ns = time.time_ns()

    def tokens(self, n: int = 1) -> None:
        """``n`` more output tokens were produced (a count >= 0; anything else is ignored)."""
        count = self._count(n, "request tokens")
        if count is not None:
            self._output_tokens += count

    def input_tokens(self, n: int) -> None:
        """The prompt had ``n`` tokens (a count >= 0; anything else is ignored)."""
        count = self._count(n, "request input_tokens")
        if count is not None:
            self._input_tokens = count

    def _count(self, n: object, where: str) -> int | None:
        """``n`` as a token count, or ``None`` (reported, never raised: hot path)."""
        try:
            count: int = int(n)  # type: ignore[call-overload]
            if count < 0:
                raise ValueError(f"negative token count {n!r}")
        except Exception as exc:  # noqa: BLE001 - e.g. an object whose __int__ raises
            runtime = self._runtime or _runtime.current()
            if runtime is not None:
                runtime.report_error(where, exc)
            return None
        return count

    def response(self, id: str | None = None, model: str | None = None) -> None:
        """The server's id of the completion and the model that answered (span attributes)."""
        if id is not None:
            self._response_id = str(id)
        if model is not None:
            self._response_model = str(model)

    def error(self, kind: str = "error") -> None:
        """Mark the request failed: ``timeout`` or an error of type ``kind``."""
        self._outcome = "timeout" if kind == "timeout" else "error"
        self._error_type = kind

    @property
    def outcome(self) -> str:
        return self._outcome

    @property
    def output_tokens(self) -> int:
        return self._output_tokens

    @property
    def ttft_s(self) -> float | None:
        ft = self._first_token_ns
        return None if ft is None else (ft - self._start_ns) / 1e9

    # ---------------------------------------------------------------- span scope
    def _record(self, end_ns: int, **outcome: Any) -> RequestRecord:
        """The request as recorded: what names it (model, operation, provider, server),
        as it stands now (the block may change it), and ``outcome``'s fields."""
        return RequestRecord(
            self._start_ns,
            end_ns,
            model=self.model,
            operation=self.operation,
            provider=self.provider,
            server_address=self.server_address,
            server_port=self.server_port,
            **outcome,
        )

    def _start(self, runtime: Runtime) -> trace.Span:
        return runtime.start_request_span(self._record(self._start_ns))

    def _exited(self, exc: BaseException | None) -> None:
        if exc is not None and self._outcome == "ok":
            if isinstance(exc, TimeoutError):
                self._outcome, self._error_type = "timeout", "timeout"
            else:
                self._outcome, self._error_type = "error", type(exc).__qualname__

    def _finish(self, runtime: Runtime, span: trace.Span, exc: BaseException | None) -> None:
        queue_time_s = self._queue_time_s
        if queue_time_s is None and self._scheduled_ns is not None:
            queue_time_s = (self._scheduled_ns - self._start_ns) / 1e9
        # requests of 2 ms or more finish on the deferred thread (otelgpu.runtime.deferral)
        runtime.request_finisher.finish(
            span,
            self._record(
                self.end_ns or self._start_ns,
                first_token_ns=self._first_token_ns,
                output_tokens=self._output_tokens,
                input_tokens=self._input_tokens,
                queue_time_s=queue_time_s,
                outcome=self._outcome,
                error_type=self._error_type,
                attributes=self.attributes,
                exception=exc,
                response_id=self._response_id,
                response_model=self._response_model,
            ),
            failed=exc is not None,
        )


request = RequestContext
"""An inference request (context manager, sync or async): the class itself; see
:class:`RequestContext`."""


__all__ = ["RequestContext", "StepContext", "request", "step"]
