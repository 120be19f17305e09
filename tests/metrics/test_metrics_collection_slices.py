"""otelgpu's metric reader hands the GIL back all along a collection (real SDK, simulated
GPUs): observations and each instrument's aggregation step are separate slices, the
longest slice (thread CPU time, load-robust) is a small part of the whole, nothing is
lost or changed, and ``slicing.pause`` waits for a host thread that is runnable only."""

from __future__ import annotations

import functools
import gc
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures.otel import RecordingMetricExporter
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData

from otelgpu import sim
from otelgpu.metrics.gpu import register_gpu_metrics
from otelgpu.metrics.instruments import Instruments
from otelgpu.metrics.spec import Area, Kind, MetricSpec
from otelgpu.otel import slicing
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.metric_reader import ForkAwareMetricReader, slice_collection
from otelgpu.sampler import BaseGpuSampler


def _queue_depths(count: int, _options: CallbackOptions) -> list[Observation]:
    return [Observation(i, {"queue": f"q{i}"}) for i in range(count)]


def _app_instruments(meter: Meter) -> None:
    """The application's own instruments: a counter and a histogram (synchronous, SDK
    aggregations), an observable fed through otelgpu's ``Instruments`` and one of
    otelgpu's local counters (an observable counter of its own)."""
    counter = meter.create_counter("app.requests", unit="1")
    histogram = meter.create_histogram("app.latency", unit="s")
    for i in range(40):
        counter.add(i + 1, {"route": f"/r{i}"})
        histogram.record(i / 100, {"route": f"/r{i % 5}"})
    spec = MetricSpec("app.queue.depth", Kind.OBSERVABLE_GAUGE, "1", "Queue depth.", Area.INTERNAL)
    Instruments(meter).instrument(spec, functools.partial(_queue_depths, 60))
    local = LocalCounter(meter, "app.tokens", "{token}", "Tokens.")
    for i in range(50):
        local.add(10 * i + 1, {"model": f"m{i}"})


@pytest.fixture
def eight_gpus(
    sim_scenario: Callable[..., sim.SimGpu], metrics_sampler_cls: type[BaseGpuSampler]
) -> Iterator[BaseGpuSampler]:
    sim_scenario("healthy-8xh100", clock="virtual")
    sampler = metrics_sampler_cls(interval_s=0.02)
    sampler.sample_once()
    yield sampler
    sampler.close()


def _collect_in_thread(reader: ForkAwareMetricReader) -> None:
    """One collection on another thread (``pause`` waits for the main thread only from
    a background thread, as the reader's own thread is)."""
    worker = threading.Thread(target=reader.collect, name="test-collector")
    worker.start()
    worker.join()


def _timed_collect(reader: ForkAwareMetricReader, start_cpu: list[float]) -> None:
    start_cpu.append(time.thread_time())
    reader.collect()
    start_cpu.append(time.thread_time())


def test_collection_slices_are_short_in_thread_cpu_time(
    eight_gpus: BaseGpuSampler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every observation and every instrument's aggregation step (SDK storage) is a
    chance to hand the GIL back; the longest stretch between two of them is a small
    part of the collection, and no full garbage collection runs in it."""
    capture = RecordingMetricExporter()
    reader = ForkAwareMetricReader(capture, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    try:
        register_gpu_metrics(provider.get_meter("otelgpu"), eight_gpus)
        _app_instruments(provider.get_meter("app"))
        _collect_in_thread(reader)  # the SDK creates its storage on the first collection
        marks: list[tuple[float, str]] = []

        def record_pause() -> None:
            if threading.current_thread().name == "test-collector":
                caller = sys._getframe(2).f_code.co_name
                marks.append((time.thread_time(), caller))

        full: list[int] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            # on the collecting thread: not the test's own gc.collect() below
            collector = threading.current_thread().name == "test-collector"
            if phase == "start" and info["generation"] == 2 and collector:
                full.append(1)

        monkeypatch.setattr(slicing, "SLICE_S", 0.0)  # a chance to pause is a pause
        monkeypatch.setattr(slicing, "pause", record_pause)
        gc.callbacks.append(on_gc)
        try:
            runs = []
            for _ in range(3):
                marks.clear()
                # The generation counts start from zero, as after instrument()'s start-up
                # collection: a full collection in the run is then the collection's own
                # doing, not the garbage earlier tests left behind (which made it flaky).
                gc.collect()
                start_cpu: list[float] = []
                worker = threading.Thread(
                    target=_timed_collect, args=(reader, start_cpu), name="test-collector"
                )
                worker.start()
                worker.join()
                cuts = [start_cpu[0], *(t for t, _ in marks), start_cpu[1]]
                slices = [b - a for a, b in itertools.pairwise(cuts)]
                runs.append((max(slices), cuts[-1] - cuts[0], list(marks)))
        finally:
            gc.callbacks.remove(on_gc)
    finally:
        provider.shutdown()
    worst, total, best_marks = min(runs, key=lambda r: r[0])
    assert worst < total / 8, f"longest slice {worst * 1e3:.2f} ms of {total * 1e3:.2f} ms"
    assert worst < 0.003, f"longest slice {worst * 1e3:.2f} ms"
    assert not full, "a full garbage collection ran during the collection"
    exported = capture.data[-1]
    metrics = [m for rm in exported.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    storage_steps = sum(1 for _, caller in best_marks if caller == "_ticking")
    # One pause before each instrument's aggregation step at least (SDK storage)...
    assert storage_steps >= len(metrics) > 20
    # ...and one per observation of otelgpu's observables (the 60 queue depths at least).
    assert sum(1 for _, caller in best_marks if caller == "__call__") >= 60
    assert sum(1 for _, caller in best_marks if caller == "_observe") >= 50  # local counter


def _points(data: MetricsData) -> dict[str, list[tuple[tuple[Any, ...], Any]]]:
    """{metric: sorted [(attributes, value or (count, sum))]} without timestamps."""
    out: dict[str, list[tuple[tuple[Any, ...], Any]]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                rows = []
                for p in metric.data.data_points:
                    value = getattr(p, "value", None)
                    if value is None:
                        value = (p.count, p.sum, tuple(p.bucket_counts))  # type: ignore[union-attr]
                    rows.append((tuple(sorted((p.attributes or {}).items())), value))
                out[f"{sm.scope.name}/{metric.name}"] = sorted(rows, key=repr)
    return out


def test_sliced_collection_exports_what_the_sdk_collects() -> None:
    """The same provider read by otelgpu's reader and by the SDK's own in-memory reader:
    identical metrics, attributes and values (only the slicing differs)."""
    capture = RecordingMetricExporter()
    sliced = ForkAwareMetricReader(capture, export_interval_millis=3_600_000)
    plain = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[sliced, plain])
    try:
        _app_instruments(provider.get_meter("app"))
        for _ in range(2):
            _collect_in_thread(sliced)
            expected = plain.get_metrics_data()
            assert expected is not None
            got = _points(capture.data[-1])
            assert got == _points(expected)
            names = {"app/app.requests", "app/app.latency", "app/app.queue.depth", "app/app.tokens"}
            assert names <= set(got)
            assert len(got["app/app.tokens"]) == 50
            assert len(got["app/app.requests"]) == 40
        assert slice_collection(sliced) == 0  # every instrument wrapped once, not again
    finally:
        provider.shutdown()


class _FakeHost:
    """A main thread that is runnable or not and, when it ``ran``, runs ``step_ns`` of CPU
    between two readings of its clock (by default a whole turn)."""

    def __init__(self, *, runnable: bool, ran: bool, step_ns: int | None = None) -> None:
        self._runnable, self._ran, self._cpu = runnable, ran, 0
        self.step_ns = slicing._HOST_TURN_NS if step_ns is None else step_ns

    def cpu_ns(self) -> int:
        if self._ran:
            self._cpu += self.step_ns
        return self._cpu

    def runnable(self) -> bool:
        return self._runnable


@pytest.mark.parametrize(
    ("runnable", "ran", "waits"),
    [(True, False, True), (False, False, False), (True, True, False)],
    ids=["host-waiting-for-a-cpu", "host-blocked", "host-ran"],
)
def test_pause_waits_only_for_a_runnable_host_that_did_not_run(
    monkeypatch: pytest.MonkeyPatch, runnable: bool, ran: bool, waits: bool
) -> None:
    """A background thread keeps yielding (bounded by ``MAX_WAIT_S``) while the host is
    runnable and its CPU clock did not move; otherwise one sleep is the whole pause."""
    sleeps: list[float] = []
    monkeypatch.setattr(slicing, "_current_host", lambda: _FakeHost(runnable=runnable, ran=ran))
    monkeypatch.setattr(slicing, "_sleep", sleeps.append)
    worker = threading.Thread(target=slicing.pause)
    t0 = time.perf_counter()
    worker.start()
    worker.join()
    elapsed = time.perf_counter() - t0
    # The first sleep has its random extra (module docstring), the others are YIELD_S.
    assert slicing.YIELD_S <= sleeps[0] <= slicing.YIELD_S + slicing.JITTER_S
    assert all(s == slicing.YIELD_S for s in sleeps[1:])
    if waits:
        assert len(sleeps) > 1
        assert elapsed < 10  # bounded: it stopped at its deadline (MAX_WAIT_S)
    else:
        assert len(sleeps) == 1


def test_pause_leaves_the_host_its_turn_after_another_threads_hand_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When one of otelgpu's threads hands the GIL back, another one waiting for the GIL may
    get it instead of the host: a background thread coming back from its own hand-back then
    sleeps on until the host ran ``HOST_TURN_S`` past the latest hand-back of any thread,
    not just past its own (a busy host waited for two or three slices in a row)."""
    host = _FakeHost(runnable=True, ran=True, step_ns=slicing._HOST_TURN_NS // 10)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        if not sleeps:  # another thread hands back while this one sleeps
            host.cpu_ns()
            host.cpu_ns()
            slicing._handed_at = host.cpu_ns()
        sleeps.append(seconds)

    monkeypatch.setattr(slicing, "_current_host", lambda: host)
    monkeypatch.setattr(slicing, "_sleep", sleep)
    worker = threading.Thread(target=slicing.pause)
    worker.start()
    worker.join()
    # a tenth of a turn per clock reading: about ten more sleeps before the turn is run
    assert len(sleeps) >= 9
    assert all(s == slicing.YIELD_S for s in sleeps[1:])


def test_background_hand_backs_start_at_random_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """A background thread's hand-backs sleep ``YIELD_S`` plus a random extra up to
    ``JITTER_S``, so its slices do not phase-lock with a host running in a regular rhythm;
    the main thread's own pauses (e.g. a flush it runs) stay one plain ``YIELD_S``."""
    sleeps: list[float] = []
    monkeypatch.setattr(slicing, "_current_host", lambda: _FakeHost(runnable=False, ran=False))
    monkeypatch.setattr(slicing, "_sleep", sleeps.append)

    def many() -> None:
        for _ in range(200):
            slicing.pause()

    worker = threading.Thread(target=many)
    worker.start()
    worker.join()
    assert len(sleeps) == 200
    assert all(slicing.YIELD_S <= s <= slicing.YIELD_S + slicing.JITTER_S for s in sleeps)
    extras = sorted(s - slicing.YIELD_S for s in sleeps)
    # Spread over the range (uniform: each quarter holds ~50 of 200).
    for k in range(4):
        lo, hi = k * slicing.JITTER_S / 4, (k + 1) * slicing.JITTER_S / 4
        assert 15 <= sum(lo <= e < hi for e in extras) <= 90
    sleeps.clear()
    slicing.pause()  # on the main thread
    assert sleeps == [slicing.YIELD_S]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_host_state_is_read_from_the_main_thread() -> None:
    """The real host probe: a main thread blocked on an event is not runnable, and a
    background pause then returns after one sleep."""
    host = slicing._current_host()
    assert host is not None
    seen: list[bool] = []
    done = threading.Event()

    def probe() -> None:
        # the main thread is in done.wait() soon (a loaded machine may take a while)
        deadline = time.monotonic() + 10
        while host.runnable() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(host.runnable())
        slicing.pause()
        done.set()

    worker = threading.Thread(target=probe)
    worker.start()
    assert done.wait(30)
    worker.join()
    assert seen == [False]


def test_a_slice_is_thread_cpu_time_not_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that was off the CPU (preempted on a loaded machine; here: asleep) has not
    used its slice: no pause; once it really ran for the slice, the next tick pauses."""
    pauses: list[float] = []
    monkeypatch.setattr(slicing, "pause", functools.partial(pauses.append, 0.0))
    slicer = slicing.Slicer(slice_s=0.005)
    time.sleep(0.03)  # wall time passes, thread CPU time does not
    slicer.tick()
    assert pauses == []
    start = time.thread_time()
    while time.thread_time() - start < 0.01:  # 10 ms of this thread's CPU
        pass
    slicer.tick()
    assert len(pauses) == 1
