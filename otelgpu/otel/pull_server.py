"""The Prometheus pull endpoint's HTTP server: text formats, or protobuf when negotiated.

:func:`start_pull_server` serves a ``prometheus_client`` registry like
``prometheus_client.start_http_server`` (a daemon thread, one thread per request, no
request logging), with one difference: a ``GET`` whose ``Accept`` header prefers the
delimited protobuf format (``application/vnd.google.protobuf;
proto=io.prometheus.client.MetricFamily; encoding=delimited`` with the highest ``q``
of the types offered, as Prometheus sends it with ``--enable-feature=native-histograms``)
is answered by :func:`otelgpu.otel.prometheus_protobuf.encode`, which adds the
sketches' native histograms. The text and OpenMetrics formats are negotiated as
``prometheus_client`` does and written by :class:`otelgpu.otel.prometheus_text.TextWriter`
(the same bytes, each series' label set cached). ``OPTIONS``, other methods and
``/favicon.ico`` are ``prometheus_client``'s own app, unchanged. Both honour gzip
(``Accept-Encoding``) and ``name[]`` (series selection);
the protobuf answer selects the samples so named in every family, histograms and
summaries whole (``prometheus_client``'s text answer searches only collectors that
describe their names, which otelgpu's do not).
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import CollectorRegistry

from otelgpu.otel import host_work, prometheus_protobuf
from otelgpu.otel.prometheus_text import TextWriter

_PROTOBUF = "application/vnd.google.protobuf"
_MESSAGE = "io.prometheus.client.MetricFamily"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _media(entry: str) -> tuple[str, dict[str, str]]:
    kind, *params = (part.strip() for part in entry.split(";"))
    parsed = {}
    for param in params:
        key, _, value = param.partition("=")
        parsed[key.strip().lower()] = value.strip().strip('"')
    return kind.lower(), parsed


def wants_protobuf(accept: str) -> bool:
    """Whether ``accept`` ranks the delimited ``MetricFamily`` protobuf format first
    (ties go to the earlier entry, as the scraper listed it)."""
    best_q, best_is_protobuf = -1.0, False
    for entry in accept.split(","):
        if not entry.strip():
            continue
        kind, params = _media(entry)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            continue
        is_protobuf = (
            kind == _PROTOBUF
            and params.get("proto") == _MESSAGE
            and params.get("encoding") == "delimited"
        )
        if kind == _PROTOBUF and not is_protobuf:
            continue  # a protobuf flavour we do not write
        if q > best_q:
            best_q, best_is_protobuf = q, is_protobuf
    return best_is_protobuf and best_q > 0


def _gzip_accepted(accept_encoding: str) -> bool:
    for entry in accept_encoding.split(","):
        coding, params = _media(entry)
        if coding == "gzip":
            try:
                return float(params.get("q", "1")) > 0
            except ValueError:
                return False
    return False


def make_app(registry: CollectorRegistry = REGISTRY) -> WsgiApp:
    """The endpoint's WSGI app (see the module docstring)."""
    other_app: WsgiApp = make_wsgi_app(registry)
    writer = TextWriter()

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") == "/favicon.ico":
            return other_app(environ, start_response)
        # A scrape is otelgpu's background work: it hands the GIL back in slices that wait
        # for the host's gaps (otelgpu.otel.slicing).
        with host_work.background():
            params = parse_qs(environ.get("QUERY_STRING", ""))
            if not wants_protobuf(environ.get("HTTP_ACCEPT") or ""):
                return _text(writer, registry, environ, params, start_response)
            output = prometheus_protobuf.encode(registry, params.get("name[]"))
        headers = [("Content-Type", prometheus_protobuf.CONTENT_TYPE)]
        if _gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or ""):
            output = gzip.compress(output)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    return app


def _text(
    writer: TextWriter,
    registry: CollectorRegistry,
    environ: dict[str, Any],
    params: dict[str, list[str]],
    start_response: StartResponse,
) -> Iterable[bytes]:
    """A text or OpenMetrics answer, as ``prometheus_client``'s app gives it."""
    encoder, content_type = writer.encoder(environ.get("HTTP_ACCEPT"))
    selected: Any = registry
    if "name[]" in params:
        selected = registry.restricted_registry(params["name[]"])
    output = encoder(selected)
    headers = [("Content-Type", content_type)]
    if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or ""):
        output = gzip.compress(output)
        headers.append(("Content-Encoding", "gzip"))
    start_response("200 OK", headers)
    return [output]


class _Server(ThreadingMixIn, WSGIServer):
    # Daemon request threads: a stuck scraper never holds the process at exit.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line per scrape on stderr otherwise)."""


def start_pull_server(
    port: int, addr: str, registry: CollectorRegistry = REGISTRY
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``addr:port`` from a daemon thread; raises ``OSError`` when
    the address cannot be bound. Stop it with ``server.shutdown(); server.server_close()``."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(_Server):
        address_family = family  # IPv6 addresses bind too

    server = make_server(
        str(sockaddr[0]), port, make_app(registry), Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(
        target=server.serve_forever, name="otelgpu-prometheus-endpoint", daemon=True
    )
    thread.start()
    return server, thread
