"""End to end over the wire: the SDK's real OTLP exporters to a real receiver.

Both transports (gRPC, HTTP/protobuf) to the in-process receiver, and through a real
collector (rotel). Checks: spans and their attributes, metric names and units as
documented, and exponential histograms whose buckets are exactly the sketch's.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from fixtures.otel import sketch_spec
from fixtures.otlp_receiver import (
    Endpoints,
    OtlpReceiver,
    attributes,
)

import otelgpu
from otelgpu import _runtime
from otelgpu.metrics import catalog as names
from otelgpu.sketch import QuantileSketch

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

VALUES = [random.Random(7).lognormvariate(-4.0, 0.6) for _ in range(2000)]


def _exercise() -> None:
    for i in range(5):
        with otelgpu.step(samples=32, tokens=4096, attributes={"phase": "train"}):
            pass
        assert i >= 0
    with otelgpu.request(model="llama-3-8b") as r:
        r.scheduled()
        r.first_token()
        r.tokens(16)
    with otelgpu.request(model="llama-3-8b") as r:
        r.error("timeout")
    runtime = _runtime.current()
    assert runtime is not None
    hist = runtime.instrument(sketch_spec("otelgpu.test.latency", "s", "test values"))
    for v in VALUES:
        hist.record(v, {"route": "a"})


def _check_histogram(metric: Any) -> None:
    expected = QuantileSketch(relative_accuracy=0.01)
    for v in VALUES:
        expected.add(v)
    dp_expected = expected.to_data_point(0, 1)
    assert metric.WhichOneof("data") == "exponential_histogram"
    eh = metric.exponential_histogram
    assert eh.aggregation_temporality == 2  # cumulative
    (dp,) = eh.data_points
    assert attributes(dp.attributes) == {"route": "a"}
    assert dp.count == len(VALUES) == dp_expected.count
    assert dp.scale == dp_expected.scale
    assert dp.positive.offset == dp_expected.positive.offset
    assert list(dp.positive.bucket_counts) == list(dp_expected.positive.bucket_counts)
    assert dp.zero_count == 0
    assert dp.sum == pytest.approx(sum(VALUES))
    assert dp.min == min(VALUES)
    assert dp.max == max(VALUES)
    assert dp.start_time_unix_nano > 0 and dp.time_unix_nano >= dp.start_time_unix_nano


def _export_to(target: Endpoints, protocol: str, service_name: str) -> None:
    """Instrument with OTLP over ``protocol`` to ``target``, exercise, shut down (flushes)."""
    endpoint = target.grpc_endpoint if protocol == "grpc" else target.http_endpoint
    handle = otelgpu.instrument(
        otlp_endpoint=endpoint,
        otlp_protocol=protocol,
        metric_export_interval_ms=3_600_000,
        service_name=service_name,
    )
    _exercise()
    handle.shutdown()


def _check(receiver: OtlpReceiver, transport: str | None = None) -> None:
    spans = [s for _, _, s in receiver.spans(transport)]
    steps = [s for s in spans if s.name == names.STEP_SPAN]
    assert [attributes(s.attributes)["otelgpu.train.step"] for s in steps] == [1, 2, 3, 4, 5]
    step_attrs = attributes(steps[0].attributes)
    assert step_attrs["otelgpu.train.samples"] == 32
    assert step_attrs["otelgpu.train.tokens"] == 4096
    assert step_attrs["phase"] == "train"
    assert step_attrs["otelgpu.train.samples_per_second"] > 0
    requests = [s for s in spans if s.name == "chat llama-3-8b"]
    assert len(requests) == 2
    ok, timeout = (attributes(s.attributes) for s in requests)
    assert ok["otelgpu.request.outcome"] == "ok"
    assert ok["gen_ai.usage.output_tokens"] == 16
    assert ok["otelgpu.request.time_to_first_token"] >= 0
    assert ok["otelgpu.request.time_per_output_token"] >= 0
    assert "otelgpu.request.queue_time" in ok
    assert timeout["otelgpu.request.outcome"] == "timeout"
    assert timeout["error.type"] == "timeout"
    assert requests[1].status.code == 2  # STATUS_CODE_ERROR
    assert requests[0].kind == 2  # SPAN_KIND_SERVER

    received = {m.name: m for _, scope, m in receiver.metrics(transport) if scope == "otelgpu"}
    documented = {m.name: m for m in names.ALL}
    for name in (
        names.TRAIN_STEP_DURATION.name,
        names.REQUEST_DURATION.name,
        names.TIME_TO_FIRST_TOKEN.name,
        names.TIME_PER_OUTPUT_TOKEN.name,
        names.QUEUE_DURATION.name,
        names.TRAIN_STEPS.name,
        names.TRAIN_SAMPLES.name,
        names.REQUESTS.name,
    ):
        assert received[name].unit == documented[name].unit, name
    assert received[names.TRAIN_STEP_DURATION.name].exponential_histogram.data_points[0].count == 5
    # TTFT only for successful responses (semconv): one of two requests.
    assert received[names.TIME_TO_FIRST_TOKEN.name].exponential_histogram.data_points[0].count == 1
    durations = received[names.REQUEST_DURATION.name].exponential_histogram.data_points
    assert sorted(attributes(d.attributes).get("error.type", "") for d in durations) == [
        "",
        "timeout",
    ]
    quantiles = received[names.TRAIN_STEP_DURATION.name + ".quantile"]
    assert sorted(attributes(p.attributes)["quantile"] for p in quantiles.gauge.data_points) == [
        0.5,
        0.95,
        0.99,
    ]
    _check_histogram(received["otelgpu.test.latency"])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_pipeline_otlp_to_receiver(otlp_receiver: OtlpReceiver, protocol: str) -> None:
    _export_to(otlp_receiver, protocol, "wire-test")
    transport = "grpc" if protocol == "grpc" else "http"
    _check(otlp_receiver, transport)
    resource, _, _ = otlp_receiver.spans()[0]
    assert resource["service.name"] == "wire-test"
    assert resource["process.pid"] > 0


@pytest.mark.backend
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_pipeline_otlp_through_rotel(rotel: Any, protocol: str) -> None:
    _export_to(rotel, protocol, "rotel-test")
    downstream: OtlpReceiver = rotel.downstream

    def arrived() -> bool:
        got = {m.name for _, _, m in downstream.metrics()}
        spans = downstream.spans()
        return "otelgpu.test.latency" in got and len(spans) >= 7

    assert downstream.wait_for(arrived, timeout=15), rotel.output()
    _check(downstream)


def test_pipeline_otlp_headers_and_signal_endpoint(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Signal-specific OTEL_* endpoints win over the generic one (OTel spec); headers come
    # from OTELGPU_OTLP_HEADERS (percent-decoded).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for signal in ("traces", "metrics"):
        monkeypatch.setenv(
            f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT",
            f"{otlp_receiver.http_endpoint}/v1/{signal}",
        )
    monkeypatch.setenv("OTELGPU_OTLP_HEADERS", "x-team=ml,authorization=Bearer%20t0ken")
    handle = otelgpu.instrument(
        otlp_protocol="http/protobuf", metric_export_interval_ms=3_600_000, gpu=False
    )
    with otelgpu.step(samples=1):
        pass
    handle.shutdown()
    assert [s.name for _, _, s in otlp_receiver.spans()] == [names.STEP_SPAN]
    assert otlp_receiver.last_metric(names.TRAIN_STEPS.name) is not None
    for sent in otlp_receiver.http_headers:
        headers = {k.lower(): v for k, v in sent.items()}
        assert headers["x-team"] == "ml"
        assert headers["authorization"] == "Bearer t0ken"


def test_pipeline_otlp_http_uses_the_sdks_urllib3_transport_unless_requests_is_configured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # A send through requests is ~0.8 ms of Python with the GIL held, in one piece (the
    # longest pause a busy host sees from OTLP/HTTP); the SDK's own urllib3 transport does
    # the same in ~0.35 ms. requests stays where the environment configures what only it
    # reads: a proxy, .netrc credentials. The other HTTP tests send through urllib3.
    from opentelemetry.exporter.http.transport._requests import RequestsHTTPTransport
    from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport

    from otelgpu._settings import Settings
    from otelgpu.otel import exporters

    for name in (*exporters._REQUESTS_ENVIRONMENT, "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    settings = Settings(otlp_protocol="http/protobuf", otlp_endpoint="http://127.0.0.1:9")

    def transport(signal: str = "traces") -> Any:
        exporter: Any = (
            exporters.otlp_span_exporter(settings)
            if signal == "traces"
            else exporters.otlp_metric_exporter(settings, exporters.preferred_temporality({}))
        )
        try:
            return exporter._client._transport
        finally:
            exporter.shutdown()

    assert isinstance(transport("traces"), Urllib3HTTPTransport)
    assert isinstance(transport("metrics"), Urllib3HTTPTransport)
    # the CA bundle requests would verify against: its variable, else certifi's
    bundle = tmp_path / "ca.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert transport()._pool.connection_pool_kw["ca_certs"] == str(bundle)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", str(tmp_path / "otel.pem"))
    assert transport()._pool.connection_pool_kw["ca_certs"] == str(tmp_path / "otel.pem")
    for name, value in (("HTTPS_PROXY", "http://proxy:3128"), ("NETRC", str(tmp_path / "n"))):
        monkeypatch.setenv(name, value)
        assert isinstance(transport(), RequestsHTTPTransport)
        monkeypatch.delenv(name)
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login a password b\n")
    assert isinstance(transport(), RequestsHTTPTransport)
