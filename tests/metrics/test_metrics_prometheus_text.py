"""The pull endpoint's text and OpenMetrics writer (``otelgpu.otel.prometheus_text``):
byte for byte what ``prometheus_client`` writes, checked against its own writers.

Compared on a registry of every family type with awkward names, labels, documentation,
timestamps and exemplars, in every name escaping; on the real families of an
``instrument()`` with 8 simulated GPUs; and over HTTP (negotiation as
``prometheus_client`` does it, ``name[]``, gzip). Also: a writer that disagrees with the
installed ``prometheus_client`` is caught on the first scrape and not used again, and the
prefix cache stays bounded.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures.processes import free_port
from fixtures.pull import instrument_pull_only, scrape, tiny_request
from opentelemetry.sdk.metrics.export import NumberDataPoint
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as om
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

import otelgpu
from otelgpu import sim
from otelgpu.otel import host_work, prometheus_text, slicing
from otelgpu.otel.prometheus_text import TextWriter
from otelgpu.runtime.records import StepRecord

ESCAPINGS = ("underscores", "allow-utf-8", "dots", "values")

#: Prometheus 3's default Accept header (scrape_protocols): OpenMetrics first.
PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=underscores;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


class _Static:
    """A collector of fixed families."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> list[Any]:
        return self._families


def awkward_families() -> list[Any]:
    """Every family type; names and labels that need escaping; odd values."""
    odd = 'back\\slash "quoted" new\nline ünïcode'
    counter = CounterMetricFamily(
        "jobs.done", "Jobs done.\nSecond line \\ with backslash", labels=["k.dot", "kind"]
    )
    counter.add_metric(["a", odd], 3.0, created=1700000000.25)
    counter.add_metric(["b", ""], 1e21, timestamp=1700000001.5)
    counter.add_sample(
        "jobs.done_total",
        {"k.dot": "c", "kind": "x"},
        7,
        exemplar=Exemplar({"trace_id": "abc"}, 0.5, 1700000002.0),
    )
    gauge = GaugeMetricFamily("temp_celsius", "Temperature", labels=["gpu", "1bad"], unit="celsius")
    for i, value in enumerate(
        [0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), 1234567.0, 1e-7]
    ):
        gauge.add_metric([str(i), odd], value)
    histogram = HistogramMetricFamily("lat_seconds", "Latency", labels=["route"], unit="seconds")
    histogram.add_metric(["/x"], [("0.1", 1), ("1.0", 4), ("+Inf", 5)], 2.5)
    summary = SummaryMetricFamily("size", "Sizes", count_value=3, sum_value=9.0, labels=None)
    info = InfoMetricFamily("build", "Build", value={"version": "1.2", "commit": 'a"b'})
    stateset = StateSetMetricFamily("mode", "Mode", value={"train": True, "eval": False})
    gaugehistogram = GaugeHistogramMetricFamily(
        "queue", "Queue", buckets=[("1.0", 2), ("+Inf", 3)], gsum_value=4.0
    )
    unknown = UnknownMetricFamily("mystery:thing", "Unknown", value=42)
    empty = GaugeMetricFamily("no_samples", "")
    return [counter, gauge, histogram, summary, info, stateset, gaugehistogram, unknown, empty]


def _registry(families: list[Any]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static(families))  # type: ignore[arg-type]
    return registry


@pytest.mark.parametrize("escaping", ESCAPINGS)
def test_metrics_text_writer_equals_prometheus_client_on_every_family_type(escaping: str) -> None:
    families = awkward_families()
    registry = _registry(families)
    writer = TextWriter()
    for _ in range(2):  # the second time from the prefix cache
        assert writer.write(families, "text", escaping) == generate_latest(
            registry, escaping=escaping
        )
        assert writer.write(families, "openmetrics", escaping) == om.generate_latest(
            registry, escaping=escaping
        )


@contextlib.contextmanager
def _eight_gpu_endpoint(port: int = 0) -> Iterator[Any]:
    """A real pull endpoint with 8 simulated GPUs after 50 steps and 50 requests: the
    ``instrument()`` handle (shut down, and the simulator off, on exit)."""
    sim.activate("healthy-8xh100", clock="wall")
    handle = otelgpu.instrument(
        exporters="prometheus",
        prometheus_port=port,
        frameworks="none",
        metric_export_interval_ms=600_000,
    )
    try:
        # every GPU discovered and sampled (a loaded machine may take longer than the
        # start-up wait), so each step and request has its GPU context
        runtime = handle.runtime
        assert runtime is not None and runtime.sampler is not None
        sampler = runtime.sampler
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            len(sampler.devices) == 8
            and all(sampler.latest(d.uuid) is not None for d in sampler.devices)
        ):
            time.sleep(0.02)
        time.sleep(0.1)
        for _ in range(50):
            with otelgpu.step(samples=32):
                pass
            with otelgpu.request(model="m") as r:
                r.first_token()
                r.tokens(8)
        yield handle
    finally:
        handle.shutdown()
        sim.deactivate()


@pytest.fixture
def gpu_families() -> Iterator[list[Any]]:
    """The families of a real endpoint with 8 simulated GPUs, steps and requests."""
    from prometheus_client import REGISTRY

    with _eight_gpu_endpoint():
        yield list(REGISTRY.collect())


def test_metrics_text_writer_equals_prometheus_client_on_otelgpu_families(
    gpu_families: list[Any],
) -> None:
    registry = _registry(gpu_families)
    writer = TextWriter()
    text = writer.write(gpu_families)
    assert text == generate_latest(registry)
    assert text.count(b'hw_id="GPU-') >= 8  # the per-GPU series are in there
    assert writer.write(gpu_families, "openmetrics") == om.generate_latest(registry)


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "text/plain",
        "text/plain;version=0.0.4",
        "text/plain;version=1.0.0;escaping=allow-utf-8",
        "application/openmetrics-text",
        "application/openmetrics-text;version=1.0.0;escaping=dots",
        PROMETHEUS_3_ACCEPT,
    ],
)
def test_metrics_text_writer_negotiates_as_prometheus_client(
    accept: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    families = awkward_families()
    registry = _registry(families)
    encoder, content_type = TextWriter().encoder(accept)
    their_encoder, their_type = choose_encoder(accept or "")
    assert content_type == their_type
    with caplog.at_level(logging.WARNING, logger="otelgpu"):
        assert encoder(registry) == their_encoder(registry)
    # the first answer's check (prometheus_client's answer, written family by family)
    # agreed: the writer keeps writing it
    assert not any("differs from prometheus_client" in r.getMessage() for r in caplog.records)


def test_metrics_text_writer_leaves_openmetrics_2_to_prometheus_client() -> None:
    encoder, content_type = TextWriter().encoder("application/openmetrics-text;version=2.0.0")
    their_encoder, their_type = choose_encoder("application/openmetrics-text;version=2.0.0")
    assert content_type == their_type
    assert isinstance(encoder, functools.partial) and isinstance(their_encoder, functools.partial)
    assert encoder.func is their_encoder.func is om.generate_latest
    assert encoder.keywords == their_encoder.keywords


class _Disagreeing(TextWriter):
    """A writer whose label sets are wrong: what another prometheus_client version might
    make of ours."""

    @staticmethod
    def _build_prefix(kind: str, escaping: str, name: str, labels: dict[str, str]) -> str:
        return name + "{wrong}"


def test_metrics_text_writer_that_differs_is_caught_on_first_scrape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = _registry(awkward_families())
    writer = _Disagreeing()
    encoder, _ = writer.encoder("text/plain")
    with caplog.at_level(logging.WARNING, logger="otelgpu"):
        first = encoder(registry)
        second = encoder(registry)
    assert first == second == generate_latest(registry)
    assert sum("differs from prometheus_client" in r.getMessage() for r in caplog.records) == 1


def _many_series() -> list[Any]:
    """Families of 10 series each (pieces for the first scrape's check), one with
    ``_created`` samples, which the text format gathers at its family's end."""
    gauge = GaugeMetricFamily("gpu_temp", "Temperature", labels=["gpu", "uuid"])
    created = CounterMetricFamily("gpu_errors", "Errors", labels=["gpu"])
    for i in range(10):
        gauge.add_metric([str(i), f"GPU-{i:08x}"], 30.0 + i)
        created.add_metric([str(i)], float(i), created=1700000000.0 + i)
    return [gauge, created]


@pytest.mark.parametrize(
    ("accept", "kind"), [("text/plain;version=0.0.4", "text"), (PROMETHEUS_3_ACCEPT, "openmetrics")]
)
def test_metrics_text_writer_check_writes_theirs_in_pieces(
    accept: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first scrape's check writes prometheus_client's answer a few samples at a time
    # (a GPU family of 8 GPUs' series was one 1.8 ms stretch of their Python), and gives
    # the same verdict and bytes as their whole answer -- also where the pieces cannot
    # give their bytes (``_created`` samples): then it asks for the whole answer again.
    ticks: list[int] = []
    monkeypatch.setattr(slicing, "tick", lambda: ticks.append(1))
    families = [*_many_series(), *awkward_families()]
    registry = _registry(families)
    writer = TextWriter()
    encoder, _ = writer.encoder(accept)
    their, _ = choose_encoder(accept)
    with monkeypatch.context() as patch:
        checked: list[bytes] = []
        pieced = prometheus_text._theirs_in_slices

        def spy(*args: Any) -> bytes:
            checked.append(pieced(*args))
            return checked[-1]

        patch.setattr(prometheus_text, "_theirs_in_slices", spy)
        with host_work.background():  # as on otelgpu's endpoint
            first = encoder(registry)
        after_check = len(ticks)
    assert first == encoder(registry) == their(registry)
    assert writer._verified == {(kind, "underscores"): True}
    # a chance to hand the GIL back per piece of the check (3 for each family of 10
    # series) and per family written
    per_piece = prometheus_text.THEIR_SAMPLES_PER_TICK
    pieces = sum(max(1, -(-len(f.samples) // per_piece)) for f in families)
    assert after_check >= pieces + len(families)
    assert len(ticks) == after_check  # a thread of the host's own is never paused
    # The text format gathers the _created lines at the family's end: the pieces differ
    # there (and the whole answer decided); OpenMetrics keeps them in place.
    assert (checked[0] == their(registry)) is (kind == "openmetrics")
    # A family like otelgpu's (metadata, then one line per sample): pieced == whole.
    gauge_only = list(_registry(_many_series()[:1]).collect())
    assert prometheus_text._theirs_in_slices(their, gauge_only, kind) == their(
        _registry(gauge_only)
    )


def test_metrics_text_writer_goes_on_with_the_scrapes_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The writer runs right after the scrape's collection, on the same thread: it must not
    # start a slice of its own (it held the GIL for the rest of the collection's slice and
    # then a whole one more: 1.2-1.9 ms stretches against a busy host).
    pauses: list[float] = []
    monkeypatch.setattr(slicing, "pause", lambda: pauses.append(time.thread_time()))
    family = GaugeMetricFamily("g", "", labels=["id"])
    family.add_metric(["0"], 1.0)
    writer = TextWriter()
    with host_work.background():
        # the collection used the thread's slice up just before
        slicing._local.cpu = time.thread_time() - 10 * slicing.SLICE_S
        slicing._local.end = 0.0
        out = writer.write([family])
    assert out == generate_latest(_registry([family]))
    assert pauses  # handed the GIL back at once


def test_metrics_text_writer_cache_is_bounded() -> None:
    writer = TextWriter(max_prefixes=100)
    for round_ in range(20):
        family = GaugeMetricFamily("g", "", labels=["id"])
        for i in range(50):
            family.add_metric([f"{round_}-{i}"], float(i))
        out = writer.write([family])
        assert out == generate_latest(_registry([family]))
        assert len(writer._prefixes) <= 150  # cleared once over 100, then refilled


@contextlib.contextmanager
def _pull_endpoint() -> Iterator[tuple[Any, Any, str]]:
    """``instrument()`` with only the pull endpoint: (handle, runtime, scrape URL)."""
    port = free_port()
    handle = instrument_pull_only(port)
    try:
        runtime = handle.runtime
        assert runtime is not None
        yield handle, runtime, f"http://127.0.0.1:{port}/metrics"
    finally:
        otelgpu.shutdown()


def test_metrics_text_endpoint_over_http() -> None:
    with _pull_endpoint() as (_, runtime, url):
        t0 = time.time_ns()
        for i in range(20):
            runtime.record_request(tiny_request(t0, 0.1 * (i + 1), i % 5 == 0))
            runtime.record_step(StepRecord(t0, t0 + 10_000_000 * (i + 1)))
        content_type, body = scrape(url, PROMETHEUS_3_ACCEPT, gzip_ok=True)
        assert content_type == choose_encoder(PROMETHEUS_3_ACCEPT)[1]
        assert body.endswith(b"# EOF\n")
        families = {f.name: f for f in om_parse(body.decode())}
        count = families["gen_ai_server_request_duration_seconds"]
        total = sum(s.value for s in count.samples if s.name.endswith("_count"))
        assert total == 20
        content_type, body = scrape(url, "text/plain;version=0.0.4")
        assert content_type.startswith("text/plain; version=0.0.4")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert "gen_ai_server_request_duration_seconds" in names
        # name[] selects series as prometheus_client's answer does
        _, selected = scrape(url + "?name[]=process_cpu_seconds_total", "text/plain")
        assert [f.name for f in text_string_to_metric_families(selected.decode())] == [
            "process_cpu_seconds"
        ]


def test_metrics_pull_endpoint_flush_queues_nothing_for_the_next_scrape() -> None:
    # The SDK's Prometheus reader collected at force_flush and queued it: the next scrape
    # served that collection beside its own (every series twice, which Prometheus rejects
    # as duplicate samples), and each flush with no scrape in between queued one more.
    with _pull_endpoint() as (handle, runtime, url):
        t0 = time.time_ns()
        for i in range(5):
            runtime.record_request(tiny_request(t0, 0.1 * (i + 1), False))
        before = _series(scrape(url, "text/plain;version=0.0.4")[1])
        for _ in range(50):
            handle.force_flush()
        for i in range(3):
            runtime.record_request(tiny_request(t0, 0.1 * (i + 1), False))
        after = _series(scrape(url, "text/plain;version=0.0.4")[1])
        assert [k for k, n in after.items() if n > 1] == []
        assert set(after) == set(before)
        count = "gen_ai_server_request_duration_seconds_count"
        values = [s.value for f in text_string_to_metric_families(
            scrape(url, "text/plain;version=0.0.4")[1].decode()
        ) for s in f.samples if s.name == count]  # fmt: skip
        assert values == [8]


def test_metrics_pull_endpoint_concurrent_scrapes_each_get_every_series_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each scrape runs on its own server thread. The exporter's collector queues its
    # collection, then serves everything queued: a scrape preempted right after queueing
    # (two Prometheus servers of an HA pair, or Prometheus and someone's curl, at once)
    # had its collection served by the other scrape too -- every series twice there, none
    # in its own answer. The preemption is made certain here: a pause after the queueing.
    from opentelemetry.exporter.prometheus import _CustomCollector

    queue = _CustomCollector.add_metrics_data

    def queue_then_pause(self: Any, metrics_data: Any) -> None:
        queue(self, metrics_data)
        time.sleep(0.2)

    with _pull_endpoint() as (_, runtime, url):
        t0 = time.time_ns()
        for i in range(5):
            runtime.record_request(tiny_request(t0, 0.1 * (i + 1), i == 0))
        expected = _series(scrape(url, "text/plain;version=0.0.4")[1])
        assert expected and set(expected.values()) == {1}
        monkeypatch.setattr(_CustomCollector, "add_metrics_data", queue_then_pause)
        bodies: list[bytes] = []

        def scrape_once() -> None:
            bodies.append(scrape(url, "text/plain;version=0.0.4")[1])

        threads = [threading.Thread(target=scrape_once) for _ in range(2)]
        threads[0].start()
        time.sleep(0.05)  # the first scrape is paused after queueing its collection
        threads[1].start()
        for thread in threads:
            thread.join(30)
        assert len(bodies) == 2
        for body in bodies:
            assert _series(body) == expected


def _points(n: int, keys: Callable[[int], dict[str, Any]]) -> list[NumberDataPoint]:
    return [NumberDataPoint(keys(i), 0, 1_000 + i, float(i) / 3) for i in range(n)]


def test_metrics_pull_translation_in_pieces_equals_the_exporters() -> None:
    # A scrape translates the SDK's data one metric at a time, a metric with many points
    # in pieces of POINTS_PER_SLICE when all its points have the same keys (the exporter
    # makes a family's labels the union of its points' keys): the same families, labels,
    # samples and order as the exporter's one call.
    from opentelemetry.exporter.prometheus import _CustomCollector
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otelgpu.otel.prometheus import POINTS_PER_SLICE, _metric_by_metric

    per_gpu = _points(9 * POINTS_PER_SLICE, lambda i: {"hw.id": f"GPU-{i % 8}", "n": i})
    mixed = _points(
        3 * POINTS_PER_SLICE, lambda i: {"n": i} | ({"error.type": "x"} if i % 5 else {})
    )
    cumulative = AggregationTemporality.CUMULATIVE
    histogram_points = [
        HistogramDataPoint({"n": i}, 0, 1_000, 3, 6.0, (0, 1, 2), (1.0, 2.0), 0.5, 4.0)
        for i in range(2 * POINTS_PER_SLICE + 1)
    ]
    metrics = [
        Metric("gpu.util", "per GPU", "1", Gauge(per_gpu)),
        Metric("requests", "", "{request}", Sum(mixed, cumulative, True)),
        Metric("latency", "", "s", Histogram(histogram_points, cumulative)),
        Metric("small", "", "By", Sum(_points(3, lambda i: {"n": i}), cumulative, False)),
    ]
    scopes = [ScopeMetrics(InstrumentationScope("otelgpu", "1"), metrics, "")]
    data = MetricsData([ResourceMetrics(Resource.create({}), scopes, "")])
    collector = _CustomCollector()
    whole: dict[str, Any] = {}
    collector._translate_to_prometheus(data, whole)
    pieces: dict[str, Any] = {}
    calls: list[int] = []

    def translate(metrics_data: MetricsData, families: dict[str, Any]) -> None:
        calls.append(1)
        collector._translate_to_prometheus(metrics_data, families)

    _metric_by_metric(translate)(data, pieces)
    assert len(calls) == 9 + 1 + 3 + 1  # the mixed-keys metric whole
    assert list(pieces) == list(whole)
    for ours, theirs in zip(pieces.values(), whole.values(), strict=True):
        assert (ours.name, ours.type, ours.documentation, ours.unit) == (
            theirs.name, theirs.type, theirs.documentation, theirs.unit,
        )  # fmt: skip
        assert ours.samples == theirs.samples


def test_metrics_pull_scrape_hands_the_gil_back_in_short_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A scrape of 8 GPUs is 15-20 ms of Python on the scrape's thread. In one piece it
    # held the GIL against a busy host for a switch interval (5 ms) at a time; now it
    # offers the GIL back between instruments, metrics (or pieces of one), sketch families
    # and written families, as otelgpu's other background work does.
    port = free_port()
    with _eight_gpu_endpoint(port):
        url = f"http://127.0.0.1:{port}/metrics"
        scrape(url, PROMETHEUS_3_ACCEPT)  # the first scrape checks the writer once
        marks: list[float] = []

        def record_pause() -> None:
            # the scrape's own thread (socketserver's per-request thread), not the sampler's
            if "process_request" in threading.current_thread().name:
                marks.append(time.thread_time())

        monkeypatch.setattr(slicing, "SLICE_S", 0.0)  # a chance to pause is a pause
        monkeypatch.setattr(slicing, "pause", record_pause)
        runs = []
        for accept in (PROMETHEUS_3_ACCEPT, "text/plain;version=0.0.4", None):
            marks.clear()
            _, body = scrape(url, accept)
            assert b"hw_gpu_utilization" in body or b"otelgpu_gpu" in body
            slices = [b - a for a, b in itertools.pairwise(marks)]
            runs.append((max(slices), marks[-1] - marks[0], len(marks)))
    for worst, total, count in runs:
        assert worst < total / 8, f"longest slice {worst * 1e3:.2f} ms of {total * 1e3:.2f} ms"
        assert count > 100, count


def test_metrics_registry_collected_by_the_host_neither_marks_nor_pauses_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only a scrape of otelgpu's own endpoint is background work. The host's code may
    # collect the same registry itself (its own server, a push job): the scrape's slicing
    # (collection, translation, sketch families) does not pause its thread, and its thread
    # is never left marked as otelgpu's (a marked host thread would wait for gaps between
    # its own blocks). Observable callbacks still offer the GIL between observations on
    # whatever thread collects, as they always have.
    from prometheus_client import REGISTRY

    from otelgpu.otel import host_work

    with _pull_endpoint() as (_, runtime, url):
        t0 = time.time_ns()
        for i in range(5):
            runtime.record_request(tiny_request(t0, 0.1 * (i + 1), False))
        scrape(url, "text/plain;version=0.0.4")  # the endpoint's own scrape first
        callers: list[str] = []

        def record_pause() -> None:
            callers.append(sys._getframe(2).f_code.co_name)  # who asked slicing.tick

        monkeypatch.setattr(slicing, "SLICE_S", 0.0)  # a chance to pause is a pause
        monkeypatch.setattr(slicing, "pause", record_pause)
        families = list(REGISTRY.collect())
        assert any(f.name == "gen_ai_server_request_duration_seconds" for f in families)
        assert callers  # the observable callbacks' offers
        assert "_tick" not in callers  # the scrape's own slicing: the endpoint's thread only
        assert not host_work.is_background()
        scrape(url, "text/plain;version=0.0.4")
        assert "_tick" in callers  # the endpoint's scrape: sliced
        assert not host_work.is_background()


def _series(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    """How many times each series (name and labels) is in a text-format scrape."""
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            seen[key] = seen.get(key, 0) + 1
    return seen


def om_parse(text: str) -> list[Any]:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse

    return list(parse(text))


def test_metrics_text_float_formatting_is_prometheus_clients() -> None:
    # The values go through prometheus_client's own formatting: spot-check the cases
    # where Go and Python differ.
    family = GaugeMetricFamily("v", "", labels=["i"])
    values = [1e6, 1234567.0, 12345678.9, 0.1, 1e-9, 5e-324]
    for i, v in enumerate(values):
        family.add_metric([str(i)], v)
    lines = TextWriter().write([family]).decode().splitlines()[2:]
    assert [line.split(" ")[1] for line in lines] == [floatToGoString(v) for v in values]
