"""Attach to the application's tracer/meter providers, or build otelgpu's own.

Rules (setting ``attach``):

* providers passed explicitly (``instrument(tracer_provider=…, meter_provider=…)``, or by
  ``opentelemetry-instrument`` to the instrumentor) are used as they are;
* ``attach=auto`` (default): a global provider the application already installed (e.g.
  under ``opentelemetry-instrument``) is used; otherwise otelgpu builds an SDK provider
  with its exporters and installs it globally;
* ``attach=never``: otelgpu always builds its own and installs it globally only if no
  global provider exists.

otelgpu never shuts down a provider it did not build. When it attaches to someone
else's meter provider it cannot add to that provider's exporters, so the sketch
histograms travel through a small private meter provider with otelgpu's exporters
(its quantile gauges still go to the application's meter). The Prometheus pull endpoint
is started by ``pull_endpoint``.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    Metric,
    MetricExporter,
    MetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace import sampling as samplers
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from otelgpu._settings import Settings
from otelgpu.otel import exporters as ex
from otelgpu.otel import pull_endpoint, slicing
from otelgpu.otel.fast_export import EncodedSpanExporter
from otelgpu.otel.metric_reader import ForkAwareMetricReader
from otelgpu.otel.processor import BoundedBatchSpanProcessor
from otelgpu.otel.recording import (
    RecordingFile,
    RecordingMetricExporter,
    RecordingSpanExporter,
    recording_directory,
)
from otelgpu.otel.stats import InternalStats
from otelgpu.otel.tail_sampling import StepSpanSampler

if TYPE_CHECKING:
    from otelgpu.metrics.direct import DirectMetrics

_logger = logging.getLogger("otelgpu")
_announced = False

#: Providers otelgpu built, with the pid that built them (-1 once shut down). Attaching to
#: one of them is wrong in a forked child (its exporters drop everything there) and after
#: ``shutdown()`` (it is dead): ``instrument()`` then builds new ones.
_built: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _usable(provider: Any) -> Any:
    """``provider`` unless otelgpu built it in another process or already shut it down."""
    if provider is None:
        return None
    try:
        pid = _built.get(provider)
    except TypeError:
        return provider
    return None if pid is not None and pid != os.getpid() else provider


def make_sampler(settings: Settings) -> samplers.Sampler:
    """The trace sampler named by ``traces_sampler`` / ``traces_sampler_arg``."""
    ratio = 1.0 if settings.traces_sampler_arg is None else settings.traces_sampler_arg
    name = settings.traces_sampler
    base: samplers.Sampler
    if name.endswith("always_on"):
        base = samplers.ALWAYS_ON
    elif name.endswith("always_off"):
        base = samplers.ALWAYS_OFF
    else:
        base = samplers.TraceIdRatioBased(ratio)
    return samplers.ParentBased(base) if name.startswith("parentbased_") else base


def global_tracer_provider() -> trace.TracerProvider | None:
    """The application's global tracer provider, or ``None`` if none was installed."""
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def global_meter_provider() -> metrics.MeterProvider | None:
    """The application's global meter provider, or ``None`` if none was installed."""
    provider = metrics.get_meter_provider()
    # The API's placeholder is a private proxy class; recognise it by name, not by import.
    return None if type(provider).__name__.startswith("_Proxy") else provider


def recording_path(settings: Settings, resource: Resource) -> Path:
    """Where this process records: one file per process (ranks never share a file)."""
    raw = str(resource.attributes.get("service.name", "otelgpu"))
    service = re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_") or "otelgpu"
    stamp = time.strftime("%Y%m%dT%H%M%S")
    # a random part: a name nobody can guess (and plant a file or link at) in advance
    token = secrets.token_hex(4)
    name = f"{service}-{socket.gethostname()}-{os.getpid()}-{stamp}-{token}.otlp.jsonl"
    directory = recording_directory(Path(settings.recording_dir).expanduser())
    return (directory / name).resolve()


@dataclass
class Pipeline:
    """The providers otelgpu uses and what it owns of them."""

    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider
    resource: Resource
    owns_tracer_provider: bool = False
    owns_meter_provider: bool = False
    #: Meter provider carrying the sketch histograms when attached to the application's.
    sketch_meter_provider: MeterProvider | None = None
    #: Where otelgpu's own observable metrics go as data points (``None`` when attached
    #: to the application's meter provider: they are SDK instruments there).
    direct_metrics: DirectMetrics | None = None
    recording: RecordingFile | None = None
    prometheus_server: Any = None
    prometheus_address: tuple[str, int] | None = None
    #: The sketch histograms' collector on the default Prometheus registry.
    prometheus_collector: Any = None
    exporter_names: tuple[str, ...] = ()
    stats: InternalStats | None = None
    #: Bound of :meth:`shutdown` in seconds (setting ``shutdown_timeout_ms``).
    shutdown_timeout_s: float = 3.0
    span_processors: list[BoundedBatchSpanProcessor] = field(default_factory=list)
    #: otelgpu's periodic metric readers (the pull endpoint's excepted).
    metric_readers: list[ForkAwareMetricReader] = field(default_factory=list)
    #: The tail-keeping sampler of step spans shared by :attr:`span_processors` (``None``
    #: without them): the step recorder decides with it before building a span.
    step_sampler: StepSpanSampler | None = None
    guarded_exporters: list[ex.GuardedSpanExporter | ex.GuardedMetricExporter] = field(
        default_factory=list
    )
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def internal_meter_provider(self) -> metrics.MeterProvider:
        """Where otelgpu's own bookkeeping (``otelgpu.internal.*``) goes."""
        return self.sketch_meter_provider or self.meter_provider

    def force_flush(self, timeout_millis: int = 10_000) -> None:
        for provider in (self.tracer_provider, self.meter_provider, self.sketch_meter_provider):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop what otelgpu built (never the application's providers).

        Bounded by ``shutdown_timeout_s`` whatever the collector does (refuses, accepts
        and never answers, answers slowly): the providers are shut down on a daemon
        thread; when time is up, what is still queued or in flight is counted in
        ``otelgpu.internal.dropped`` (reason ``shutdown_timeout``), the exporters are
        told to stop, and the thread is left behind (it holds no lock the application
        needs). A final metric collection still running then is reported (its export,
        if it comes, is counted). Meanwhile otelgpu's threads do not pace themselves
        (:func:`otelgpu.otel.slicing.draining`), and the OpenTelemetry exporters' own retry
        warnings and tracebacks are held back; one warning line says what could not be
        delivered.
        """
        stats = self.stats
        lost_before = stats.dropped() if stats is not None else {}
        timeout_s = max(0.0, self.shutdown_timeout_s)
        deadline = time.monotonic() + timeout_s
        quiet = QuietExporterLogs()
        quiet.install()
        # One thread per provider: the spans' final export and the metrics' final
        # collection run side by side, so each gets the whole budget (and a metric
        # collection stuck behind a hung span export is still counted when time is up).
        workers = [
            threading.Thread(
                target=self._shutdown_provider,
                args=(provider, deadline),
                name="otelgpu-shutdown",
                daemon=True,
            )
            for provider in self._owned()
        ]
        # The host waits for this flush: no GIL hand-backs until the deadline (then the
        # workers left behind are paced again).
        with slicing.draining():
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(max(0.0, deadline - time.monotonic()))
        finished = not any(worker.is_alive() for worker in workers)
        # The SDK's reader stops waiting for its final collection at the deadline and
        # returns (and a provider reached after the deadline shuts no reader down): the
        # collection goes on, to exporters already shut down or abandoned now.
        # An export in flight is counted by the exporter's abandon(); a collection that
        # has not reached its exporter yet can only be reported.
        running = [reader for reader in self.metric_readers if reader.running]
        collecting = any(not reader.exporting for reader in running)
        if not finished or running:
            self._abandon()
            for reader in running:
                reader.stop()
        else:
            quiet.remove()  # nothing of ours runs any more: give the loggers back
        if self.prometheus_server is not None:
            self.prometheus_server.shutdown()
            self.prometheus_server.server_close()
        if self.prometheus_collector is not None:
            pull_endpoint.unregister(self.prometheus_collector)
        if self.recording is not None:
            self.recording.close()
        if stats is not None:
            _warn_lost(lost_before, stats.dropped(), timeout_s, finished, quiet.held, collecting)

    def _owned(self) -> list[Any]:
        owned: list[Any] = []
        if self.owns_tracer_provider:
            owned.append(self.tracer_provider)
        if self.owns_meter_provider:
            owned.append(self.meter_provider)
        if self.sketch_meter_provider is not None:
            owned.append(self.sketch_meter_provider)
        return owned

    @staticmethod
    def _shutdown_provider(provider: Any, deadline: float) -> None:
        if provider in _built:
            _built[provider] = -1
        _shutdown_quietly(provider, deadline)

    def _abandon(self) -> None:
        """Time is up: count what is queued or in flight and tell the exporters to stop."""
        for processor in self.span_processors:
            processor.abandon()
        for guarded in self.guarded_exporters:
            guarded.abandon()


#: Loggers of the OpenTelemetry exporters and readers that log every failed attempt
#: (retry warnings, tracebacks) -- dozens of lines at exit with an unreachable collector.
_NOISY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.sdk.metrics._internal.export",
    "opentelemetry.sdk.trace.export",
)


class QuietExporterLogs(logging.Filter):
    """Holds back the OpenTelemetry exporters' log records during shutdown (counted in
    ``held``); otelgpu says what was lost in one line instead."""

    def __init__(self) -> None:
        super().__init__("otelgpu.quiet")
        self.held = 0
        self._loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]

    def filter(self, record: logging.LogRecord) -> bool:
        self.held += 1
        return False

    def install(self) -> None:
        for logger in self._loggers:
            logger.addFilter(self)

    def remove(self) -> None:
        for logger in self._loggers:
            logger.removeFilter(self)


def _warn_lost(
    before: dict[tuple[str, str], int],
    after: dict[tuple[str, str], int],
    timeout_s: float,
    finished: bool,
    held: int,
    collecting: bool = False,
) -> None:
    """One warning line for telemetry lost during shutdown (nothing when none was);
    ``collecting``: the final metric collection had not finished when time ran out."""
    lost: dict[str, int] = {}
    for (signal, reason), n in after.items():
        delta = n - before.get((signal, reason), 0)
        if delta > 0 and reason != "forked_child":
            lost[signal] = lost.get(signal, 0) + delta
    if lost:
        what = ", ".join(
            f"{n} {'spans' if s == 'traces' else 'metric points' if s == 'metrics' else s}"
            for s, n in sorted(lost.items())
        )
        _logger.warning(
            "otelgpu: shutdown %s: %s not delivered (collector unreachable, failing or slow, "
            "or shutdown_timeout_ms too short; counted in otelgpu.internal.dropped%s)",
            f"gave up after {timeout_s:g} s" if not finished else "finished",
            what,
            f"; {held} exporter log records suppressed" if held else "",
        )
    if collecting:
        _logger.warning(
            "otelgpu: shutdown gave up after %g s with the final metric collection unfinished: "
            "metrics recorded since the last export were not delivered (raise "
            "OTELGPU_SHUTDOWN_TIMEOUT_MS, or lower the metrics' cardinality)",
            timeout_s,
        )


def _shutdown_quietly(provider: Any, deadline: float) -> None:
    try:
        if isinstance(provider, MeterProvider):
            left_ms = max(0.0, deadline - time.monotonic()) * 1000
            provider.shutdown(timeout_millis=left_ms)
        else:
            provider.shutdown()
    except Exception as exc:  # noqa: BLE001 - shutdown goes on
        # Past the deadline the SDK refuses to start a reader's shutdown ("deadline
        # already exceeded"): expected, and the shutdown warning says what was lost.
        late = time.monotonic() >= deadline
        _logger.log(
            logging.DEBUG if late else logging.WARNING,
            "otelgpu: error shutting down %r: %r",
            provider,
            exc,
        )


def signal_exporters(settings: Settings, signal: str) -> tuple[str, ...]:
    """The exporters of ``signal`` (``traces`` or ``metrics``): ``exporters`` unless the
    signal's own setting (``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``) is ``none``."""
    per_signal = settings.traces_exporter if signal == "traces" else settings.metrics_exporter
    return () if per_signal == "none" else settings.exporters


def _span_exporters(settings: Settings, recording: RecordingFile | None) -> list[SpanExporter]:
    out: list[SpanExporter] = []
    for name in signal_exporters(settings, "traces"):
        # OTLP and the recording take spans encoded by otelgpu (fast_export): same SDK
        # transport and settings, a faster encoder that yields the GIL between spans.
        if name == "otlp":
            out.append(EncodedSpanExporter(ex.otlp_span_exporter(settings)))
        elif name == "console":
            out.append(ConsoleSpanExporter())
        elif name == "recording" and recording is not None:
            out.append(EncodedSpanExporter(RecordingSpanExporter(recording)))
    return out


def _metric_exporters(
    settings: Settings, recording: RecordingFile | None, temporality: ex.Temporality
) -> list[MetricExporter]:
    out: list[MetricExporter] = []
    for name in signal_exporters(settings, "metrics"):
        if name == "otlp":
            out.append(ex.otlp_metric_exporter(settings, temporality))
        elif name == "console":
            out.append(ConsoleMetricExporter(preferred_temporality=temporality))
        elif name == "recording" and recording is not None:
            out.append(RecordingMetricExporter(recording, preferred_temporality=temporality))
    return out


def build_pipeline(
    settings: Settings,
    resource: Resource,
    *,
    stats: InternalStats,
    sketch_metrics: Callable[[], Sequence[Metric]],
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    direct_metrics: DirectMetrics | None = None,
) -> Pipeline:
    """Resolve providers and build otelgpu's exporters (see the module docstring).

    All or nothing: if any part fails (a Prometheus port in use, an exporter that cannot
    be built), what was already built is shut down and nothing was installed globally --
    a failed ``instrument()`` leaves no thread, no open file and no global provider behind
    (the OpenTelemetry globals can be set only once, so a half-built pipeline installed
    there would outlive the failure and be attached to by the next ``instrument()``).

    ``direct_metrics`` reach every reader of a meter provider otelgpu builds (each reader
    its own ``DirectReader``); attached to an application's provider they are not used
    (``Pipeline.direct_metrics`` is then ``None``: its views must see SDK instruments).
    """
    auto = settings.attach == "auto"
    tracer_given = tracer_provider or (_usable(global_tracer_provider()) if auto else None)
    meter_given = meter_provider or (_usable(global_meter_provider()) if auto else None)

    built: list[Any] = []  # what to shut down if a later step fails
    pipeline_kwargs: dict[str, Any] = {}
    recording = None
    processors: list[BoundedBatchSpanProcessor] = []
    guarded: list[ex.GuardedSpanExporter | ex.GuardedMetricExporter] = []
    periodic: list[ForkAwareMetricReader] = []
    metric_names = signal_exporters(settings, "metrics")
    direct = direct_metrics if meter_given is None else None
    try:
        prometheus = None
        if meter_given is None and "prometheus" in metric_names:
            # First: the step most likely to fail for reasons outside the program.
            prometheus = pull_endpoint.start(
                settings, stats, direct.reader().collect if direct is not None else None
            )
            if prometheus is not None:
                built.append(prometheus[1])
                pipeline_kwargs.update(
                    prometheus_server=prometheus[1],
                    prometheus_address=prometheus[2],
                    prometheus_collector=pull_endpoint.register_sketch_collector(
                        sketch_metrics, stats
                    ),
                )
                built.append(pipeline_kwargs["prometheus_collector"])
        if "recording" in signal_exporters(settings, "traces") + metric_names:
            recording = RecordingFile(
                recording_path(settings, resource),
                max_bytes=settings.recording_max_bytes,
                backups=settings.recording_backups,
                dir_max_bytes=settings.recording_dir_max_bytes,
            )
            built.append(recording)
        temporality = ex.preferred_temporality()

        # ---- traces
        if tracer_given is not None:
            tp: trace.TracerProvider = tracer_given
            owns_tp = False
        else:
            sdk_tp = TracerProvider(
                resource=resource,
                sampler=make_sampler(settings),
                shutdown_on_exit=False,
                span_limits=SpanLimits(
                    max_attribute_length=settings.attribute_value_length_limit,
                    max_span_attribute_length=settings.attribute_value_length_limit,
                ),
            )
            built.append(sdk_tp)
            step_sampler = StepSpanSampler(settings.step_spans_per_second)
            for exporter in _span_exporters(settings, recording):
                guarded_span = ex.GuardedSpanExporter(exporter, stats)
                processor = BoundedBatchSpanProcessor(
                    guarded_span,
                    stats=stats,
                    max_queue_size=settings.span_queue_size,
                    max_export_batch_size=settings.span_export_batch_size,
                    schedule_delay_s=settings.span_schedule_delay_ms / 1000,
                    shutdown_timeout_s=settings.shutdown_timeout_ms / 1000,
                    step_sampler=step_sampler,
                )
                sdk_tp.add_span_processor(processor)
                guarded.append(guarded_span)
                processors.append(processor)
            tp, owns_tp = sdk_tp, True

        # ---- metrics
        def readers() -> list[MetricReader]:
            out: list[MetricReader] = []
            for exporter in _metric_exporters(settings, recording, temporality):
                extra = sketch_metrics
                if direct is not None:
                    extra = _joined(direct.reader(temporality).collect, sketch_metrics)
                guarded_metrics = ex.GuardedMetricExporter(
                    exporter, stats, temporality=temporality, sketch_metrics=extra
                )
                guarded.append(guarded_metrics)
                periodic.append(
                    ForkAwareMetricReader(
                        guarded_metrics,
                        export_interval_millis=settings.metric_export_interval_ms,
                    )
                )
                out.append(periodic[-1])
            return out

        if meter_given is not None:
            mp: metrics.MeterProvider = meter_given
            owns_mp = False
            push_readers = readers()
            sketch_mp = (
                MeterProvider(
                    resource=resource, metric_readers=push_readers, shutdown_on_exit=False
                )
                if push_readers
                else None
            )
        else:
            all_readers = readers()
            if prometheus is not None:
                all_readers.append(prometheus[0])
            sdk_mp = MeterProvider(
                resource=resource, metric_readers=all_readers, shutdown_on_exit=False
            )
            mp, owns_mp, sketch_mp = sdk_mp, True, None
    except BaseException:
        for item in reversed(built):
            _discard(item)
        raise

    # ---- install: only once everything above succeeded
    if recording is not None:
        _announce(recording.path)
    if owns_tp:
        _built[tp] = os.getpid()
        if global_tracer_provider() is None:
            trace.set_tracer_provider(tp)
    if owns_mp:
        _built[mp] = os.getpid()
        if global_meter_provider() is None:
            metrics.set_meter_provider(mp)

    return Pipeline(
        tracer_provider=tp,
        meter_provider=mp,
        resource=resource,
        owns_tracer_provider=owns_tp,
        owns_meter_provider=owns_mp,
        sketch_meter_provider=sketch_mp,
        direct_metrics=direct,
        recording=recording,
        exporter_names=settings.exporters,
        stats=stats,
        shutdown_timeout_s=settings.shutdown_timeout_ms / 1000,
        span_processors=processors,
        metric_readers=periodic,
        step_sampler=processors[0].step_sampler if processors else None,
        guarded_exporters=guarded,
        **pipeline_kwargs,
    )


def _joined(
    first: Callable[[], Sequence[Metric]], second: Callable[[], Sequence[Metric]]
) -> Callable[[], Sequence[Metric]]:
    """One producer of both producers' metrics (a collection's extra metrics)."""
    return lambda: [*first(), *second()]


def _discard(item: Any) -> None:
    """Undo one part of a pipeline whose construction failed (never raises)."""
    try:
        if type(item).__name__ == "SketchCollector":
            pull_endpoint.unregister(item)
        elif isinstance(item, RecordingFile):
            item.close()
            if item.lines_written == 0 and item.path.exists() and item.path.stat().st_size == 0:
                item.path.unlink()
        elif isinstance(item, TracerProvider):
            item.shutdown()
        else:  # the Prometheus HTTP server
            item.shutdown()
            item.server_close()
    except Exception as exc:  # noqa: BLE001 - cleaning up after a failure
        _logger.debug("otelgpu: cleanup after a failed instrument(): %r", exc)


def _announce(path: Path) -> None:
    """Say once per process where the recording goes."""
    global _announced
    if _announced:
        return
    _announced = True
    _logger.warning(
        "otelgpu: no OTLP endpoint configured; recording telemetry to %s "
        "(set OTEL_EXPORTER_OTLP_ENDPOINT to export, `otelgpu report %s` to read it)",
        path,
        path,
    )
