"""Turns step records and per-operation measurements into spans and metrics.

Everything goes through the otelgpu :class:`~otelgpu._runtime.Runtime` (ARCHITECTURE.md,
"Runtime"): the step span with its GPU context and the step-duration sketch, the
``otelgpu.train.steps``/``samples``/``tokens`` counters come from ``Runtime.finish_step``;
this module adds the torch metrics of ``otelgpu.metrics.catalog.TORCH_METRICS`` and
``docs/metrics-torch.md``. The runtime is looked up lazily (``otelgpu._runtime.current()``
at the first record), so the instrumentor may be installed before ``instrument()`` runs.

Per step, on the training thread: one deque append. A background thread (every
:data:`WORKER_INTERVAL_S`, and synchronously on ``flush()``/``uninstrument()``) makes one
span (every ``span_every`` steps) and ~6 sketch/counter records per step, about 30 µs of
CPU that mostly overlaps torch compute. The allocator statistics are read on the training
thread when the step closes (the tracker's probe). Ratios and jitter are computed at metric
collection from a bounded ring of the last :data:`RATIO_WINDOW` steps, never per step.

CUDA timing events (``_cuda_events``): each drain first resolves, without blocking, the
event pairs of collectives on CUDA tensors and the step-boundary events that are done
(``otelgpu.train.comm.gpu.duration``, ``otelgpu.train.step.gpu.duration``); a step span gets
``otelgpu.train.comm.gpu``/``otelgpu.train.step.gpu`` when its events resolved by then.

Thread-safety: ``step`` runs on the training thread; ``comm``/``checkpoint`` may come
from any thread (sketch records and counters are thread-safe); steps are processed under
one drain lock; the ring is guarded by a lock shared with the collection callbacks.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import INVALID_SPAN

from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch import _steps
from otelgpu.instrumentation.torch._cuda_events import PENDING_LIMIT, CudaEventTimer, Resolved
from otelgpu.instrumentation.torch._devices import StepDevices
from otelgpu.instrumentation.torch._memory import CudaMemory, MemorySnapshot
from otelgpu.metrics import catalog as C
from otelgpu.metrics.spec import MetricSpec
from otelgpu.runtime.api import RuntimeAPI
from otelgpu.runtime.records import StepRecord

__all__ = ["RATIO_WINDOW", "StepProbe", "Telemetry"]


def _current_runtime() -> RuntimeAPI | None:
    from otelgpu import _runtime

    return _runtime.current()


_logger = logging.getLogger("otelgpu.torch")

RATIO_WINDOW = 512
"""Steps the data-wait share, comm-wait share and jitter gauges are computed over."""

QUEUE_LIMIT = 10_000
"""Steps waiting for the background thread at most; more are dropped and counted
(``otelgpu.internal.dropped{otelgpu.signal=torch_steps}``)."""

WORKER_INTERVAL_S = 0.5
"""How often the background thread turns queued steps into spans and metrics."""

DDP_READ_EVERY = 10
"""Read DDP's own timing (``_get_ddp_logging_data``, ~tens of µs) on each of the first
this many steps, then every this many steps (DDP samples its first 10 iterations, then
every 100th)."""


_GAUGES: tuple[tuple[MetricSpec, str, str], ...] = (
    (C.DATA_WAIT_RATIO, "observe_ratio", "data"),
    (C.COMM_WAIT_RATIO, "observe_ratio", "comm"),
    (C.STEP_JITTER, "observe_ratio", "jitter"),
    (C.MEMORY_ALLOCATED, "observe_memory", "allocated_bytes"),
    (C.MEMORY_RESERVED, "observe_memory", "reserved_bytes"),
    (C.MEMORY_PEAK, "observe_memory", "peak_allocated_bytes"),
    (C.DDP_COMM, "observe_ddp", "avg_backward_comm_time"),
    (C.DDP_COMPUTE, "observe_ddp", "avg_backward_compute_time"),
    (C.DDP_OVERLAP, "observe_ddp", "avg_backward_compute_comm_overlap_time"),
)
"""Each torch gauge and the :class:`Telemetry` method (and its argument) that observes it."""


class _Gauge:
    """A gauge callback bound weakly to its Telemetry (a dropped one reports nothing)."""

    __slots__ = ("_arg", "_method", "_owner")

    def __init__(self, owner: Telemetry, method: str, arg: str) -> None:
        self._owner = weakref.ref(owner)
        self._method = method
        self._arg = arg

    def __call__(self, _options: CallbackOptions) -> Iterable[Observation]:
        # An uninstrumented owner still reports its final values: ``shutdown()``
        # uninstruments the frameworks before the runtime's final collection.
        owner = self._owner()
        if owner is None or owner.forked:
            return []
        try:
            return getattr(owner, self._method)(self._arg)  # type: ignore[no-any-return]
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            owner.error("torch.metrics." + self._method, exc)
            return []


class StepProbe:
    """What the tracker's probe took when a step closed: allocator statistics
    ``(snapshot, new OOMs, new retries)`` or None, and a CUDA step-end event or None."""

    __slots__ = ("gpu_event", "memory")

    def __init__(self, memory: tuple[MemorySnapshot, int, int] | None, gpu_event: Any) -> None:
        self.memory = memory
        self.gpu_event = gpu_event


_gauge_owner: weakref.ref[Telemetry] | None = None
_gauge_owner_lock = threading.Lock()


def _retire_previous_gauges(new: Telemetry) -> None:
    """Removes the gauge callbacks of the previous (closed) Telemetry, if another."""
    global _gauge_owner
    with _gauge_owner_lock:
        previous = _gauge_owner() if _gauge_owner is not None else None
        _gauge_owner = weakref.ref(new)
    if previous is not None and previous is not new:
        previous._remove_gauges()


def _quantile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    i = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[i])


class Telemetry:
    """The :class:`~._patch.Sink` of the torch hooks, backed by a Runtime.

    Args:
        runtime: a zero-argument callable returning the current runtime, or None
            (measurements are dropped until a runtime exists); default
            ``otelgpu._runtime.current``.
        span_every: emit a span for every n-th step (metrics cover every step).
        flops_per_step: model FLOPs of every step (``otelgpu.train.mfu``), or None.
        memory: a :class:`CudaMemory` reader, or None.
        ddp_modules: DDP modules whose own comm timing is read.
    """

    def __init__(
        self,
        runtime: Callable[[], RuntimeAPI | None] | None = None,
        *,
        span_every: int = 1,
        flops_per_step: float | None = None,
        memory_factory: Callable[[Callable[[dict[str, object]], None]], CudaMemory | None]
        | None = None,
        ddp_modules: Iterable[Any] = (),
    ) -> None:
        self._runtime_source = runtime or _current_runtime
        self._runtime: RuntimeAPI | None = None
        self.span_every = span_every
        self.flops_per_step = flops_per_step
        self._memory_factory = memory_factory
        self.memory: CudaMemory | None = None
        self.ddp_modules = ddp_modules
        self.names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._ring: deque[tuple[int, int, int]] = deque(maxlen=RATIO_WINDOW)
        self._last_memory: MemorySnapshot | None = None
        self._ddp: dict[str, float] = {}
        self._ddp_iteration: dict[int, int] = {}
        self._inst: dict[str, Any] | None = None
        self._gauges: list[tuple[Any, _Gauge]] = []
        self.add_event: Callable[[str, dict[str, object]], None] | None = None
        self.enabled = True
        self.forked = False  # a forked child's copy: reports nothing
        self._devices: tuple[Any, StepDevices] | None = None
        self.steps_seen = 0
        self._queue: deque[_steps.StepRecord] = deque()
        self._dropped = 0
        self._drain_lock = threading.Lock()
        self._worker_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self.gpu_timer: CudaEventTimer | None = None
        self._gpu_ops: deque[Resolved] = deque(maxlen=PENDING_LIMIT)
        self._gpu_steps: dict[int, float] = {}
        #: Called on the telemetry thread with (record, span fields, span events) before
        #: the step is emitted; may add to both (``otelgpu.diagnosis`` phases, findings).
        self.step_observers: list[
            Callable[
                [_steps.StepRecord, dict[str, Any], list[tuple[str, int, dict[str, object]]]], None
            ]
        ] = []

    # ------------------------------------------------------------------ runtime

    def runtime(self) -> RuntimeAPI | None:
        """The runtime (resolved once); None while otelgpu is not instrumented."""
        rt = self._runtime
        if rt is not None and not rt.closed:
            return rt
        rt = self._runtime_source()
        if rt is not None and rt.closed:
            rt = None
        if rt is not None and rt is not self._runtime:
            self._runtime = rt
            self._inst = None
        return rt

    def _instruments(self, rt: RuntimeAPI) -> dict[str, Any]:
        inst = self._inst
        if inst is not None:
            return inst
        inst = {m.name: rt.instrument(m) for m in C.TORCH_METRICS if not m.kind.observable}
        self._remove_gauges()
        _retire_previous_gauges(self)
        self._gauges = [
            (rt.instrument(spec), _Gauge(self, method, arg)) for spec, method, arg in _GAUGES
        ]
        for observable, callback in self._gauges:
            observable.add(callback)
        self._inst = inst
        return inst

    def _remove_gauges(self) -> None:
        gauges, self._gauges = self._gauges, []
        for observable, callback in gauges:
            observable.remove(callback)

    def _error(self, where: str, exc: BaseException) -> None:
        rt = self._runtime
        if rt is not None:
            rt.report_error(where, exc)
        else:
            _logger.debug("otelgpu torch: error in %s: %r", where, exc)

    # ------------------------------------------------------------------ Sink

    def error(self, where: str, exc: BaseException) -> None:
        """Reports one of our own failures (never raises)."""
        try:
            if self.runtime() is None:
                _logger.debug("otelgpu torch: error in %s: %r", where, exc)
            else:
                self._error(where, exc)
        except Exception:  # noqa: BLE001 -the last line of defence
            return

    def comm(self, op: str, start_ns: int, end_ns: int) -> None:
        """Host time of one collective (s) into the comm-wait sketch, by operation."""
        rt = self.runtime() if self.enabled else None
        if rt is None:
            return
        inst = self._instruments(rt)
        inst[C.COMM_WAIT.name].record((end_ns - start_ns) / 1e9, {N.ATTR_COMM_OP: op})

    def checkpoint(self, kind: str, start_ns: int, end_ns: int, size_bytes: int | None) -> None:
        """One checkpoint save: duration and size sketches, by kind."""
        rt = self.runtime() if self.enabled else None
        if rt is None:
            return
        inst = self._instruments(rt)
        attrs = {N.ATTR_CHECKPOINT_KIND: kind}
        inst[C.CHECKPOINT_DURATION.name].record((end_ns - start_ns) / 1e9, attrs)
        if size_bytes is not None:
            inst[C.CHECKPOINT_SIZE.name].record(float(size_bytes), attrs)

    def loader_startup(self, start_ns: int, end_ns: int) -> None:
        """Worker start-up of one ``iter(DataLoader)``."""
        rt = self.runtime() if self.enabled else None
        if rt is None:
            return
        self._instruments(rt)[C.LOADER_STARTUP.name].record((end_ns - start_ns) / 1e9)

    def oom(self, attributes: dict[str, object]) -> None:
        """The allocator's OOM observer fired: an event on the step in progress."""
        add_event = self.add_event
        if add_event is not None and self.enabled:
            add_event(N.EVENT_OOM, attributes)

    # ------------------------------------------------------------------ steps

    def step(self, record: _steps.StepRecord) -> None:
        """Queues one finished step (training thread: an append, < 1 µs).

        The span and metrics are made by a background thread (:meth:`drain` also runs
        on ``flush()``/``uninstrument()``): most of that work overlaps torch compute,
        which releases the GIL. The span keeps the step's own start/end times.
        """
        if not self.enabled:
            return
        probe = record.probe
        if isinstance(probe, StepProbe) and probe.gpu_event is not None:
            timer = self.gpu_timer
            if timer is not None:  # in step order, before the drain that pairs it
                timer.add_boundary(record.step, probe.gpu_event)
        queue = self._queue
        if len(queue) >= QUEUE_LIMIT:
            self._dropped += 1
            return
        queue.append(record)
        worker = self._worker
        if worker is None or not worker.is_alive():
            self._start_worker()

    def _start_worker(self) -> None:
        with self._worker_lock:
            if self._worker is not None and self._worker.is_alive():
                return
            self._stop.clear()
            worker = threading.Thread(target=self._run, name="otelgpu-torch-steps", daemon=True)
            self._worker = worker
            worker.start()

    def _run(self) -> None:
        while not self._stop.wait(WORKER_INTERVAL_S):
            self.drain()
        self.drain()

    def drain(self) -> None:
        """Turns every queued step into its span and metrics now (thread-safe)."""
        queue = self._queue
        with self._drain_lock:
            if self.gpu_timer is not None:
                try:
                    self._poll_gpu(self.gpu_timer)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    self.error("torch.cuda_events.poll", exc)
            while queue:
                record = queue.popleft()
                try:
                    self._record_step(record)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    self.error("torch.step", exc)
            dropped, self._dropped = self._dropped, 0
        if dropped:
            rt = self._runtime
            if rt is not None:
                rt.stats.add_dropped("torch_steps", "queue_full", dropped)

    def _poll_gpu(self, timer: CudaEventTimer) -> None:
        """Resolves finished CUDA events (non-blocking) into metrics; keeps them for spans."""
        got = timer.poll()
        dropped = timer.take_dropped()
        rt = self.runtime() if self.enabled else None
        if rt is None:
            return
        if dropped:
            rt.stats.add_dropped("torch_cuda_events", "queue_full", dropped)
        if not got.ops and not got.steps:
            return
        inst = self._instruments(rt)
        comm_gpu = inst[C.COMM_GPU.name]
        for r in got.ops:
            comm_gpu.record(r.gpu_s, {N.ATTR_COMM_OP: r.op})
        self._gpu_ops.extend(got.ops)
        for step, gpu_s in got.steps.items():
            inst[C.STEP_GPU.name].record(gpu_s)
            self._gpu_steps[step] = gpu_s
        if len(self._gpu_steps) > PENDING_LIMIT:  # steps never processed (no runtime)
            for step in sorted(self._gpu_steps)[:-PENDING_LIMIT]:
                del self._gpu_steps[step]

    def _gpu_fields(self, record: _steps.StepRecord, fields: dict[str, Any]) -> None:
        """GPU comm time and GPU step time of ``record``, when resolved in time.

        A collective belongs to the step whose host window holds its call's start (as
        for the host comm wait). The comm attribute is set only when every timed
        collective of the step has resolved (none pending, none dropped); the metric gets late
        ones anyway.
        """
        timer = self.gpu_timer
        if timer is None:
            return
        ops = self._gpu_ops
        total = 0.0
        seen = 0
        while ops and ops[0].host_start_ns < record.end_ns:
            r = ops.popleft()
            if r.host_start_ns >= record.start_ns:
                total += r.gpu_s
                seen += 1
        if seen and timer.complete(record.start_ns, record.end_ns):
            fields[N.SPAN_COMM_GPU] = total
        gpu_step = self._gpu_steps.pop(record.step, None)
        if gpu_step is not None:
            fields[N.SPAN_STEP_GPU] = gpu_step
        for step in [s for s in self._gpu_steps if s < record.step]:
            del self._gpu_steps[step]

    def close(self) -> None:
        """Drains, then stops the background thread (bounded wait). Idempotent."""
        self._stop.set()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=2.0)
        self._worker = None
        self.drain()
        # The gauges stay until another Telemetry takes over (their final values are
        # the last collection's), see ``_retire_previous_gauges``.

    def _record_step(self, record: _steps.StepRecord) -> None:
        """One finished step: span (every ``span_every``), metrics, ratio ring."""
        rt = self.runtime()
        if rt is None:
            return
        inst = self._instruments(rt)
        self.steps_seen += 1
        with self._lock:
            self._ring.append((record.duration_ns, record.data_wait_ns, record.comm_wait_ns))
        optimizer_attrs = {N.ATTR_SKIPPED: False}
        if record.optimizer_steps > record.skipped_optimizer_steps:
            inst[C.OPTIMIZER_STEPS.name].add(
                record.optimizer_steps - record.skipped_optimizer_steps, optimizer_attrs
            )
        if record.skipped_optimizer_steps:
            inst[C.OPTIMIZER_STEPS.name].add(record.skipped_optimizer_steps, {N.ATTR_SKIPPED: True})
        if record.micro_batches:
            inst[C.MICRO_BATCHES.name].add(record.micro_batches)
        inst[C.DATA_WAIT.name].record(record.data_wait_ns / 1e9)
        fields: dict[str, Any] = {
            N.SPAN_MICRO_BATCHES: record.micro_batches,
            N.SPAN_OPTIMIZER_STEPS: record.optimizer_steps,
            N.SPAN_SKIPPED: record.skipped,
            N.SPAN_STEP_RULE: record.rule,
            N.SPAN_DATA_WAIT: record.data_wait_ns / 1e9,
            N.SPAN_COMM_WAIT: record.comm_wait_ns / 1e9,
            N.SPAN_COMPUTE: record.compute_ns / 1e9,
        }
        if record.checkpoint_ns:
            fields[N.SPAN_CHECKPOINT] = record.checkpoint_ns / 1e9
        if record.loader_startup_ns:
            fields[N.SPAN_LOADER_STARTUP] = record.loader_startup_ns / 1e9
        if record.optimizer_ns:
            fields[N.SPAN_OPTIMIZER] = record.optimizer_ns / 1e9
        self._gpu_fields(record, fields)
        events = list(record.events)
        memory = self._memory_fields(inst, record, events)
        if memory is not None:
            fields[N.SPAN_MEM_ALLOCATED] = memory.allocated_bytes
            fields[N.SPAN_MEM_RESERVED] = memory.reserved_bytes
            fields[N.SPAN_MEM_PEAK] = memory.peak_allocated_bytes
        if record.step <= DDP_READ_EVERY or record.step % DDP_READ_EVERY == 0:
            self._read_ddp()
        for observer in self.step_observers:
            try:
                observer(record, fields, events)
            except Exception as exc:  # noqa: BLE001, PERF203 - never raise into the host
                self.error("torch.step_observer", exc)
        sampled = self.span_every <= 1 or record.step % self.span_every == 1 or events
        self._emit(rt, record, fields, events, sampled=bool(sampled))

    def _emit(
        self,
        rt: RuntimeAPI,
        record: _steps.StepRecord,
        fields: dict[str, Any],
        events: list[tuple[str, int, dict[str, object]]],
        *,
        sampled: bool,
    ) -> None:
        step = StepRecord(
            record.start_ns,
            record.end_ns,
            step=record.step,
            samples=record.samples,
            tokens=record.tokens,
            span_attributes=fields,
            devices=self._step_devices(rt, record.step),
            flops=self.flops_per_step,
        )
        if sampled:
            span = rt.start_step_span(step)
            if events and span.is_recording():
                for name, t_ns, attrs in events:
                    span.add_event(name, attrs, timestamp=t_ns)  # type: ignore[arg-type]
        else:
            span = INVALID_SPAN
        rt.finish_step(span, step)

    def _step_devices(self, rt: Any, step: int) -> list[str] | None:
        """GPUs the step's GPU context covers (``step_devices``; None: every sampled GPU)."""
        sampler = getattr(rt, "sampler", None)
        if sampler is None:
            return None  # no GPU context at all
        resolver = self._devices
        if resolver is None or resolver[0] is not rt:
            setting = getattr(getattr(rt, "settings", None), "step_devices", "auto")
            resolver = (
                rt,
                StepDevices(
                    setting,
                    sampler.devices,
                    lambda message: self._error("torch.step_devices", ValueError(message)),
                ),
            )
            self._devices = resolver
        try:
            return resolver[1].for_step(step)
        except Exception as exc:  # noqa: BLE001 - GPU context is best effort
            self._error("torch.step_devices", exc)
            return []

    def probe(self) -> StepProbe | None:
        """Allocator statistics (and, with GPU step timing, a CUDA end event) at the
        moment a step -- or a warm-up segment that may end one -- closes (the tracker's
        probe). The event is paired with its step number when the step is emitted."""
        if not self.enabled:
            return None
        event = None
        timer = self.gpu_timer
        if timer is not None and timer.steps:
            try:
                event = timer.step_event()
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                self.error("torch.cuda_events.boundary", exc)
        if self.memory is None and self._memory_factory is not None:
            self.memory = self._memory_factory(self.oom)
            self._memory_factory = None
        reader = self.memory
        memory = None if reader is None else reader.read()
        return None if memory is None and event is None else StepProbe(memory, event)

    def _memory_fields(
        self,
        inst: dict[str, Any],
        record: _steps.StepRecord,
        events: list[tuple[str, int, dict[str, object]]],
    ) -> MemorySnapshot | None:
        """Memory attributes for the span; OOM events get the allocator state added."""
        probe = record.probe
        got = probe.memory if isinstance(probe, StepProbe) else None
        if got is None:
            return None
        snap: MemorySnapshot = got[0]
        new_ooms: int = got[1]
        new_retries: int = got[2]
        with self._lock:
            self._last_memory = snap
        state: dict[str, object] = {
            "device": snap.device,
            N.SPAN_MEM_ALLOCATED: snap.allocated_bytes,
            N.SPAN_MEM_RESERVED: snap.reserved_bytes,
            N.SPAN_MEM_PEAK: snap.peak_allocated_bytes,
        }
        observed = False
        for i, (name, t_ns, attrs) in enumerate(events):
            if name == N.EVENT_OOM:
                events[i] = (name, t_ns, {**state, **attrs})
                observed = True
        if new_ooms > 0:
            inst[C.OOMS.name].add(new_ooms, {N.ATTR_DEVICE: snap.device})
            if not observed:
                events.append((N.EVENT_OOM, record.end_ns, {**state, "count": new_ooms}))
        if new_retries > 0:
            inst[C.ALLOC_RETRIES.name].add(new_retries, {N.ATTR_DEVICE: snap.device})
        return snap

    def _read_ddp(self) -> None:
        for module in list(self.ddp_modules):
            try:
                data = module._get_ddp_logging_data()
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                self._error("torch.ddp.logging_data", exc)
                continue
            iteration = data.get("iteration")
            if not isinstance(iteration, int) or self._ddp_iteration.get(id(module)) == iteration:
                continue
            self._ddp_iteration[id(module)] = iteration
            with self._lock:
                for key in (
                    "avg_backward_comm_time",
                    "avg_backward_compute_time",
                    "avg_backward_compute_comm_overlap_time",
                ):
                    value = data.get(key)
                    if isinstance(value, int | float) and value > 0:
                        self._ddp[key] = value / 1e9

    def ddp_timing(self) -> dict[str, float]:
        """Latest DDP averages read (s), keyed by DDP's own names."""
        with self._lock:
            return dict(self._ddp)

    # ------------------------------------------------------------------ gauges

    def ratios(self) -> tuple[float, float, float] | None:
        """(data-wait share, comm-wait share, p99/p50 of step time) over the ring."""
        with self._lock:
            ring = list(self._ring)
        total = sum(r[0] for r in ring)
        if not ring or total <= 0:
            return None
        durations = sorted(r[0] for r in ring)
        p50 = _quantile(durations, 0.5)
        jitter = _quantile(durations, 0.99) / p50 if p50 > 0 else float("nan")
        return (
            sum(r[1] for r in ring) / total,
            sum(r[2] for r in ring) / total,
            jitter,
        )

    def observe_ratio(self, which: str) -> list[Observation]:
        """Gauge callback body: ``data``/``comm`` share or step ``jitter``."""
        r = self.ratios()
        if r is None:
            return []
        value = {"data": r[0], "comm": r[1], "jitter": r[2]}[which]
        return [] if value != value else [Observation(value)]  # NaN: no point

    def observe_memory(self, field: str) -> list[Observation]:
        """Gauge callback body: one allocator field of the latest snapshot."""
        snap = self._last_memory
        if snap is None:
            return []
        return [Observation(getattr(snap, field), {N.ATTR_DEVICE: snap.device})]

    def observe_ddp(self, key: str) -> list[Observation]:
        """Gauge callback body: DDP's latest average (s)."""
        value = self._ddp.get(key)
        return [] if value is None else [Observation(value)]
