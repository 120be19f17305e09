"""Exporter construction from :class:`~otelgpu._settings.Settings`, and the guarding wrappers.

Every push exporter otelgpu builds is wrapped:

* :class:`GuardedSpanExporter` / :class:`GuardedMetricExporter` drop (and count) exports
  from a forked child -- the child must not send the parent's state again -- and count
  telemetry lost to failed exports (``otelgpu.internal.dropped``), never raising;
* :class:`GuardedMetricExporter` also appends the sketch histograms to every export (the
  Python SDK has no MetricProducer hook): each ``MetricsData`` the reader hands over gains
  one exponential histogram per sketch metric, in otelgpu's scope, cumulative; and for
  the SDK's OTLP exporters it encodes the request in short slices
  (:mod:`otelgpu.otel.metric_encoding`) so the host's threads never wait for all of it.

Standard ``OTEL_EXPORTER_OTLP_*`` variables (signal-specific endpoints, headers,
certificates, compression, timeout) are read by the SDK exporters themselves whenever the
corresponding otelgpu setting is unset.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelgpu._settings import Settings
from otelgpu.otel import metric_encoding
from otelgpu.otel.stats import InternalStats
from otelgpu.version import __version__

SCOPE = InstrumentationScope("otelgpu", __version__)
"""Instrumentation scope of everything otelgpu records itself."""

Temporality = dict[type, AggregationTemporality]


def preferred_temporality(environ: dict[str, str] | None = None) -> Temporality:
    """Temporality per instrument kind, per ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``.

    Same meaning as in the OTLP exporters (``cumulative`` default, ``delta``, ``lowmemory``);
    computed here so the guarding wrapper and the wrapped exporter agree.
    """
    env = os.environ if environ is None else environ
    pref = (
        env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "cumulative").strip().lower()
    )
    c, d = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA
    kinds = (
        Counter,
        UpDownCounter,
        Histogram,
        ObservableCounter,
        ObservableUpDownCounter,
        ObservableGauge,
    )
    out: Temporality = dict.fromkeys(kinds, c)
    if pref == "delta":
        out.update({Counter: d, Histogram: d, ObservableCounter: d})
    elif pref == "lowmemory":
        out.update({Counter: d, Histogram: d})
    return out


def _count_points(metrics_data: MetricsData) -> int:
    return sum(
        len(m.data.data_points)
        for rm in metrics_data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


def append_metrics(metrics_data: MetricsData, extra: Sequence[Metric]) -> MetricsData:
    """``metrics_data`` plus ``extra`` in otelgpu's scope (merged if the scope is present)."""
    if not extra or not metrics_data.resource_metrics:
        return metrics_data
    first, *rest = metrics_data.resource_metrics
    scopes = list(first.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope.name == SCOPE.name:
            scopes[i] = ScopeMetrics(sm.scope, [*sm.metrics, *extra], sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(SCOPE, list(extra), ""))
    return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


class _InFlight:
    """What a guarded exporter is sending right now, so that a shutdown that gives up can
    count it as dropped exactly once (``abandon``), and nothing is sent after that."""

    def __init__(self, stats: InternalStats, signal: str) -> None:
        self._stats = stats
        self._signal = signal
        self._lock = threading.Lock()
        self._items = 0
        self.abandoned = False

    def begin(self, items: int) -> bool:
        """Register an export of ``items``; ``False`` (and counted) after ``abandon``."""
        with self._lock:
            if not self.abandoned:
                self._items += items
                return True
        self._stats.add_dropped(self._signal, "shutdown_timeout", items)
        return False

    def end(self, items: int) -> bool:
        """The export of ``items`` returned; ``False`` if it was already counted."""
        with self._lock:
            self._items -= items
            return not self.abandoned

    @property
    def busy(self) -> bool:
        """Whether an export is being sent now (what :meth:`abandon` would count)."""
        return self._items > 0

    def abandon(self) -> None:
        with self._lock:
            if self.abandoned:
                return
            self.abandoned = True
            items, self._items = self._items, 0
        self._stats.add_dropped(self._signal, "shutdown_timeout", items)


def _stop_inner(inner: Any) -> None:
    """Tell an exporter to stop (aborts its retry waits, closes its channel), off-thread:
    an exporter's ``shutdown`` may itself wait for the export it is stopping."""

    def stop() -> None:
        with contextlib.suppress(Exception):  # best effort while giving up
            inner.shutdown()

    threading.Thread(target=stop, name="otelgpu-exporter-stop", daemon=True).start()


_Inner = TypeVar("_Inner", SpanExporter, MetricExporter)


class _Guard(Generic[_Inner]):
    """What both guarded exporters share: the process that made them (a forked child
    only counts what it would have sent) and the export in flight, which shutdown may
    give up on (:meth:`abandon`)."""

    def _guard(self, inner: _Inner, stats: InternalStats, signal: str) -> None:
        self.inner: _Inner = inner
        self._stats = stats
        self._pid = os.getpid()
        self._in_flight = _InFlight(stats, signal)

    def abandon(self) -> None:
        """Shutdown gave up: count the export in flight as dropped, stop the exporter."""
        if not self._in_flight.abandoned:
            self._in_flight.abandon()
            _stop_inner(self.inner)

    @property
    def exporting(self) -> bool:
        """Whether an export is being sent now (what :meth:`abandon` would count)."""
        return self._in_flight.busy

    def _may_shut_inner(self) -> bool:
        """Not a forked child's copy, nor an exporter already stopped by :meth:`abandon`."""
        return os.getpid() == self._pid and not self._in_flight.abandoned


class GuardedSpanExporter(_Guard[SpanExporter], SpanExporter):
    """Fork guard and failure counting around a span exporter."""

    def __init__(self, inner: SpanExporter, stats: InternalStats) -> None:
        self._guard(inner, stats, "traces")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._guarded(spans, lambda: self.inner.export(spans))

    @property
    def accepts_encoded(self) -> bool:
        """Whether :meth:`export_encoded` sends bytes from ``otelgpu.otel.span_encoding``."""
        return bool(getattr(self.inner, "accepts_encoded", False))

    @property
    def compact_encoding(self) -> bool:
        """Whether the inner exporter's per-span encoding is bytes (``fast_export``)."""
        return bool(getattr(self.inner, "compact_encoding", False))

    @property
    def encode_span(self) -> Any:
        """The inner exporter's per-span encoder (``otelgpu.otel.fast_export``)."""
        return self.inner.encode_span  # type: ignore[attr-defined]

    @property
    def assemble(self) -> Any:
        """The inner exporter's payload builder (``otelgpu.otel.fast_export``)."""
        return self.inner.assemble  # type: ignore[attr-defined]

    def export_encoded(self, spans: Sequence[ReadableSpan], payload: Any) -> SpanExportResult:
        """:meth:`export` of a batch already encoded (by :attr:`assemble`)."""
        return self._guarded(spans, lambda: self.inner.export_encoded(spans, payload))  # type: ignore[attr-defined]

    def _guarded(
        self, spans: Sequence[ReadableSpan], send: Callable[[], SpanExportResult]
    ) -> SpanExportResult:
        if os.getpid() != self._pid:
            self._stats.add_dropped("traces", "forked_child", len(spans))
            return SpanExportResult.SUCCESS
        n = len(spans)
        if not self._in_flight.begin(n):
            return SpanExportResult.FAILURE
        try:
            result = send()
        except Exception as exc:  # noqa: BLE001 - exporters must never raise into us
            self._stats.report_error(f"export traces ({type(self.inner).__name__})", exc)
            result = SpanExportResult.FAILURE
        if self._in_flight.end(n) and result is not SpanExportResult.SUCCESS:
            self._stats.add_dropped("traces", "export_failed", n)
        return result

    def shutdown(self) -> None:
        if self._may_shut_inner():
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class GuardedMetricExporter(_Guard[MetricExporter], MetricExporter):
    """Fork guard, failure counting and sketch histograms around a metric exporter."""

    def __init__(
        self,
        inner: MetricExporter,
        stats: InternalStats,
        *,
        temporality: Temporality,
        sketch_metrics: Callable[[], Sequence[Metric]] | None = None,
    ) -> None:
        super().__init__(preferred_temporality=temporality)
        self._guard(inner, stats, "metrics")
        self._sketch_metrics = sketch_metrics
        self._send = metric_encoding.sliced_sender(inner)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if os.getpid() != self._pid:
            self._stats.add_dropped("metrics", "forked_child", _count_points(metrics_data))
            return MetricExportResult.SUCCESS
        n = 0
        try:
            if self._sketch_metrics is not None:
                metrics_data = append_metrics(metrics_data, self._sketch_metrics())
            n = _count_points(metrics_data)
            if not self._in_flight.begin(n):
                return MetricExportResult.FAILURE
            try:
                if self._send is not None:
                    result = self._send(metrics_data)
                else:
                    result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
            finally:
                counted_here = self._in_flight.end(n)
        except Exception as exc:  # noqa: BLE001 - exporters must never raise into us
            self._stats.report_error(f"export metrics ({type(self.inner).__name__})", exc)
            result = MetricExportResult.FAILURE
            counted_here = not self._in_flight.abandoned
        if counted_here and result is not MetricExportResult.SUCCESS:
            self._stats.add_dropped("metrics", "export_failed", n)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        # The SDK's periodic reader passes what is left of its own deadline as ``timeout``
        # (milliseconds); honour it rather than granting the inner exporter 30 s more.
        timeout = kwargs.get("timeout")
        if isinstance(timeout, int | float) and timeout >= 0:
            timeout_millis = min(timeout_millis, timeout)
        if self._may_shut_inner():
            self.inner.shutdown(timeout_millis=timeout_millis)


# ---------------------------------------------------------------------------- OTLP
def _http_url(base: str, signal: str) -> str:
    return base.rstrip("/") + f"/v1/{signal}"


def _endpoint(settings: Settings, signal: str) -> str | None:
    """The base endpoint to pass, or ``None`` to let the exporter read its variables.

    A signal-specific ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` wins over the generic
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (OTel spec), but not over otelgpu's own setting.
    """
    endpoint = settings.otlp_endpoint
    generic = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    specific = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    if endpoint and specific and endpoint == generic:
        return None
    return endpoint


def _grpc_credentials(settings: Settings) -> Any:
    if not settings.otlp_certificate:
        return None
    import grpc  # type: ignore[import-untyped]

    with open(settings.otlp_certificate, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


def _otlp_options(settings: Settings, signal: str) -> dict[str, Any]:
    """The keyword arguments of the SDK's OTLP exporters of ``signal`` (``traces``,
    ``metrics``) for ``settings``, gRPC or HTTP/protobuf."""
    timeout = settings.otlp_timeout_ms / 1000 if settings.otlp_timeout_ms else None
    headers = dict(settings.otlp_headers) if settings.otlp_headers is not None else None
    endpoint = _endpoint(settings, signal)
    if settings.otlp_protocol == "grpc":
        return {
            "endpoint": endpoint,
            "insecure": settings.otlp_insecure,
            "credentials": _grpc_credentials(settings),
            "headers": headers,
            "timeout": timeout,
        }
    return {
        "endpoint": _http_url(endpoint, signal) if endpoint else None,
        "certificate_file": settings.otlp_certificate,
        "headers": headers,
        "timeout": timeout,
    }


#: Where ``requests`` (the OTLP/HTTP exporters' default transport, ``trust_env``) reads
#: the environment for what urllib3 cannot be told: proxies and ``.netrc`` credentials.
_REQUESTS_ENVIRONMENT = (
    *(n for base in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY") for n in (base, base.lower())),
    "NETRC",
)


def _env(*names: str) -> str | None:
    """The first of ``names`` set (non-empty) in the environment."""
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _requests_ca_bundle() -> str | bool:
    """The CA bundle ``requests`` verifies against with ``verify=True``: its environment
    variables, else certifi's bundle (True: the system's, where certifi is missing)."""
    bundle = _env("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
    if bundle:
        return bundle
    try:
        import certifi

        return str(certifi.where())
    except ImportError:
        return True


def http_transport(settings: Settings, signal: str) -> Any:
    """The OpenTelemetry SDK's own urllib3 transport for an OTLP/HTTP exporter of
    ``signal`` (``traces``, ``metrics``), with the TLS options the SDK would give its
    default transport; None (the SDK's default, ``requests``) where they would behave
    differently or the SDK has no such transport.

    Why: a send through ``requests`` costs ~0.8 ms of Python with the GIL held (~0.35 ms
    through urllib3, measured on this project's VM), in one piece a background thread
    cannot cut -- in a host loop that keeps the GIL, the longest added pause. ``requests``
    is kept where the environment configures what only it reads (a proxy, a CA bundle,
    ``.netrc``), and where a credential provider supplies the SDK a session; certificates
    are verified against the bundle ``requests`` would use."""
    signal_name = signal.upper()
    if _env(*_REQUESTS_ENVIRONMENT) or os.path.exists(os.path.expanduser("~/.netrc")):
        return None
    if _env(
        "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
        f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal_name}_CREDENTIAL_PROVIDER",
    ):
        return None
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
    except ImportError:  # an SDK before pluggable transports
        return None
    # The SDK's own resolution (_common._build_transport), for the same arguments.
    verify: bool | str = (
        settings.otlp_certificate
        or _env(f"OTEL_EXPORTER_OTLP_{signal_name}_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
        or _requests_ca_bundle()
    )
    key = _env(f"OTEL_EXPORTER_OTLP_{signal_name}_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY")
    certificate = _env(
        f"OTEL_EXPORTER_OTLP_{signal_name}_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    )
    cert = (certificate, key) if certificate and key else certificate
    try:
        return Urllib3HTTPTransport(verify=verify, cert=cert)
    except Exception:  # noqa: BLE001 - urllib3 missing or refusing the options: the default
        return None


def _http_exporter(cls: Any, options: dict[str, Any], transport: Any) -> Any:
    """``cls(**options)`` with ``transport`` where the SDK takes one (its ``_transport``
    argument), else as the SDK builds it."""
    if transport is not None:
        try:
            return cls(**options, _transport=transport)
        except TypeError:  # this SDK's exporter takes no transport
            pass
    return cls(**options)


def otlp_span_exporter(settings: Settings) -> SpanExporter:
    """The SDK's OTLP span exporter for ``settings`` (gRPC or HTTP/protobuf)."""
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter(**_otlp_options(settings, "traces"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return _http_exporter(  # type: ignore[no-any-return]
        HttpSpanExporter, _otlp_options(settings, "traces"), http_transport(settings, "traces")
    )


def otlp_metric_exporter(settings: Settings, temporality: Temporality) -> MetricExporter:
    """The SDK's OTLP metric exporter for ``settings`` (gRPC or HTTP/protobuf)."""
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter(
            **_otlp_options(settings, "metrics"), preferred_temporality=temporality
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return _http_exporter(  # type: ignore[no-any-return]
        HttpMetricExporter,
        {**_otlp_options(settings, "metrics"), "preferred_temporality": temporality},
        http_transport(settings, "metrics"),
    )
