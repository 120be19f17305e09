"""The pure detectors: injected regressions are found, healthy series stay silent.

Series are seeded random draws (lognormal step times, noisy utilization, allocator
traces), so each case is a realistic series, not a staircase.
"""

from __future__ import annotations

import datetime
import functools
import logging
import random
import threading
from typing import Any

import pytest

from otelgpu.diagnosis.drift import (
    LatencyDrift,
    MemoryCreep,
    RunStartBaseline,
    StepDrift,
    UtilizationDips,
    relative_error_bound,
)
from otelgpu.diagnosis.exchange import Exchange
from otelgpu.diagnosis.stragglers import RankSummary, StragglerDetector, assess
from otelgpu.diagnosis.summary import RunSummary, bottleneck
from otelgpu.sketch import QuantileSketch


def _steps(rng: random.Random, n: int, median_s: float, sigma: float = 0.05) -> list[float]:
    return [median_s * rng.lognormvariate(0.0, sigma) for _ in range(n)]


# ----------------------------------------------------------------------------- drift
def test_diagnosis_step_drift_found() -> None:
    rng = random.Random(1)
    d = StepDrift(window=200)
    found = [f for v in _steps(rng, 620, 0.010) + _steps(rng, 400, 0.0125) if (f := d.add(v))]
    assert found, "a 25 % slowdown must be found"
    f = found[0]
    assert f.kind == "step_drift" and "slower" in f.message
    assert f.attributes["otelgpu.diagnosis.shift.p50"] == pytest.approx(0.25, abs=0.05)
    assert f.step is not None and f.step > 620  # only after the regression


@pytest.mark.parametrize(
    ("median_s", "unit"), [(20e-6, "µs"), (0.010, "ms"), (2.0, "s")], ids=["us", "ms", "s"]
)
def test_diagnosis_drift_message_in_a_readable_unit(median_s: float, unit: str) -> None:
    """Microsecond TTFTs used to read "p50 0.02 -> 0.02 ms (+26%)": the figures of the
    message are in the unit of the smaller one, with three significant digits."""
    base, cur = QuantileSketch(), QuantileSketch()
    for i in range(2_000):
        base.add(median_s * (1 + i * 1e-6))
        cur.add(median_s * 1.25 * (1 + i * 1e-6))
    finding = LatencyDrift().compare(base, cur)
    assert finding is not None
    shown = f"{median_s * {'µs': 1e6, 'ms': 1e3, 's': 1.0}[unit]:.3g}"
    p50 = finding.message.split("p50 ", 1)[1].split(" (", 1)[0]
    before, after = p50.removesuffix(f" {unit}").split(" -> ")
    assert p50.endswith(f" {unit}"), finding.message
    assert float(before) == pytest.approx(float(shown), rel=0.02)
    assert float(after) == pytest.approx(1.25 * float(shown), rel=0.02)


@pytest.mark.parametrize("seed", range(5))
def test_diagnosis_step_drift_silent_when_healthy(seed: int) -> None:
    rng = random.Random(seed)
    d = StepDrift(window=200)
    assert [f for v in _steps(rng, 5000, 0.010, sigma=0.2) if (f := d.add(v))] == []


def test_diagnosis_drift_respects_the_sketch_error_bound() -> None:
    # a shift below the sketch's resolution plus min_shift is never significant
    base, cur = QuantileSketch(), QuantileSketch()
    for i in range(10_000):
        base.add(0.010 + i * 1e-9)
        cur.add(0.0104 + i * 1e-9)  # +4 %
    assert relative_error_bound(base) < 0.006
    assert StepDrift(min_shift=0.05).compare(base, cur) is None
    assert StepDrift(min_shift=0.02).compare(base, cur) is not None


def test_diagnosis_drift_baseline_seam() -> None:
    # a baseline from elsewhere (a recorded file, later) replaces the run's own start
    class Fixed:
        def __init__(self) -> None:
            self.s = QuantileSketch()
            for v in _steps(random.Random(3), 1000, 0.010):
                self.s.add(v)

        def sketch(self) -> QuantileSketch:
            return self.s

        def add(self, value: float) -> None:
            pass

    d = StepDrift(baseline=Fixed(), window=100)
    found = [f for v in _steps(random.Random(4), 100, 0.015) if (f := d.add(v))]
    assert len(found) == 1  # no warm-up needed: the baseline is known from the start
    assert isinstance(RunStartBaseline().sketch(), type(None))


def test_diagnosis_latency_drift_p99() -> None:
    rng = random.Random(5)
    d = LatencyDrift("TTFT", window=400)
    healthy = [0.05 * rng.lognormvariate(0, 0.3) for _ in range(2000)]
    assert [f for v in healthy if (f := d.add(v))] == []
    # the tail grows (queueing): 5 % of requests now wait 4x longer
    tail = [
        0.05 * rng.lognormvariate(0, 0.3) * (4 if rng.random() < 0.05 else 1) for _ in range(800)
    ]
    found = [f for v in tail if (f := d.add(v))]
    assert found and found[0].kind == "latency_drift"
    assert "otelgpu.diagnosis.shift.p99" in found[0].attributes
    assert "TTFT" in found[0].message


def test_diagnosis_drift_is_rate_limited() -> None:
    rng = random.Random(6)
    d = StepDrift(window=100, cooldown=5)
    values = _steps(rng, 320, 0.010) + _steps(rng, 1000, 0.02)
    found = [f for v in values if (f := d.add(v))]
    assert 1 <= len(found) <= 2  # 10 slow windows, at most one report per 5


# ----------------------------------------------------------------------------- dips
def test_diagnosis_utilization_dips_found_with_the_loader_to_blame() -> None:
    rng = random.Random(7)
    d = UtilizationDips(window=200)
    found = []
    for i in range(400):
        dip = i % 10 == 0  # every 10th step the loader catches up
        util = (0.15 if dip else 0.95) + rng.uniform(-0.03, 0.03)
        data = 0.6 if dip else 0.02
        if f := d.add(util, data):
            found.append(f)
    assert len(found) == 1
    assert found[0].cause == "input"
    assert found[0].attributes["otelgpu.diagnosis.period_steps"] == pytest.approx(10, abs=0.5)
    assert "data loader" in found[0].message


@pytest.mark.parametrize("seed", range(3))
def test_diagnosis_utilization_dips_silent(seed: int) -> None:
    rng = random.Random(seed)
    d = UtilizationDips(window=200)
    noisy = [min(1.0, max(0.0, rng.gauss(0.9, 0.05))) for _ in range(1000)]
    assert [f for v in noisy if (f := d.add(v, 0.02))] == []
    # random (non-periodic) dips are not the loader pattern
    d = UtilizationDips(window=200)
    dips = set(rng.sample(range(1000), 40))
    values = [0.1 if i in dips else 0.9 for i in range(1000)]
    assert [f for v in values if (f := d.add(v))] == []


# ----------------------------------------------------------------------------- creep
def test_diagnosis_memory_creep_projects_the_oom() -> None:
    rng = random.Random(8)
    gib = 1 << 30
    limit = 80 * gib
    c = MemoryCreep(window=200)
    found = []
    for step in range(1000):
        # a leak of 64 MiB per step on top of 40 GiB, with allocator noise
        allocated = 40 * gib + step * (64 << 20) + rng.randint(-(32 << 20), 32 << 20)
        if f := c.add(allocated, limit):
            found.append((step, f))
    assert found, "a 64 MiB/step leak must be found"
    step, f = found[0]
    assert f.kind == "memory_creep"
    slope = f.attributes["otelgpu.diagnosis.slope_bytes_per_step"]
    assert slope == pytest.approx(64 << 20, rel=0.05)
    expected_left = (limit - f.attributes["otelgpu.diagnosis.allocated_bytes"]) / (64 << 20)
    assert f.attributes["otelgpu.diagnosis.steps_to_oom"] == pytest.approx(expected_left, rel=0.1)
    assert "OOM in ~" in f.message
    assert len(found) <= 2  # rate-limited (cooldown 500 steps)


@pytest.mark.parametrize("seed", range(3))
def test_diagnosis_memory_creep_silent(seed: int) -> None:
    rng = random.Random(seed)
    gib = 1 << 30
    c = MemoryCreep(window=200)
    found = []
    for step in range(2000):
        # a healthy allocator: a sawtooth of activations plus noise, no trend
        allocated = 40 * gib + (step % 7) * (256 << 20) + rng.randint(0, 64 << 20)
        if f := c.add(allocated, 80 * gib):
            found.append(f)
    assert found == []


def test_diagnosis_memory_creep_fed_from_the_step_probe() -> None:
    """The torch instrumentation's step records carry the allocator snapshot in a
    ``StepProbe``; the training diagnosis reads it from there, so a leak becomes a finding
    (a span event of the step and a counted finding), and a flat allocator stays silent."""
    from fixtures.torch_runtime import RuntimeHarness

    from otelgpu.diagnosis import names as N
    from otelgpu.diagnosis.settings import resolve
    from otelgpu.diagnosis.training import TrainingDiagnosis
    from otelgpu.instrumentation.torch._memory import MemorySnapshot
    from otelgpu.instrumentation.torch._steps import StepRecord
    from otelgpu.instrumentation.torch._telemetry import StepProbe

    gib = 1 << 30
    for leak, expected in ((64 << 20, True), (0, False)):
        h = RuntimeHarness()
        try:
            d = TrainingDiagnosis(
                functools.partial(getattr, h, "runtime"), resolve({"exchange_every": 0})
            )
            names = []
            for step in range(1, 301):
                snap = MemorySnapshot(0, 40 * gib + step * leak, 0, 0, 0, 0, 0, 0)
                record = StepRecord(step=step, start_ns=step * 10**7, end_ns=step * 10**7 + 10**6)
                record.probe = StepProbe((snap, 0, 0), None)
                events: list[tuple[str, int, dict[str, object]]] = []
                d.observe_step(record, {}, events)
                names += [e[0] for e in events]
            assert (N.EVENT_PREFIX + "memory_creep" in names) is expected, names
            assert d.verdict().findings.get("memory_creep", 0) == (1 if expected else 0)
        finally:
            h.close()


def test_diagnosis_batched_steps_read_as_if_added_one_by_one() -> None:
    """The training diagnosis adds steps to the run summary and the phase sketch in
    batches; every read (a verdict mid-batch, a flush) holds every step so far, with the
    same sums and the same sketch buckets as steps added one at a time."""
    from fixtures.torch_runtime import RuntimeHarness

    from otelgpu.diagnosis import names as N
    from otelgpu.diagnosis.settings import resolve
    from otelgpu.diagnosis.training import BATCH, TrainingDiagnosis, record_phases
    from otelgpu.instrumentation.torch._steps import StepRecord

    rng = random.Random(7)
    h = RuntimeHarness()
    try:
        d = TrainingDiagnosis(
            functools.partial(getattr, h, "runtime"), resolve({"exchange_every": 0})
        )
        one_by_one = RunSummary()
        expected = {p: QuantileSketch() for p in N.PHASES}
        steps = BATCH + BATCH // 2 + 3  # not a multiple of the batch
        t = 10**9
        for step in range(1, steps + 1):
            duration = rng.randint(4_000_000, 6_000_000)
            record = StepRecord(
                step=step,
                start_ns=t,
                end_ns=t + duration,
                data_wait_ns=rng.randint(0, duration // 4),
                optimizer_ns=rng.randint(0, duration // 4),
            )
            t += duration + rng.randint(0, 50_000)
            fields: dict[str, Any] = {}
            d.observe_step(record, fields, [])
            phases = record_phases(record)
            one_by_one.add_step(record.start_ns, record.end_ns, phases)
            for p, ns in phases.items():
                expected[p].add(ns / 1e9)
                assert fields[N.SPAN_PHASE_PREFIX + p] == ns / 1e9  # the span: every step
            if step in (1, BATCH - 1, BATCH + 5):
                assert d.verdict().steps == step  # a read mid-batch sees every step
        d.flush()
        got = {a[N.ATTR_PHASE]: s for a, s in h.sketch(N.PHASE_DURATION.name).series()}
        assert set(got) == set(N.PHASES)
        for p in N.PHASES:
            assert got[p].count == steps
            assert got[p].to_bytes() == expected[p].to_bytes(), p
        verdict = d.verdict()
        assert verdict.steps == steps
        assert verdict.to_dict() == one_by_one.verdict(d.gpu_health()).to_dict()
        assert d.summary.first_ns == 10**9 and d.summary.last_ns == record.end_ns
    finally:
        h.close()


# ----------------------------------------------------------------------------- stragglers
def _row(rank: int, **phases: float) -> RankSummary:
    base = {
        "data": 0.002,
        "forward": 0.004,
        "backward": 0.006,
        "optimizer": 0.001,
        "comm": 0.0,
        "checkpoint": 0.0,
        "other": 0.0005,
    }
    base.update(phases)
    slots = (base.pop("slot0", 0.0005), base.pop("slot1", 0.0005))
    base["comm"] = sum(slots)
    step = sum(base.values())
    return RankSummary(rank, 50, step, base, slots, host=f"n{rank // 8}", gpu_uuid=f"GPU-{rank}")


def test_diagnosis_two_rank_job_names_the_slow_one() -> None:
    # two ranks: the lower median is the faster rank, the victim is not blamed
    rows = [_row(0, slot0=0.0055), _row(1, data=0.007)]
    got = assess(rows)
    assert got.worst is not None and got.worst.rank == 1
    assert got.ranks[1].cause == "input" and got.ranks[1].excess_share > 0.2
    assert got.ranks[0].excess_share == 0


def test_diagnosis_straggler_needs_persistence_and_checkpoint_cause() -> None:
    det = StragglerDetector(persist=2)
    slow = [_row(r, slot0=0.003) for r in range(7)] + [_row(7, checkpoint=0.003)]
    assert det.feed(slow) == []  # one window is not persistent
    healthy = [_row(r) for r in range(8)]
    assert det.feed(healthy) == []  # streak broken
    assert det.feed(slow) == []
    reports = det.feed(slow)
    assert [(r.rank, r.cause, r.host, r.gpu_uuid) for r in reports] == [
        (7, "checkpoint", "n0", "GPU-7")
    ]
    assert "straggler rank 7" in reports[0].message()


def test_diagnosis_no_collective_slots_fall_back_to_skew() -> None:
    # DDP: gradient all-reduce inside backward, no per-call collectives seen
    # (the others wait for rank 2 inside their backward)
    rows = [
        RankSummary(
            r,
            50,
            0.022,
            {
                "data": 0.002,
                "forward": 0.009 if r == 2 else 0.005,
                "backward": 0.01 if r == 2 else 0.014,
                "other": 0.001,
            },
        )
        for r in range(4)
    ]
    got = assess(rows)
    assert got.worst is not None and got.worst.rank == 2 and got.worst.cause == "compute"


def test_diagnosis_summary_roundtrip() -> None:
    row = RankSummary(
        3,
        10,
        0.01,
        {"data": 0.001},
        (0.002,),
        "h",
        "GPU-x",
        {"throttled_fraction": 0.5, "throttle_reasons": ["hw_slowdown"]},
        11,
        20,
    )
    assert RankSummary.from_bytes(row.to_bytes()) == row


# ----------------------------------------------------------------------------- exchange
class _DictStore:
    """An in-memory stand-in with torch.distributed.Store's semantics (thread-safe)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        with self.cond:
            if not self.cond.wait_for(
                lambda: all(k in self.data for k in keys), timeout.total_seconds()
            ):
                raise RuntimeError("Socket Timeout")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self.cond:
            return [self.data[k] for k in keys]

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


def test_diagnosis_exchange_every_rank_learns_all_and_cleans_up() -> None:
    store = _DictStore()
    got: dict[int, list[tuple[int, list[int]]]] = {r: [] for r in range(3)}
    done = threading.Event()

    def sink(rank: int) -> Any:
        def on_window(window: int, rows: list[RankSummary]) -> None:
            got[rank].append((window, [r.rank for r in rows]))
            if all(len(v) == 4 for v in got.values()):
                done.set()

        return on_window

    ex = [Exchange(store, r, 3, sink(r), timeout_s=5) for r in range(3)]
    for w in range(1, 5):
        for r in range(3):
            assert ex[r].submit(w, _row(r))
    assert done.wait(10)
    for r in range(3):
        assert got[r] == [(w, [0, 1, 2]) for w in range(1, 5)]
        ex[r].close()
    # keys of windows 1 and 2 were deleted (bounded store use)
    assert not any(k.split("/")[2] in ("1", "2") for k in store.data), sorted(store.data)


def test_diagnosis_exchange_times_out_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    store = _DictStore()
    ex = Exchange(store, 0, 2, lambda w, rows: None, timeout_s=0.05)
    with caplog.at_level(logging.WARNING, logger="otelgpu.diagnosis"):
        for w in range(1, 4):
            ex.submit(w, _row(0))
        ex._thread.join(5)  # type: ignore[union-attr]
    assert ex.timeouts == 3 and ex.closed
    assert "rank exchange stopped" in caplog.text
    assert not ex.submit(5, _row(0))


# ----------------------------------------------------------------------------- verdict
@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        ({"data": 0.3, "forward": 0.4, "backward": 0.3}, "input"),
        ({"comm": 0.3, "forward": 0.4, "backward": 0.3}, "communication"),
        ({"checkpoint": 0.2, "forward": 0.8}, "checkpoint"),
        ({"other": 0.4, "forward": 0.6}, "host"),
        ({"forward": 0.5, "backward": 0.45, "other": 0.05}, "compute"),
        ({}, "unknown"),
    ],
)
def test_diagnosis_bottleneck_rule(shares: dict[str, float], expected: str) -> None:
    assert bottleneck(shares) == expected


def test_diagnosis_verdict_text_fits_a_screen() -> None:
    s = RunSummary()
    for i in range(100):
        s.add_step(i * 10, i * 10 + 10, {"data": 5, "forward": 3, "backward": 2})
    det = StragglerDetector(persist=1)
    for report in det.feed([_row(0, slot0=0.0085), _row(1, slot0=0.0085), _row(2, data=0.01)]):
        s.add_straggler(report)
    v = s.verdict(
        {
            "temperature_max_c": 84,
            "throttled_fraction": 0.4,
            "throttle_reasons": ["sw_thermal_slowdown"],
        }
    )
    text = v.text()
    assert v.bottleneck == "input" and "input-bound" in text
    assert "straggler: rank 2" in text and "throttled 40%" in text
    assert len(text.splitlines()) <= 24 and max(len(line) for line in text.splitlines()) < 200
