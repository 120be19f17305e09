"""A recorded run, loaded from OTLP JSON lines into plain Python records.

:func:`load` reads one or more recordings (one run: several ranks or rotated files) and
returns a :class:`Run`:

* ``sketches`` -- every exponential-histogram series (the exported quantile sketches),
  newest cumulative point per process, merged across processes: lossless, the buckets
  are the sketch's;
* ``gauges`` / ``counters`` -- time series of every gauge and sum point
  (``(time_s, value)`` with ``time_s`` relative to the run start);
* ``steps`` / ``requests`` -- one record per training-step span / inference-request span
  (duration, end time, attributes: phases, GPU context, MFU… whatever the span carries);
* ``gpu_events`` -- GPU health events found on spans (deduplicated: one event appears on
  every span that overlaps it);
* ``findings`` -- other otelgpu span events and log records (diagnosis: stragglers, drift,
  creep; the end-of-run verdict), whatever produced them.

Memory is bounded: step and request records are thinned (every other one dropped) when
:data:`MAX_RECORDS` is reached, so a week-long recording loads in bounded space. Times are
seconds relative to the earliest timestamp seen (``Run.t0_unix_nano``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otelgpu.errors import CorruptDataError
from otelgpu.report import _read

#: Step and request records kept per run before thinning (each thinning halves them).
MAX_RECORDS = 50_000

STEP_SPAN = "otelgpu.train.step"
GPU_EVENT_PREFIX = "otelgpu.gpu."


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> dict."""
    return {kv.key: _value(kv.value) for kv in kvs}


def series_label(attrs: Mapping[str, Any]) -> str:
    """``k=v,k2=v2`` (sorted), ``-`` when empty: the printable name of a series."""
    return ",".join(f"{k}={v}" for k, v in sorted(attrs.items())) or "-"


@dataclass
class Sketch:
    """One exported sketch series (merged over the processes that exported it)."""

    name: str
    unit: str
    attributes: dict[str, Any]
    sketch: Any  # otelgpu.sketch.QuantileSketch

    @property
    def label(self) -> str:
        return series_label(self.attributes)


@dataclass
class Series:
    """Points of one gauge or counter series: ``(time_s, value)`` in time order."""

    name: str
    unit: str
    attributes: dict[str, Any]
    points: list[tuple[float, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return series_label(self.attributes)

    @property
    def last(self) -> float:
        return self.points[-1][1] if self.points else math.nan


@dataclass
class Record:
    """One step or request span: end time and duration (s), and its attributes."""

    end_s: float
    duration_s: float
    attributes: dict[str, Any]
    name: str = ""
    error: bool = False


@dataclass
class GpuEvent:
    """A GPU health event (XID, throttling start, ECC, device lost) at ``time_s``."""

    time_s: float
    kind: str
    uuid: str
    detail: str


@dataclass
class Finding:
    """A diagnosis event or log record (straggler, drift, creep, verdict…)."""

    time_s: float
    name: str
    attributes: dict[str, Any]
    body: str = ""


@dataclass
class Run:
    """What one run recorded (see the module docstring)."""

    paths: list[str]
    messages: int = 0
    t0_unix_nano: int = 0
    end_s: float = 0.0
    processes: list[dict[str, Any]] = field(default_factory=list)
    sketches: dict[tuple[str, str], Sketch] = field(default_factory=dict)
    gauges: dict[tuple[str, str], Series] = field(default_factory=dict)
    counters: dict[tuple[str, str], Series] = field(default_factory=dict)
    span_counts: dict[str, int] = field(default_factory=dict)
    steps: list[Record] = field(default_factory=list)
    requests: list[Record] = field(default_factory=list)
    gpu_events: list[GpuEvent] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    thinned: int = 0  # how many times step/request records were halved
    skipped_lines: int = 0  # unreadable lines the reader skipped
    abandoned: list[str] = field(default_factory=list)  # files given up as not recordings
    # device order (resource otelgpu.gpu.uuids, else a span's otelgpu.gpu.ids)
    gpu_order: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ lookups
    def sketch_series(self, name: str) -> list[Sketch]:
        return [s for (n, _), s in sorted(self.sketches.items()) if n == name]

    def merged_sketch(self, name: str, where: Mapping[str, Any] | None = None) -> Any:
        """All series of sketch ``name`` (whose attributes include ``where``) merged; or None."""
        merged = None
        for s in self.sketch_series(name):
            if where and any(s.attributes.get(k) != v for k, v in where.items()):
                continue
            if merged is None:
                merged = s.sketch.copy()
            else:
                merged.merge(s.sketch)
        return merged

    def gauge_series(self, name: str) -> list[Series]:
        return [s for (n, _), s in sorted(self.gauges.items()) if n == name]

    def counter_series(self, name: str) -> list[Series]:
        return [s for (n, _), s in sorted(self.counters.items()) if n == name]

    def counter_total(self, name: str, where: Mapping[str, Any] | None = None) -> float:
        """Sum over series of the newest cumulative value (0 when absent)."""
        total = 0.0
        for s in self.counter_series(name):
            if where and any(s.attributes.get(k) != v for k, v in where.items()):
                continue
            total += s.last if s.points else 0.0
        return total

    def gpus(self) -> list[str]:
        """UUIDs of the GPUs seen (``hw.id`` on GPU metrics), in the processes' device order."""
        uuids = {
            str(s.attributes["hw.id"])
            for table in (self.gauges, self.counters)
            for s in table.values()
            if "hw.id" in s.attributes
        }
        order = {u: i for i, u in enumerate(self.gpu_order)}
        return sorted(uuids, key=lambda u: (order.get(u, len(order)), u))

    def gpu_names(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.gauges.values():
            uuid = s.attributes.get("hw.id")
            if uuid and "hw.name" in s.attributes:
                out[str(uuid)] = str(s.attributes["hw.name"])
        return out


class _Loader:
    """Accumulates messages into a :class:`Run` (one pass, bounded memory)."""

    def __init__(self, paths: list[str]) -> None:
        self.run = Run(paths=paths)
        self._t0 = 0
        self._t_max = 0
        # (process, metric, label) -> (unit, attrs, newest point)
        self._hist: dict[tuple[str, str, str], tuple[str, dict[str, Any], Any]] = {}
        self._points: dict[tuple[str, str, str], tuple[str, dict[str, Any], dict[int, float]]] = {}
        self._sum_keys: set[tuple[str, str, str]] = set()
        self._events: dict[tuple[int, str, str], GpuEvent] = {}
        self._findings: dict[tuple[int, str], Finding] = {}
        self._raw_steps: list[tuple[int, int, dict[str, Any], str, bool]] = []
        self._raw_requests: list[tuple[int, int, dict[str, Any], str, bool]] = []
        self._stride = 1
        self._seen_steps = 0
        self._seen_requests = 0
        self._processes: dict[str, dict[str, Any]] = {}

    def _time(self, ns: int) -> None:
        if ns <= 0:
            return
        if not self._t0 or ns < self._t0:
            self._t0 = ns
        self._t_max = max(self._t_max, ns)

    def _process(self, resource_attrs: dict[str, Any]) -> str:
        key = str(
            resource_attrs.get("service.instance.id")
            or (resource_attrs.get("host.name"), resource_attrs.get("process.pid"))
        )
        for uuid in resource_attrs.get("otelgpu.gpu.uuids") or ():
            if uuid not in self.run.gpu_order:
                self.run.gpu_order.append(str(uuid))
        if key not in self._processes:
            self._processes[key] = {
                k: resource_attrs[k]
                for k in (
                    "service.name",
                    "host.name",
                    "process.pid",
                    "service.instance.id",
                    "otelgpu.rank",
                )
                if k in resource_attrs
            }
        return key

    def add(self, message: Any) -> None:
        self.run.messages += 1
        for rs in getattr(message, "resource_spans", ()):
            self._process(attributes(rs.resource.attributes))
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self._span(span)
        for rm in getattr(message, "resource_metrics", ()):
            process = self._process(attributes(rm.resource.attributes))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    self._metric(process, metric)
        for rl in getattr(message, "resource_logs", ()):
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    self._log(record)

    def _span(self, span: Any) -> None:
        counts = self.run.span_counts
        counts[span.name] = counts.get(span.name, 0) + 1
        start, end = int(span.start_time_unix_nano), int(span.end_time_unix_nano)
        self._time(start)
        self._time(end)
        attrs = attributes(span.attributes)
        error = span.status.code == 2  # STATUS_CODE_ERROR
        if not self.run.gpu_order and isinstance(attrs.get("otelgpu.gpu.ids"), list):
            # several GPUs' context on a span: their UUIDs in the sampler's device order
            self.run.gpu_order = [str(u) for u in attrs["otelgpu.gpu.ids"]]
        if span.name == STEP_SPAN:
            self._seen_steps += 1
            if self._seen_steps % self._stride == 0:
                self._raw_steps.append((start, end, attrs, span.name, error))
        elif "gen_ai.operation.name" in attrs:
            self._seen_requests += 1
            if self._seen_requests % self._stride == 0:
                self._raw_requests.append((start, end, attrs, span.name, error))
        if len(self._raw_steps) > MAX_RECORDS or len(self._raw_requests) > MAX_RECORDS:
            self._raw_steps = self._raw_steps[::2]
            self._raw_requests = self._raw_requests[::2]
            self._stride *= 2
            self.run.thinned += 1
        for event in span.events:
            t = int(event.time_unix_nano) or start
            ev_attrs = attributes(event.attributes)
            if event.name.startswith(GPU_EVENT_PREFIX):
                kind = event.name.removeprefix(GPU_EVENT_PREFIX)
                uuid = str(ev_attrs.get("hw.id", ""))
                key = (t, kind, uuid)
                if key not in self._events and len(self._events) < MAX_RECORDS:
                    detail = ev_attrs.get("otelgpu.gpu.event.detail") or ev_attrs.get(
                        "otelgpu.gpu.event.code", ""
                    )
                    self._events[key] = GpuEvent(t, kind, uuid, str(detail))
            elif event.name.startswith("otelgpu.") and event.name != "exception":
                self._finding(t, event.name, ev_attrs, "")
        if "verdict" in span.name or "summary" in span.name:
            self._finding(end, span.name, attrs, "")

    def _finding(self, t: int, name: str, attrs: dict[str, Any], body: str) -> None:
        key = (t, name)
        if key not in self._findings and len(self._findings) < 10_000:
            self._findings[key] = Finding(t, name, attrs, body)

    def _log(self, record: Any) -> None:
        attrs = attributes(record.attributes)
        body = _value(record.body) if record.HasField("body") else ""
        t = int(record.time_unix_nano or record.observed_time_unix_nano)
        self._time(t)
        name = str(attrs.get("event.name") or attrs.get("otelgpu.finding") or "")
        if name.startswith("otelgpu.") or any(k.startswith("otelgpu.") for k in attrs):
            self._finding(t, name or "otelgpu.log", attrs, str(body or ""))

    def _metric(self, process: str, metric: Any) -> None:
        kind = metric.WhichOneof("data")
        if kind == "exponential_histogram":
            for dp in metric.exponential_histogram.data_points:
                attrs = attributes(dp.attributes)
                key = (process, metric.name, series_label(attrs))
                old = self._hist.get(key)
                if old is None or int(dp.time_unix_nano) >= int(old[2].time_unix_nano):
                    self._hist[key] = (metric.unit, attrs, dp)
                self._time(int(dp.time_unix_nano))
        elif kind in ("gauge", "sum"):
            container = getattr(metric, kind)
            for dp in container.data_points:
                value = float(dp.as_int) if dp.HasField("as_int") else float(dp.as_double)
                attrs = attributes(dp.attributes)
                key = (process, metric.name, series_label(attrs))
                entry = self._points.get(key)
                if entry is None:
                    entry = self._points[key] = (metric.unit, attrs, {})
                t = int(dp.time_unix_nano)
                self._time(t)
                points = entry[2]
                if len(points) < MAX_RECORDS:
                    points[t] = value
                if kind == "sum":
                    self._sum_keys.add(key)

    def finish(self) -> Run:
        from otelgpu.sketch import QuantileSketch

        run = self.run
        t0 = self._t0
        run.t0_unix_nano = t0
        run.end_s = (self._t_max - t0) / 1e9 if t0 else 0.0
        run.processes = list(self._processes.values())

        def rel(ns: int) -> float:
            return (ns - t0) / 1e9

        for (_process, name, label), (unit, attrs, dp) in sorted(
            self._hist.items(), key=lambda kv: kv[0]
        ):
            try:
                sketch = QuantileSketch.from_data_point(dp)
            except (ValueError, CorruptDataError) as exc:
                run.unreadable.append(f"{name} [{label}]: {exc}")
                continue
            existing = run.sketches.get((name, label))
            if existing is None:
                run.sketches[(name, label)] = Sketch(name, unit, attrs, sketch)
            else:
                existing.sketch.merge(sketch)
        for key, (unit, attrs, points) in self._points.items():
            _process, name, label = key
            table = run.counters if key in self._sum_keys else run.gauges
            # Several processes with the same series (e.g. two ranks on one GPU): the
            # first process's points win; GPU series carry hw.id, so they rarely collide.
            if (name, label) in table:
                continue
            table[(name, label)] = Series(
                name, unit, attrs, [(rel(t), v) for t, v in sorted(points.items())]
            )
        run.steps = sorted(
            (Record(rel(e), (e - s) / 1e9, a, n, err) for s, e, a, n, err in self._raw_steps),
            key=lambda r: r.end_s,
        )
        run.requests = sorted(
            (Record(rel(e), (e - s) / 1e9, a, n, err) for s, e, a, n, err in self._raw_requests),
            key=lambda r: r.end_s,
        )
        run.gpu_events = sorted(
            (GpuEvent(rel(e.time_s_ns), e.kind, e.uuid, e.detail) for e in self._events_ns()),
            key=lambda e: e.time_s,
        )
        run.gpu_events = sorted(run.gpu_events + _counted_events(run), key=lambda e: e.time_s)
        run.findings = sorted(
            (
                Finding(rel(int(f.time_s)), f.name, f.attributes, f.body)
                for f in self._findings.values()
            ),
            key=lambda f: f.time_s,
        )
        return run

    def _events_ns(self) -> Iterable[Any]:
        for (t, _kind, _uuid), event in self._events.items():
            yield _EventNs(t, event.kind, event.uuid, event.detail)


@dataclass
class _EventNs:
    time_s_ns: int
    kind: str
    uuid: str
    detail: str


HEALTH_COUNTER = "otelgpu.gpu.health.events"


def _counted_events(run: Run) -> list[GpuEvent]:
    """Health events the runtime counted but no span carried (none overlapped them).

    The counter is authoritative; each missing event is placed at the first export whose
    count covers it (so its time is known to one export interval).
    """
    on_spans: dict[tuple[str, str], int] = {}
    for e in run.gpu_events:
        on_spans[(e.kind, e.uuid)] = on_spans.get((e.kind, e.uuid), 0) + 1
    out = []
    for s in run.counter_series(HEALTH_COUNTER):
        kind = str(s.attributes.get("otelgpu.gpu.event", ""))
        uuid = str(s.attributes.get("hw.id", ""))
        seen = on_spans.get((kind, uuid), 0)
        for t, value in s.points:
            while value > seen:
                seen += 1
                out.append(GpuEvent(t, kind, uuid, "(counted; on no span)"))
    return out


def load(paths: Iterable[str | os.PathLike[str]]) -> Run:
    """Load the recordings ``paths`` (one run).

    Raises ``OSError`` if a file cannot be opened, ``CorruptDataError`` for a device or a
    directory; unreadable lines are skipped and counted (``Run.skipped_lines``).
    """
    from otelgpu.otel.recording_reader import ReadStats

    names = [os.fspath(p) for p in paths]
    loader = _Loader(names)
    stats = ReadStats()
    for message in _read.messages(names, stats):
        loader.add(message)
    run = loader.finish()
    run.skipped_lines = stats.skipped_lines
    run.abandoned = list(stats.abandoned or ())
    return run
