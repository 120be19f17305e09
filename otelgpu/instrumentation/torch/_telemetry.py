"""Turns step records and per-operation measurements into spans and metrics.

Everything goes through the otelgpu :class:`~otelgpu._runtime.Runtime` (ARCHITECTURE.md,
"Runtime"): the step span with its GPU context and the step-duration sketch, the
``otelgpu.train.steps``/``samples``/``tokens`` counters come from ``Runtime.record_steps``;
this module adds the torch metrics of ``otelgpu.metrics.catalog.TORCH_METRICS`` and
``docs/metrics-torch.md``. The runtime is looked up lazily (:class:`~._runtime_ref.RuntimeRef`),
so the instrumentor may be installed before ``instrument()`` runs.

Per step, on the training thread: one append to a :class:`~._step_queue.StepQueue`. Its
background thread (and ``flush()``/``uninstrument()``) makes the step's runtime record
and hands them to the runtime ``EMIT_BATCH`` at a time (``RuntimeAPI.record_steps``: a
span for each step kept, the step-duration sketch and step counters added once per
batch); the data waits, the optimizer-step and micro-batch counters are added once per
drain. Where the runtime offers its bulk path (``RuntimeAPI.step_lane``: tail-keeping
sampling on, no GPU sampled), the step is decided first and only a kept one gets a
runtime record and a span; a step sampled out is numbers added in bulk (with the
diagnosis, ~20 µs of CPU in place, against ~50 for a kept one; most of it overlaps torch
compute, which releases the GIL). The allocator statistics are read on the training thread
when the step closes (the tracker's probe). The gauges (shares, jitter, memory, DDP) are
:class:`~._gauges.TorchGauges`, computed at metric collection, never per step.

CUDA timing events (``_cuda_events``): each drain first resolves, without blocking, the
event pairs of collectives on CUDA tensors and the step-boundary events that are done
(``otelgpu.train.comm.gpu.duration``, ``otelgpu.train.step.gpu.duration``); a step span gets
``otelgpu.train.comm.gpu``/``otelgpu.train.step.gpu`` when its events resolved by then.

Thread-safety: ``step`` runs on the training thread; ``comm``/``checkpoint`` may come
from any thread (sketch records and counters are thread-safe); steps are processed under
the queue's drain lock; the gauges' state is guarded by their own lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch import _steps
from otelgpu.instrumentation.torch._cuda_events import PENDING_LIMIT, CudaEventTimer, Resolved
from otelgpu.instrumentation.torch._devices import StepDevices
from otelgpu.instrumentation.torch._gauges import DDP_READ_EVERY, TorchGauges
from otelgpu.instrumentation.torch._memory import CudaMemory, MemorySnapshot
from otelgpu.instrumentation.torch._records import Accum
from otelgpu.instrumentation.torch._runtime_ref import RuntimeRef
from otelgpu.instrumentation.torch._step_queue import StepQueue
from otelgpu.metrics import catalog as C
from otelgpu.runtime.api import RuntimeAPI
from otelgpu.runtime.records import StepRecord
from otelgpu.runtime.steps import StepLane

__all__ = ["StepObserver", "StepProbe", "Telemetry"]

Events = list[tuple[str, int, dict[str, object]]]
"""A step's span events: ``(name, time ns, attributes)``."""

StepObserver = Callable[[_steps.StepRecord, dict[str, Any], Events], None]
"""Called on the telemetry thread with (record, span fields, span events) before the
step is emitted; may add to both (``otelgpu.diagnosis`` phases, findings)."""

MemoryFactory = Callable[[Callable[[dict[str, object]], None]], CudaMemory | None]
"""Makes the allocator reader (given the OOM callback) at the first probe, or None."""


#: Steps handed to the runtime together (``RuntimeAPI.record_steps``: the step metrics
#: added once per batch). Small: a batch is one stretch between two GIL hand-backs of
#: the background thread (~8 steps of span and metrics work, well under its slice).
EMIT_BATCH = 8

_APPLIED = {N.ATTR_SKIPPED: False}
_SKIPPED = {N.ATTR_SKIPPED: True}


class StepProbe:
    """What the tracker's probe took when a step closed: allocator statistics
    ``(snapshot, new OOMs, new retries)`` or None, and a CUDA step-end event or None."""

    __slots__ = ("gpu_event", "memory")

    def __init__(self, memory: tuple[MemorySnapshot, int, int] | None, gpu_event: Any) -> None:
        self.memory = memory
        self.gpu_event = gpu_event


class Telemetry:
    """The :class:`~._patch.Sink` of the torch hooks, backed by a Runtime.

    Args:
        runtime: the runtime as looked up (measurements are dropped while there is none).
        span_every: emit a span for every n-th step (metrics cover every step).
        flops_per_step: model FLOPs of every step (``otelgpu.train.mfu``), or None (then
            each step's counted ``StepRecord.flops``, when the FLOP counter ran).
        memory_factory: makes the allocator reader at the first probe, or None.
        gpu_timer: CUDA-event timing of collectives and steps, or None.
        ddp_modules: the live DDP modules whose own comm timing is read.
        add_event: attaches an event to the step in progress (the OOM observer's), or None.
        step_observers: called for every step before it is emitted.
    """

    def __init__(
        self,
        runtime: RuntimeRef,
        *,
        span_every: int = 1,
        flops_per_step: float | None = None,
        memory_factory: MemoryFactory | None = None,
        gpu_timer: CudaEventTimer | None = None,
        ddp_modules: Iterable[Any] = (),
        add_event: Callable[[str, dict[str, object]], None] | None = None,
        step_observers: Sequence[StepObserver] = (),
    ) -> None:
        self._ref = runtime
        self.span_every = span_every
        self.flops_per_step = flops_per_step
        self._memory_factory = memory_factory
        self.memory: CudaMemory | None = None
        self.gpu_timer = gpu_timer
        self._add_event = add_event
        self._step_observers = tuple(step_observers)
        self.enabled = True
        self._inst: dict[str, Any] | None = None
        self._inst_runtime: RuntimeAPI | None = None
        self._devices: tuple[Any, StepDevices] | None = None
        self._gpu_ops: deque[Resolved] = deque(maxlen=PENDING_LIMIT)
        self._gpu_steps: dict[int, float] = {}
        self.gauges = TorchGauges(
            ddp_modules, on_collect_error=runtime.error, on_ddp_error=runtime.report
        )
        self._queue: StepQueue[_steps.StepRecord | Accum] = StepQueue(
            self._record_step,
            before_drain=self._poll_gpu,
            on_error=self.error,
            on_dropped=self._count_dropped,
            after_drain=self._publish_counts,
        )
        #: optimizer steps (applied, skipped) and micro-batches of the steps consumed in
        #: the current drain: added to their counters once per drain, not once per step
        self._counts = [0, 0, 0]
        #: the drain's data waits (s) and ratio-ring rows, published with the counts
        self._data_waits: list[float] = []
        self._ratio_rows: list[tuple[int, int, int]] = []
        #: the runtime records made in this drain, not yet handed to the runtime (with
        #: spans, metrics only), and that runtime
        self._to_record: list[StepRecord] = []
        self._metrics_only: list[StepRecord] = []
        self._record_rt: RuntimeAPI | None = None
        #: that runtime's bulk path (``RuntimeAPI.step_lane``), looked up once per drain
        #: (``_lane_checked``): only the steps it keeps get a runtime record and a span
        self._lane: StepLane | None = None
        self._lane_checked = False
        #: called once :meth:`probe` can never return anything (a torch build without
        #: CUDA allocator statistics, no GPU step timing): its caller may stop calling it
        self.on_probe_idle: Callable[[], None] | None = None

    # ------------------------------------------------------------------ runtime

    def runtime(self) -> RuntimeAPI | None:
        """The runtime; None while otelgpu is not instrumented."""
        return self._ref.current()

    def _instruments(self, rt: RuntimeAPI) -> dict[str, Any]:
        inst = self._inst
        if inst is not None and self._inst_runtime is rt:
            return inst
        inst = {m.name: rt.instrument(m) for m in C.TORCH_METRICS if not m.kind.observable}
        self.gauges.register(rt)
        self._inst, self._inst_runtime = inst, rt
        return inst

    # ------------------------------------------------------------------ Sink

    def error(self, where: str, exc: BaseException) -> None:
        """Reports one of our own failures (never raises)."""
        self._ref.error(where, exc)

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
        add_event = self._add_event
        if add_event is not None and self.enabled:
            add_event(N.EVENT_OOM, attributes)

    # ------------------------------------------------------------------ steps

    def step(self, record: _steps.StepRecord | Accum) -> None:
        """Queues one finished step (training thread: an append, < 1 µs); a record, or
        the accumulator the tracker emits deferred (the drain builds its record).

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
                # a deferred accumulator is emitted settled: (step, start, end, rule)
                settled = None if isinstance(record, _steps.StepRecord) else record.settled
                number = record.step if settled is None else settled[0]  # type: ignore[union-attr]
                timer.add_boundary(number, probe.gpu_event)
        self._queue.put(record)

    @property
    def on_step(self) -> Callable[[_steps.StepRecord | Accum], None]:
        """What the step tracker calls with each finished step: :meth:`step` when there are
        CUDA step events to pair (``gpu_step_time``), else straight the queue's ``put``
        (one frame less per step on the training thread; ``enabled`` needs no check there:
        it goes off with the hooks at ``uninstrument``, and a forked child's queue takes
        nothing)."""
        timer = self.gpu_timer
        return self.step if timer is not None and timer.steps else self._queue.put

    def drain(self) -> None:
        """Turns every queued step into its span and metrics now (thread-safe)."""
        self._queue.drain()

    def close(self) -> None:
        """Drains, then stops the background thread (bounded wait). Idempotent.

        The gauges stay until another Telemetry takes over (their final values are the
        last collection's).
        """
        self._queue.close()

    def after_fork(self) -> None:
        """In a forked child: off for good, the parent's queued steps and thread gone."""
        self.enabled = False
        self.gauges.forked = True
        self._queue.forget()
        self._to_record, self._metrics_only, self._record_rt = [], [], None
        self._lane, self._lane_checked = None, False

    def _publish_counts(self) -> None:
        """At a drain's end: its last steps to the runtime (:meth:`_record_pending`), its
        optimizer-step and micro-batch totals into their counters, its data waits into
        their sketch and its steps into the ratio ring (the exported figures are the same
        as per-step adds: a drain ends before every flush and collection)."""
        try:
            self._record_pending()
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self.error("torch.step", exc)
        self._lane_checked = False  # the next drain asks again (a GPU sampler may start)
        applied, skipped, micro = self._counts
        self._counts = [0, 0, 0]
        waits, self._data_waits = self._data_waits, []
        rows, self._ratio_rows = self._ratio_rows, []
        rt = self.runtime()
        if rt is None:
            return
        try:
            self.gauges.add_steps(rows)
            inst = self._instruments(rt)
            if waits:
                inst[C.DATA_WAIT.name].record_many(waits)
            if applied > 0:
                inst[C.OPTIMIZER_STEPS.name].add(applied, _APPLIED)
            if skipped:
                inst[C.OPTIMIZER_STEPS.name].add(skipped, _SKIPPED)
            if micro:
                inst[C.MICRO_BATCHES.name].add(micro)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self.error("torch.step", exc)

    def _count_dropped(self, dropped: int) -> None:
        rt = self._ref.last
        if rt is not None:
            rt.stats.add_dropped("torch_steps", "queue_full", dropped)

    def _poll_gpu(self) -> None:
        """Resolves finished CUDA events (non-blocking) into metrics; keeps them for spans."""
        timer = self.gpu_timer
        if timer is None:
            return
        try:
            self._poll_timer(timer)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self.error("torch.cuda_events.poll", exc)

    def _poll_timer(self, timer: CudaEventTimer) -> None:
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
        ops = self._gpu_ops
        if timer is None or not (ops or self._gpu_steps):  # nothing timed (no CUDA yet)
            return
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

    def _record_step(self, record: _steps.StepRecord | Accum) -> None:
        """One finished step: span (every ``span_every``), metrics, ratio ring. A deferred
        accumulator's record is built here, off the training thread."""
        if not isinstance(record, _steps.StepRecord):
            record = record.finish()
        rt = self.runtime()
        if rt is None:
            return
        # (this runs for every step: the record's properties and each call below only
        # when it has something to do are inlined)
        duration = record.end_ns - record.start_ns
        data_ns, comm_ns, checkpoint_ns = (
            record.data_wait_ns,
            record.comm_wait_ns,
            record.checkpoint_ns,
        )
        self._ratio_rows.append((duration, data_ns, comm_ns))
        counts = self._counts
        skipped = record.skipped_optimizer_steps
        counts[0] += record.optimizer_steps - skipped
        counts[1] += skipped
        counts[2] += record.micro_batches
        self._data_waits.append(data_ns / 1e9)
        compute = duration - (data_ns + comm_ns + checkpoint_ns)
        fields: dict[str, Any] = {
            N.SPAN_MICRO_BATCHES: record.micro_batches,
            N.SPAN_OPTIMIZER_STEPS: record.optimizer_steps,
            N.SPAN_SKIPPED: record.skipped,
            N.SPAN_STEP_RULE: record.rule,
            N.SPAN_DATA_WAIT: data_ns / 1e9,
            N.SPAN_COMM_WAIT: comm_ns / 1e9,
            N.SPAN_COMPUTE: (compute if compute > 0 else 0) / 1e9,
        }
        if checkpoint_ns:
            fields[N.SPAN_CHECKPOINT] = checkpoint_ns / 1e9
        if record.loader_startup_ns:
            fields[N.SPAN_LOADER_STARTUP] = record.loader_startup_ns / 1e9
        if record.optimizer_ns:
            fields[N.SPAN_OPTIMIZER] = record.optimizer_ns / 1e9
        if self._gpu_ops or self._gpu_steps:  # something CUDA-timed is waiting
            self._gpu_fields(record, fields)
        events = list(record.events)
        if isinstance(record.probe, StepProbe):
            memory = self._memory_fields(self._instruments(rt), record, events)
            if memory is not None:
                fields[N.SPAN_MEM_ALLOCATED] = memory.allocated_bytes
                fields[N.SPAN_MEM_RESERVED] = memory.reserved_bytes
                fields[N.SPAN_MEM_PEAK] = memory.peak_allocated_bytes
        step = record.step
        if step <= DDP_READ_EVERY or step % DDP_READ_EVERY == 0:
            self.gauges.read_ddp(step)
        for observer in self._step_observers:
            try:
                observer(record, fields, events)
            except Exception as exc:  # noqa: BLE001, PERF203 - never raise into the host
                self.error("torch.step_observer", exc)
        sampled = self.span_every <= 1 or step % self.span_every == 1 or events
        self._emit(rt, record, fields, events, sampled=bool(sampled))

    def _emit(
        self,
        rt: RuntimeAPI,
        record: _steps.StepRecord,
        fields: dict[str, Any],
        events: Events,
        *,
        sampled: bool,
    ) -> None:
        if rt is not self._record_rt:
            self._record_pending()
            self._record_rt = rt
            self._lane_checked = False
        if not self._lane_checked:
            self._lane = self._lane_of(rt)
            self._lane_checked = True
        lane = self._lane
        # the configured figure wins; else what the FLOP counter measured for the step
        flops = self.flops_per_step if self.flops_per_step is not None else record.flops
        if lane is not None:  # only a step kept gets a runtime record and a span
            duration = record.end_ns - record.start_ns
            if not (sampled and lane.decide(duration, record.end_ns, bool(events))):
                lane.skip(duration, record.samples, record.tokens, flops, sampled_out=sampled)
                return
        step = StepRecord(
            record.start_ns,
            record.end_ns,
            step=record.step,
            samples=record.samples,
            tokens=record.tokens,
            span_attributes=fields,
            # no sampler, no GPU context: skip the resolver's frame (every step)
            devices=None
            if getattr(rt, "sampler", None) is None
            else self._step_devices(rt, record.step),
            flops=flops,
            events=events,
        )
        if lane is not None:
            lane.keep(step)
            return
        # with tail-keeping sampling, a step sampled out gets no span at all
        pending = self._to_record if sampled else self._metrics_only
        pending.append(step)
        if len(self._to_record) + len(self._metrics_only) >= EMIT_BATCH:
            self._record_pending()

    def _record_pending(self) -> None:
        """Hands the steps made so far to their runtime (in step order within each kind:
        the metrics-only ones take no sampling decision)."""
        rt = self._record_rt
        kept, self._to_record = self._to_record, []
        only, self._metrics_only = self._metrics_only, []
        if rt is None:
            return
        if kept:
            rt.record_steps(kept)
        if only:
            rt.record_steps(only, spans=False)
        lane = self._lane
        if lane is not None:
            lane.publish()

    def _lane_of(self, rt: RuntimeAPI) -> StepLane | None:
        """``rt``'s bulk path for steps, where it has one (never raises)."""
        get = getattr(rt, "step_lane", None)
        if get is None:
            return None
        try:
            return get()  # type: ignore[no-any-return]
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self.error("torch.step", exc)
            return None

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
                    lambda message: self._ref.report("torch.step_devices", ValueError(message)),
                ),
            )
            self._devices = resolver
        try:
            return resolver[1].for_step(step)
        except Exception as exc:  # noqa: BLE001 - GPU context is best effort
            self._ref.report("torch.step_devices", exc)
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
            idle = self.on_probe_idle
            if (
                idle is not None
                and (self.memory is None or not self.memory.available)
                and (timer is None or not timer.steps)
            ):
                idle()  # this call still answers; no later one has anything to take
        reader = self.memory
        memory = None if reader is None else reader.read()
        return None if memory is None and event is None else StepProbe(memory, event)

    def _memory_fields(
        self,
        inst: dict[str, Any],
        record: _steps.StepRecord,
        events: Events,
    ) -> MemorySnapshot | None:
        """Memory attributes for the span; OOM events get the allocator state added."""
        probe = record.probe
        got = probe.memory if isinstance(probe, StepProbe) else None
        if got is None:
            return None
        snap: MemorySnapshot = got[0]
        new_ooms: int = got[1]
        new_retries: int = got[2]
        self.gauges.set_memory(snap)
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
