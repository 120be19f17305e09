"""Tail-keeping sampling of step spans (``otelgpu.otel.tail_sampling``) and the export
path's behaviour at realistic rates: nothing dropped, health-event steps always
exported, metrics exact, the SDK's sampler and resource settings still in force."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import steps_then_request
from fixtures.otlp_receiver import OtlpReceiver, attributes
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import Status, StatusCode

import otelgpu
from otelgpu.metrics import catalog as names
from otelgpu.otel.recording_reader import read_recording
from otelgpu.runtime.records import StepRecord

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


@pytest.fixture
def receiver() -> Any:
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()


def _instrument(receiver: Any, protocol: str = "grpc", **settings: Any) -> Any:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    return otelgpu.instrument(
        otlp_endpoint=endpoint,
        otlp_protocol=protocol,
        span_schedule_delay_ms=50,
        metric_export_interval_ms=3_600_000,
        frameworks="none",
        **settings,
    )


def _step_spans(receiver: Any) -> list[Any]:
    return [s for _, _, s in receiver.spans() if s.name == names.STEP_SPAN]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_pipeline_realistic_rate_nothing_dropped(receiver: Any, protocol: str) -> None:
    """50 steps/s for 2 s and 100 requests: every span arrives, nothing is counted lost."""
    handle = _instrument(receiver, protocol, gpu=False)
    runtime = handle.runtime
    for _ in range(100):
        steps_then_request(1, 0.02, samples=2)
    handle.force_flush()
    handle.shutdown()
    assert len(_step_spans(receiver)) == 100
    assert sum(1 for _, _, s in receiver.spans() if s.name.startswith("chat")) == 100
    assert runtime.stats.dropped() == {}


def test_pipeline_high_rate_keeps_health_slow_and_failed_steps(receiver: Any) -> None:
    """Thousands of steps per second: the ordinary ones are thinned to the budget, every
    failed, slow or GPU-health step is exported, and the step metrics stay exact."""
    handle = _instrument(receiver, gpu=False, step_spans_per_second=20)
    runtime = handle.runtime
    n = 3000
    t0 = time.time_ns()
    special = {}
    for i in range(n):
        start = t0 + i * 1_000_000
        duration = 100_000
        span_attributes: dict[str, Any] | None = None
        if i % 500 == 250:  # a slow step (10x the usual)
            duration = 1_000_000
            special[i + 1] = "slow"
        if i % 500 == 400:  # a GPU health flag on the step
            span_attributes = {"otelgpu.gpu.xids": [79]}
            special[i + 1] = "health"
        runtime.record_step(
            StepRecord(start, start + duration, step=i + 1, span_attributes=span_attributes)
        )
    for i in range(3):
        try:
            with otelgpu.step(step=n + 1 + i):
                raise ValueError("bad batch")
        except ValueError:
            special[n + 1 + i] = "failed"
    handle.force_flush()
    steps = {attributes(s.attributes)["otelgpu.train.step"] for s in _step_spans(receiver)}
    assert set(special) <= steps
    assert len(steps) < n // 5  # thinned: the budget, not every step
    # 20 spans per second of the steps' own time (1 ms apart: 1 in 50), evenly spaced
    # after the bucket's first second, however fast the loop recorded them
    ordinary = sorted(s for s in steps if s > 100 and s not in special)
    assert 55 <= len(ordinary) <= 60
    assert max(b - a for a, b in itertools.pairwise(ordinary)) <= 60
    sampled_out = runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
    assert sampled_out + len(steps) == n + 3
    handle.shutdown()
    total = receiver.last_metric(names.TRAIN_STEPS.name)
    assert total is not None
    assert sum(p.as_int for p in total.sum.data_points) == n + 3  # metrics exact


def test_live_steps_with_an_event_or_an_error_status_are_kept_over_the_budget(
    receiver: Any,
) -> None:
    """With the budget spent, a live step span the application gave an event, or an ERROR
    status without raising, is still exported; an ordinary step beside them is not."""
    handle = _instrument(receiver, gpu=False, step_spans_per_second=1)
    for i in range(5):  # the first steps take the one-per-second budget
        with otelgpu.step(step=i + 1):
            pass
    with otelgpu.step(step=100):
        trace.get_current_span().add_event("checkpoint written")
    with otelgpu.step(step=101):
        trace.get_current_span().set_status(Status(StatusCode.ERROR, "bad loss"))
    with otelgpu.step(step=102):
        pass
    handle.force_flush()
    kept = {attributes(s.attributes)["otelgpu.train.step"]: s for s in _step_spans(receiver)}
    assert {100, 101} <= set(kept)
    assert 102 not in kept
    assert [e.name for e in kept[100].events] == ["checkpoint written"]
    handle.shutdown()


def test_pipeline_sdk_sampler_and_resource_still_apply(
    receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=bench,team=ml")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    handle = _instrument(receiver, gpu=False, step_spans_per_second=0)
    for _ in range(400):
        with otelgpu.step():
            pass
    handle.force_flush()
    rows = [(res, s) for res, _, s in receiver.spans() if s.name == names.STEP_SPAN]
    assert 100 < len(rows) < 300  # the ratio sampler decided, not otelgpu
    resource = rows[0][0]
    assert resource["deployment.environment"] == "bench" and resource["team"] == "ml"
    handle.shutdown()


class _Started(SpanProcessor):
    """Counts the step spans started and ended on the provider (an application's own
    processor next to otelgpu's), with the attribute count of each ended one."""

    def __init__(self) -> None:
        self.started = 0
        self.ended: list[int] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += span.name == names.STEP_SPAN

    def on_end(self, span: Any) -> None:
        if span.name == names.STEP_SPAN:
            self.ended.append(len(span.attributes or {}))


def test_pipeline_sampled_out_steps_cost_no_span(receiver: Any, tmp_path: Path) -> None:
    """Tail-keeping sampling decides before the span is built: a step recorded after the
    fact and sampled out is never started, a live one sampled out gets no attributes;
    both exporters (OTLP and the local recording) get the same steps, each decided once."""
    handle = _instrument(
        receiver,
        gpu=False,
        step_spans_per_second=20,
        exporters="otlp,recording",
        recording_dir=str(tmp_path),
    )
    runtime = handle.runtime
    seen = _Started()
    runtime.pipeline.tracer_provider.add_span_processor(seen)
    n = 2000
    t0 = time.time_ns()
    for i in range(n):
        start = t0 + i * 1_000_000
        runtime.record_step(StepRecord(start, start + 100_000, step=i + 1))
    recorded = seen.started
    for i in range(n):
        with otelgpu.step(step=n + 1 + i):
            pass
    handle.force_flush()
    handle.shutdown()

    otlp = {attributes(s.attributes)["otelgpu.train.step"] for s in _step_spans(receiver)}
    recording = {
        next(kv.value.int_value for kv in span.attributes if kv.key == "otelgpu.train.step")
        for message in read_recording(handle.recording_path)
        for rs in getattr(message, "resource_spans", ())
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == names.STEP_SPAN
    }
    assert otlp == recording  # one decision per step, followed by every processor
    after_the_fact = {s for s in otlp if s <= n}
    assert 0 < len(after_the_fact) < n // 5
    assert recorded == len(after_the_fact)  # the others were never started
    assert seen.started == recorded + n  # live spans start before their step is known
    live_kept = len(otlp) - len(after_the_fact)
    assert 0 < live_kept < n // 5
    bare = [k for k in seen.ended[recorded:] if k == 0]
    assert len(bare) == n - live_kept  # sampled out: nothing was built for them
    sampled_out = runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
    # every step never exported counted once (not once per processor)
    assert sampled_out == 2 * n - len(otlp)


class _Ended(SpanProcessor):
    """The step numbers of the step spans ended with attributes (those exported)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_end(self, span: Any) -> None:
        if span.name == names.STEP_SPAN and span.attributes:
            self.steps.append(span.attributes["otelgpu.train.step"])


def _wait_for_event(runtime: Any, start_ns: int, end_ns: int) -> Any:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        events = runtime.gpu.events(start_ns, end_ns)
        if events:
            return events[0]
        time.sleep(0.01)
    raise AssertionError("the sampler never published the injected XID")


@pytest.mark.usefixtures("sim_gpu")
def test_pipeline_step_sampled_out_before_its_health_event_is_exported(
    receiver: Any, sim_gpu: Any
) -> None:
    """A step decided before the sampler published the GPU health event stamped inside
    it (sampled out then, as an ordinary step) is exported after all, once, with the
    event; the steps around it stay sampled out, and the counts stay exact."""
    handle = _instrument(receiver, step_spans_per_second=1, sample_interval_ms=200)
    runtime = handle.runtime
    ended = _Ended()
    runtime.pipeline.tracer_provider.add_span_processor(ended)
    time.sleep(0.5)  # the sampler has started and sampled
    now = time.time_ns()
    tile = 10_000_000
    # step 1 takes the one budget token; then 65 steps tiling [now - 50 ms, now + 600 ms),
    # all decided now: those still running when the XID is stamped look ordinary now
    runtime.record_step(StepRecord(now - 10 * tile, now - 9 * tile, step=1))
    windows = {}
    for i in range(65):
        start = now - 5 * tile + i * tile
        windows[i + 2] = (start, start + tile - 1)
        runtime.record_step(StepRecord(start, start + tile - 1, step=i + 2))
    assert ended.steps == [1]  # all ordinary: sampled out
    sim_gpu.inject("xid", gpu=1, code=31)  # an MMU fault: no follow-up events
    xid = _wait_for_event(runtime, now - 5 * tile, now + 60 * tile)
    late = {n for n, (s, e) in windows.items() if s <= xid.time_ns <= e}
    assert len(late) == 1, "the XID was stamped outside the steps' windows"

    # the next step (an ordinary one) finds the new event and exports the step it hit
    time.sleep(0.002)  # steps look at the event count at most once per millisecond
    trigger = max(time.time_ns() - tile, xid.time_ns + 1)  # a step after the XID
    runtime.record_step(StepRecord(trigger, trigger + tile - 1, step=100))
    assert ended.steps[1:] == sorted(late)
    handle.force_flush()
    spans = {attributes(s.attributes)["otelgpu.train.step"]: s for s in _step_spans(receiver)}
    assert late <= set(spans) and set(spans) <= {1, 100} | late
    (span,) = (spans[n] for n in late)
    assert [e.name for e in span.events] == ["otelgpu.gpu.xid"]
    assert attributes(span.attributes)["otelgpu.gpu.xids"] == [31]
    sampled_out = runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
    assert sampled_out + len(spans) == 67  # each step exported or counted, once
    handle.shutdown()
    total = receiver.last_metric(names.TRAIN_STEPS.name)
    assert total is not None
    assert sum(p.as_int for p in total.sum.data_points) == 67


def test_a_failing_look_for_late_health_events_never_reaches_the_host(
    receiver: Any, sim_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look for late GPU health events among the held steps runs on the thread that
    ends a step (the host's). When it fails (here the sampler's event list), the step
    still ends and is counted, the error is counted once per failure, and nothing raises
    into the host."""
    handle = _instrument(receiver, step_spans_per_second=1, sample_interval_ms=200)
    runtime = handle.runtime
    time.sleep(0.3)  # the sampler has started and sampled
    now = time.time_ns()
    tile = 10_000_000
    # the first step takes the one budget token; the others are sampled out and held
    for i in range(20):
        runtime.record_step(StepRecord(now + i * tile, now + (i + 1) * tile - 1, step=i + 1))

    def broken(*args: Any) -> list[Any]:
        raise RuntimeError("the sampler's events are gone")

    published = itertools.count(1_000)  # a new event published before every look
    monkeypatch.setattr(runtime.steps._gpu, "event_count", lambda: next(published))
    monkeypatch.setattr(runtime.steps._gpu, "events", broken)
    later = now + 20 * tile
    time.sleep(0.002)  # steps look at the event count at most once per millisecond
    runtime.record_step(StepRecord(later, later + tile - 1, step=21))
    time.sleep(0.002)
    runtime.record_steps([StepRecord(later + tile, later + 2 * tile - 1, step=22)])
    assert runtime.stats.errors() == {"step": 2}
    handle.shutdown()  # its own look fails too, and lets the held steps go, counted
    total = receiver.last_metric(names.TRAIN_STEPS.name)
    assert total is not None
    assert sum(p.as_int for p in total.sum.data_points) == 22


def _kept(sampler: Any, ends_ns: list[int], duration_ns: int = 4_000_000) -> list[int]:
    """Indices of the steps ``sampler`` keeps, decided in one batch (as the torch
    instrumentation's background thread decides half a second of steps at a time)."""
    return [i for i, end in enumerate(ends_ns) if sampler.decide(duration_ns, False, end)]


def test_tail_sampler_spaces_a_batch_of_steps_evenly_by_their_own_end_times() -> None:
    """200 steps/s over 10 s, decided together after the fact, with a budget of 100
    spans/s: once the bucket's burst (one second's worth) is spent, every other step is
    kept, across the whole batch -- not the first steps of the batch and none after (the
    bucket fills on the steps' end times, not on the clock of the decision)."""
    from otelgpu.otel.tail_sampling import StepSpanSampler

    sampler = StepSpanSampler(100)
    t0 = time.time_ns() - 3600 * 10**9  # steps recorded an hour after the fact
    ends = [t0 + i * 5_000_000 for i in range(2000)]
    kept = _kept(sampler, ends)
    # the burst: 100 tokens, refilled by half a token per step, last 200 steps
    assert kept[:199] == list(range(199))
    steady = [i for i in kept if i >= 200]
    assert 895 <= len(steady) <= 905  # 100/s of 200/s over the remaining 9 s
    assert {b - a for a, b in itertools.pairwise(steady)} == {2}  # evenly
    assert steady[-1] >= 1997  # to the end of the batch


def test_tail_sampler_budget_does_not_refill_from_an_older_end_time() -> None:
    """A step that ended before the newest one decided (another thread's, decided late)
    adds nothing to the budget, and the budget never exceeds one second's worth."""
    from otelgpu.otel.tail_sampling import StepSpanSampler

    sampler = StepSpanSampler(10)
    t0 = time.time_ns()
    assert len(_kept(sampler, [t0] * 30)) == 10  # the bucket, then nothing at one instant
    assert not _kept(sampler, [t0 - 5_000_000_000] * 5)  # older: no refill
    # 100 s later: one second's worth again, not 100 s worth
    assert len(_kept(sampler, [t0 + 100_000_000_000] * 30)) == 10


def _rows(t0: int) -> list[StepRecord]:
    """300 steps 1 ms apart: slow ones, GPU-health ones, some with metric attributes,
    tokens on every other step."""
    rows = []
    for i in range(300):
        start = t0 + i * 1_000_000
        rows.append(
            StepRecord(
                start,
                start + (1_000_000 if i % 100 == 50 else 100_000),
                step=i + 1,
                samples=4,
                tokens=32 if i % 2 else None,
                span_attributes={"otelgpu.gpu.xids": [79]} if i % 100 == 80 else None,
                attributes={"phase": "eval"} if i % 7 == 0 else None,
            )
        )
    return rows


def _metric_points(receiver: Any, name: str) -> list[tuple[Any, ...]]:
    metric = receiver.last_metric(name)
    assert metric is not None, name
    kind = metric.WhichOneof("data")
    points = getattr(metric, kind).data_points
    out: list[tuple[Any, ...]] = []
    for p in points:
        key = tuple(sorted(attributes(p.attributes).items()))
        if kind == "sum":
            out.append((key, p.as_int or p.as_double))
        else:
            out.append((key, p.count, round(p.sum, 9)))
    return sorted(out)


def _recorded(batched: bool, *, spans: bool = True) -> tuple[list[int], dict[str, Any], int]:
    """The exported step numbers, step metrics and tail-sampled count of ``_rows``
    recorded one by one or in batches of 8 (``record_steps``)."""
    receiver = OtlpReceiver()
    receiver.start()
    try:
        handle = _instrument(receiver, gpu=False, step_spans_per_second=20)
        runtime = handle.runtime
        rows = _rows(1_700_000_000_000_000_000)
        if batched:
            for i in range(0, len(rows), 8):
                runtime.record_steps(rows[i : i + 8], spans=spans)
        else:
            from opentelemetry.trace import INVALID_SPAN

            for row in rows:
                if spans:
                    runtime.record_step(row)
                else:
                    runtime.finish_step(INVALID_SPAN, row)
        handle.force_flush()
        sampled_out = runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
        handle.shutdown()
        kept = sorted(attributes(s.attributes)["otelgpu.train.step"] for s in _step_spans(receiver))
        metrics = {
            name: _metric_points(receiver, name)
            for name in (
                names.TRAIN_STEP_DURATION.name,
                names.TRAIN_STEPS.name,
                names.TRAIN_SAMPLES.name,
                names.TRAIN_TOKENS.name,
            )
        }
        return kept, metrics, sampled_out
    finally:
        receiver.stop()


def test_record_steps_equals_one_record_step_per_row() -> None:
    """The batch API (the torch instrumentation's background thread uses it) exports the
    same spans -- the same sampling decisions -- and the same metric values as one
    ``record_step`` per row; metric attribute sets stay apart."""
    one_by_one = _recorded(False)
    batched = _recorded(True)
    assert batched == one_by_one
    kept, metrics, sampled_out = batched
    assert {51, 151, 251, 81, 181, 281} <= set(kept)  # slow and GPU-health steps
    assert len(kept) + sampled_out == 300
    steps = dict(metrics[names.TRAIN_STEPS.name])
    assert steps == {(): 257, (("phase", "eval"),): 43}


def test_record_steps_without_spans_records_metrics_only() -> None:
    """``spans=False``: no span, no sampling decision; the metrics of every row."""
    one_by_one = _recorded(False, spans=False)
    batched = _recorded(True, spans=False)
    assert batched == one_by_one
    kept, metrics, sampled_out = batched
    assert kept == [] and sampled_out == 0
    assert sum(v for _, v in metrics[names.TRAIN_SAMPLES.name]) == 1200


def _lane_rows(t0: int) -> list[StepRecord]:
    """300 steps 1 ms apart as the torch step thread has them (no attributes): slow ones,
    ones with an event, tokens on every other step, FLOPs on every step."""
    rows = []
    for i in range(300):
        start = t0 + i * 1_000_000
        rows.append(
            StepRecord(
                start,
                start + (1_000_000 if i % 100 == 50 else 100_000),
                step=i + 1,
                samples=4,
                tokens=32 if i % 2 else None,
                flops=1e9,
                span_attributes={"otelgpu.train.step.rule": "optimizer"},
                events=[("otelgpu.torch.oom", start + 1, {"count": 1})] if i % 100 == 80 else (),
            )
        )
    return rows


def _through_lane(lane: bool) -> tuple[list[int], dict[str, Any], int, list[Any]]:
    """The exported step numbers, step metrics, tail-sampled count and the kept spans'
    attributes of ``_lane_rows``, through ``step_lane`` or ``record_steps`` (8 at a time)."""
    receiver = OtlpReceiver()
    receiver.start()
    try:
        handle = _instrument(receiver, gpu=False, step_spans_per_second=20, peak_flops=1e12)
        runtime = handle.runtime
        rows = _lane_rows(1_700_000_000_000_000_000)
        if lane:
            bulk = runtime.step_lane()
            assert bulk is not None
            for i, row in enumerate(rows):
                duration = row.end_ns - row.start_ns
                if bulk.decide(duration, row.end_ns, bool(row.events)):
                    bulk.keep(row)
                else:
                    bulk.skip(duration, row.samples, row.tokens, row.flops, sampled_out=True)
                if i % 8 == 7:
                    bulk.publish()
            bulk.publish()
        else:
            for i in range(0, len(rows), 8):
                runtime.record_steps(rows[i : i + 8])
        handle.force_flush()
        sampled_out = runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
        handle.shutdown()
        spans = sorted(_step_spans(receiver), key=lambda s: s.start_time_unix_nano)
        kept = [attributes(s.attributes)["otelgpu.train.step"] for s in spans]
        shapes = [
            (s.start_time_unix_nano, s.end_time_unix_nano, attributes(s.attributes),
             [(e.name, e.time_unix_nano) for e in s.events])
            for s in spans
        ]  # fmt: skip
        metrics = {
            name: _metric_points(receiver, name)
            for name in (
                names.TRAIN_STEP_DURATION.name,
                names.TRAIN_STEPS.name,
                names.TRAIN_SAMPLES.name,
                names.TRAIN_TOKENS.name,
                names.TRAIN_MFU.name,
            )
        }
        return kept, metrics, sampled_out, shapes
    finally:
        receiver.stop()


def test_step_lane_equals_record_steps() -> None:
    """The bulk path of the torch step thread (only kept steps become records) exports
    the same spans, attributes included, the same decisions and the same metric values
    -- MFU of every step included -- as ``record_steps`` of every row."""
    assert _through_lane(True) == _through_lane(False)
    kept, metrics, sampled_out, _ = _through_lane(True)
    assert {51, 151, 251, 81, 181, 281} <= set(kept)  # slow and event steps
    assert len(kept) + sampled_out == 300 and sampled_out > 200
    assert dict(metrics[names.TRAIN_STEPS.name]) == {(): 300}
    assert sum(v for _, v in metrics[names.TRAIN_TOKENS.name]) == 150 * 32
    ((_, mfu_count, _),) = metrics[names.TRAIN_MFU.name]
    assert mfu_count == 300


def test_step_lane_only_where_it_gives_the_same_result(receiver: Any) -> None:
    """No bulk path without tail-keeping sampling (every step gets its span anyway)."""
    handle = _instrument(receiver, gpu=False, step_spans_per_second=0)
    try:
        assert handle.runtime.step_lane() is None
    finally:
        handle.shutdown()


@pytest.mark.usefixtures("sim_gpu")
def test_no_step_lane_while_gpus_are_sampled(receiver: Any) -> None:
    """With GPUs sampled a step has a GPU context and may be held for a late health
    event: no bulk path."""
    handle = _instrument(receiver, step_spans_per_second=20)
    try:
        runtime = handle.runtime
        deadline = time.monotonic() + 10
        while runtime.sampler is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runtime.sampler is not None
        assert runtime.step_lane() is None
    finally:
        handle.shutdown()
