"""The Prometheus pull endpoint of one process: its port, its HTTP server, its sketches.

:func:`start` binds the endpoint (``prometheus_host``, :func:`prometheus_port`) and
returns the OpenTelemetry reader to add to the meter provider (the HTTP server is
:mod:`otelgpu.otel.pull_server`: text formats, protobuf with native histograms when the
scraper asks); a port already in use leaves the process without an endpoint (one warning,
counted) instead of failing ``instrument()``. :func:`register_sketch_collector` adds the
sketch histograms (``otelgpu.otel.prometheus``) to the default registry the server serves.

Thread-safety: called at ``instrument()``/``shutdown()`` time, under the API lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import Metric, MetricReader

from otelgpu._settings import Settings
from otelgpu.otel.stats import InternalStats

__all__ = ["prometheus_port", "register_sketch_collector", "start", "unregister"]


def prometheus_port(settings: Settings, environ: Mapping[str, str] | None = None) -> int:
    """The port this process's pull endpoint asks for.

    Rule (documented in docs/configuration.md): ``prometheus_port + LOCAL_RANK`` when
    ``prometheus_rank_offset`` is on (default), ``LOCAL_RANK`` is set (torchrun, DeepSpeed,
    Accelerate set it on every rank of a node) and the base port is not 0 (0 picks a free
    port anyway); otherwise ``prometheus_port``.
    """
    env = os.environ if environ is None else environ
    base = settings.prometheus_port
    rank = env.get("LOCAL_RANK", "").strip()
    if settings.prometheus_rank_offset and base and rank.isdigit():
        return min(base + int(rank), 65535)
    return base


def start(
    settings: Settings,
    stats: InternalStats,
    extra_metrics: Callable[[], Sequence[Metric]] | None = None,
) -> tuple[MetricReader, Any, tuple[str, int]] | None:
    """The pull endpoint's reader, server and address; ``None`` when its port is taken.

    A port in use is a fact of the node (another rank, another exporter), not a mistake
    in the configuration: the process goes on without a pull endpoint (one warning,
    counted in ``otelgpu.internal.errors``) rather than crash ``instrument()`` on every
    rank after the first. An address that cannot be bound at all is a configuration error.
    ``extra_metrics`` are added to every collection (``otelgpu.otel.prometheus.PullReader``).
    """
    try:
        from otelgpu.otel.prometheus import PullReader
        from otelgpu.otel.pull_server import start_pull_server
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        from otelgpu.errors import ConfigurationError

        raise ConfigurationError(
            "exporters",
            "prometheus",
            "an installed opentelemetry-exporter-prometheus (pip install 'otelgpu[prometheus]')",
        ) from exc
    port = prometheus_port(settings)
    try:
        server, _thread = start_pull_server(port, settings.prometheus_host)
    except OSError as exc:  # port in use, address not local, permission denied ...
        from otelgpu.errors import ConfigurationError

        if exc.errno == errno.EADDRINUSE:
            stats.report_error(
                f"prometheus endpoint {settings.prometheus_host}:{port} (port in use; "
                "no pull endpoint in this process -- see prometheus_rank_offset)",
                exc,
            )
            return None

        raise ConfigurationError(
            "prometheus_port",
            settings.prometheus_port,
            f"a port that can be bound on {settings.prometheus_host} ({exc.strerror or exc}; "
            "0 picks a free one; or change prometheus_host)",
        ) from exc
    reader = PullReader(extra_metrics, stats)
    host, port = server.server_address[:2]
    return reader, server, (str(host), int(port))


def register_sketch_collector(sketch_metrics: Callable[[], Sequence[Metric]], stats: Any) -> Any:
    """Put the sketch histograms on the pull endpoint (``otelgpu.otel.prometheus``)."""
    from prometheus_client import REGISTRY

    from otelgpu.otel.prometheus import SketchCollector

    collector = SketchCollector(sketch_metrics, stats)
    REGISTRY.register(collector)
    return collector


def unregister(collector: Any) -> None:
    """Takes a collector off the pull endpoint (gone already: nothing)."""
    from prometheus_client import REGISTRY

    with contextlib.suppress(KeyError):  # already gone
        REGISTRY.unregister(collector)
