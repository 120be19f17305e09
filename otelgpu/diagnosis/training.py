"""Training-side diagnosis: per-step phases in, findings and the verdict out.

:class:`TrainingDiagnosis` is fed every finished step by the torch instrumentation's
telemetry thread (never the training thread): it splits the step into phases (through a
:class:`PhaseSource`), puts them on the step span and into the phase sketch, feeds the
detectors (step drift, utilization dips, memory creep), accumulates the run for the
verdict and, every ``exchange_every`` steps, hands a window summary to the rank exchange
(:mod:`.exchange`). Every rank learns the median and the worst rank and exports its own
``otelgpu.train.rank.skew``; rank 0 alone turns a straggler report into the log line, the
counter and a span event on its next step span (one report per job, not one per rank);
every rank's verdict names the stragglers.

Costs per step (telemetry thread): a few µs of Python (~45k instructions: phase split,
span fields, detectors); the run summary and the phase sketch take the steps in batches
(``BATCH``), transposed in C; every window one GPU window query and a summary.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from otelgpu.diagnosis import names as N
from otelgpu.diagnosis.drift import MemoryCreep, StepDrift, UtilizationDips
from otelgpu.diagnosis.emit import Emitter, logger
from otelgpu.diagnosis.exchange import Exchange, torch_store
from otelgpu.diagnosis.findings import Finding
from otelgpu.diagnosis.phases import split_step
from otelgpu.diagnosis.settings import DiagnosisSettings
from otelgpu.diagnosis.stragglers import COMM_SLOTS, RankSummary, StragglerDetector
from otelgpu.diagnosis.summary import RunSummary, Verdict

__all__ = ["PhaseSource", "TrainingDiagnosis"]


class PhaseSource(Protocol):
    """Where a step's forward/backward/collective intervals come from (the torch hooks).

    A source whose dicts always hold every phase of ``names.PHASES`` in that order (as
    :func:`~otelgpu.diagnosis.phases.split_step` builds them) says so with a class
    attribute ``phases_in_order = True``; its steps are then added up in batches faster.
    """

    def take(self, record: Any) -> tuple[dict[str, int], list[int]]:
        """(phases in ns summing to the step, host time per collective slot in ns)."""


BATCH = 64
"""Steps are buffered, then go into the run summary and the phase sketch in one batch:
every ``BATCH`` steps, and whenever the summary is read or the instrumentation flushes
(:meth:`TrainingDiagnosis.flush`). A count of steps, not a time: the cost per step does
not depend on how long steps take (an exported phase sketch lags by < ``BATCH`` steps)."""


_PHASES = tuple(N.PHASES)


def record_phases(record: Any) -> dict[str, int]:
    """Phases from a step record alone (no forward/backward intervals known)."""
    return split_step(
        record.start_ns,
        record.end_ns,
        data_ns=record.data_wait_ns,
        comm_ns=record.comm_wait_ns,
        checkpoint_ns=record.checkpoint_ns,
        optimizer_ns=record.optimizer_ns,
    )


class _Window:
    """Per-step values of the exchange window in progress (bounded by ``exchange_every``).

    The summary sent is the per-step **median** of each phase and collective slot: one
    slow step (a GC pause, a preempted core) moves a mean, not a median, while a rank that
    is slow step after step moves both. Per step one tuple of references is kept (the
    step's number, start, end, phase dict and collective slots); everything else is taken
    once per window.
    """

    def __init__(self) -> None:
        self.records: list[tuple[int, int, int, Mapping[str, int], list[int]]] = []

    def add(self, record: Any, phases: Mapping[str, int], slots: list[int]) -> int:
        """Adds one step; returns the window's steps so far."""
        records = self.records
        records.append((record.step, record.start_ns, record.end_ns, phases, slots))
        return len(records)

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def step_ns(self) -> list[int]:
        """Every step's duration (ns)."""
        return [end - start for _, start, end, _, _ in self.records]

    @property
    def has_slots(self) -> bool:
        """Whether any step of the window had collectives seen per call."""
        return any(r[4] for r in self.records)

    @property
    def phases(self) -> dict[str, list[int]]:
        """Per phase, its value on every step of the window."""
        rows = [r[3] for r in self.records]
        return {p: [row.get(p, 0) for row in rows] for p in N.PHASES}

    @property
    def slots(self) -> list[list[int]]:
        """Per collective slot, its host time on every step (0 where the step had none;
        the last slot holds the sum of the step's further collectives)."""
        out = [[0] * self.steps for _ in range(COMM_SLOTS)]
        for i, r in enumerate(self.records):
            slots = r[4]
            if not slots:
                continue
            padded = [*slots[: COMM_SLOTS - 1], sum(slots[COMM_SLOTS - 1 :])]
            for j, v in enumerate(padded):
                out[j][i] = v
        return out

    @staticmethod
    def median_s(values: list[int]) -> float:
        return float(statistics.median(values)) / 1e9 if values else 0.0


def _memory_snapshot(probe: Any) -> Any:
    """The allocator snapshot a step's probe took, or None.

    The probe is the torch instrumentation's ``StepProbe`` (``.memory`` = ``(snapshot,
    new OOMs, new retries)`` or None); a bare ``(snapshot, ...)`` tuple is read the same.
    """
    memory = getattr(probe, "memory", probe)
    return memory[0] if isinstance(memory, tuple) and memory else None


def _file_baseline(path: str | None) -> Any:
    """The baseline file's step-time distribution (``OTELGPU_BASELINE``), or None: the
    run's own start."""
    from otelgpu.baseline.drift import STEP_FIGURE, file_baseline

    return file_baseline(path, STEP_FIGURE)


class TrainingDiagnosis:
    """Diagnosis of one instrumented training process (see the module docstring).

    Args:
        runtime: zero-argument callable returning the current Runtime (or None).
        settings: :class:`DiagnosisSettings`.
        phases: the hooks' :class:`PhaseSource`, or None (phases from the record only).
        exchange_factory: builds the rank exchange (tests pass one); default: the job's
            ``torch.distributed`` store once the default process group exists.
    """

    def __init__(
        self,
        runtime: Callable[[], Any],
        settings: DiagnosisSettings,
        phases: PhaseSource | None = None,
        *,
        exchange_factory: Callable[[Callable[[int, list[RankSummary]], None]], Exchange | None]
        | None = None,
    ) -> None:
        self._runtime_source = runtime
        self.settings = settings
        self.phase_source = phases
        self.summary = RunSummary()
        self.drift = StepDrift(baseline=_file_baseline(settings.baseline))
        self.dips = UtilizationDips()
        self.creep = MemoryCreep()
        self.stragglers = StragglerDetector(threshold=settings.straggler_threshold)
        self._exchange_factory = exchange_factory
        self.exchange: Exchange | None = None
        self._exchange_tried = False
        self._window = _Window()
        self._emitter: Emitter | None = None
        self._emitter_rt: Any = None
        self._lock = threading.Lock()
        # steps not yet in the run summary and the phase sketch (at most BATCH)
        self._pending: deque[tuple[int, int, Mapping[str, int], list[float]]] = deque()
        self._flush_lock = threading.Lock()
        # the phase dicts hold every phase in names.PHASES order (our splitter's): batches
        # are transposed, not looped over
        self._in_order = phases is None or getattr(phases, "phases_in_order", False) is True
        self.host = socket.gethostname()
        self.rank: int | None = None
        self.closed = False
        self._limit_bytes: float | None = None
        self.windows_sent = 0
        self._every = settings.exchange_every

    # ------------------------------------------------------------------ plumbing
    def emitter(self, rt: Any = None) -> Emitter | None:
        """The emitter of the current runtime (``rt``: that runtime, when just looked up)."""
        if rt is None:
            rt = self._runtime_source()
            if rt is None:
                return None
        if self._emitter is None or self._emitter_rt is not rt:
            if self._emitter is not None:
                self._flush(self._emitter)  # the steps buffered so far are the old runtime's
            self._emitter = Emitter(rt)
            self._emitter_rt = rt
        return self._emitter

    def flush(self) -> None:
        """Adds the buffered steps to the run summary and the phase sketch (any thread;
        the torch instrumentation's ``flush()`` calls it, and every read of the summary)."""
        emitter = self._emitter
        if emitter is None:
            emitter = self.emitter()
        self._flush(emitter)

    def _flush(self, emitter: Emitter | None) -> None:
        # One lock around taking and adding: batches reach the summary in step order.
        with self._flush_lock:
            pending = self._pending
            rows = [pending.popleft() for _ in range(len(pending))]
            if not rows:
                return
            dicts = [row[2] for row in rows]
            durations = [row[1] - row[0] for row in rows]
            if self._in_order:
                # every step has every phase, in names.PHASES order: the batch is transposed
                # in C (a column per phase), not looped over per step and phase
                ns = zip(*map(dict.values, dicts), strict=True)  # type: ignore[arg-type]
                totals = dict(zip(_PHASES, map(sum, ns), strict=True))
                self.summary.add_batch(rows[0][0], rows[-1][1], durations, totals)
                if emitter is not None:
                    seconds = zip(*[row[3] for row in rows], strict=True)
                    emitter.record_phase_columns(dict(zip(_PHASES, seconds, strict=True)))
                return
            totals = {}
            for d in dicts:
                for p, v in d.items():
                    totals[p] = totals.get(p, 0) + v
                if emitter is not None:
                    emitter.phases(d)
            self.summary.add_batch(rows[0][0], rows[-1][1], durations, totals)

    def _error(self, where: str, exc: BaseException) -> None:
        rt = self._runtime_source()
        if rt is not None:
            rt.report_error(where, exc)
        else:
            logger.debug("otelgpu diagnosis: error in %s: %r", where, exc)

    # ------------------------------------------------------------------ per step
    def observe_step(
        self, record: Any, fields: dict[str, Any], events: list[tuple[str, int, dict[str, object]]]
    ) -> None:
        """One finished step (telemetry thread): phases, detectors, window, events.

        Runs for every step, so it allocates little: the phase dict is made once and kept
        by reference (span fields, the batch for the run summary and the phase sketch,
        window); the detectors' work beyond an append happens when their windows close.
        """
        if self.closed:
            return
        rt = self._runtime_source()
        if rt is None:
            return
        emitter = self._emitter if self._emitter_rt is rt else self.emitter(rt)
        if emitter is None:
            return
        if self.phase_source is not None:
            phases, slots = self.phase_source.take(record)
        else:
            phases, slots = record_phases(record), []
        seconds = emitter.phase_fields(phases, fields)  # the span's phase attributes
        start, end = record.start_ns, record.end_ns
        pending = self._pending
        pending.append((start, end, phases, seconds))
        if len(pending) >= BATCH:
            self._flush(emitter)
        found = self._detect(rt, record, phases, end - start)
        if found:
            for finding in found:
                events.append(emitter.finding(finding, end))
                self.summary.add_finding(finding)
        if emitter.has_events():
            events.extend(emitter.take_events())
        window = self._window
        records = window.records  # _Window.add, inlined: this runs every step
        records.append((record.step, start, end, phases, slots))
        every = self._every
        if every and len(records) >= every:
            self._window = _Window()
            self._send(window, record.step // every)

    def _detect(
        self,
        rt: Any,
        record: Any,
        phases: Mapping[str, int],
        duration_ns: int,
    ) -> list[Finding] | None:
        found = None
        f = self.drift.add(duration_ns / 1e9)
        if f is not None:
            found = [f]
        share = phases.get("data", 0) / (duration_ns if duration_ns > 1 else 1)
        sampler = getattr(rt, "sampler", None)
        util = self._utilization(sampler, record) if sampler is not None else None
        f = self.dips.add(util if util is not None else 1.0 - share, share)
        if f is not None:
            found = [*(found or ()), f]
        probe = getattr(record, "probe", None)
        if probe is None:  # no allocator snapshot this step (CPU, or memory off)
            return found
        snap = _memory_snapshot(probe)
        allocated = getattr(snap, "allocated_bytes", None)
        if isinstance(allocated, int):
            f = self.creep.add(allocated, self._memory_limit(snap))
            if f is not None:
                found = [*(found or ()), f]
        return found

    def _utilization(self, sampler: Any, record: Any) -> float | None:
        try:
            windows = sampler.windows(record.start_ns, record.end_ns)
        except Exception as exc:  # noqa: BLE001 - best effort
            self._error("diagnosis.gpu_window", exc)
            return None
        vals = [
            w.gpu_util_mean_pct for w in windows.values() if w and w.gpu_util_mean_pct is not None
        ]
        return statistics.fmean(vals) / 100.0 if vals else None

    def _memory_limit(self, snap: Any) -> float | None:
        if self._limit_bytes is not None:
            return self._limit_bytes
        rt = self._runtime_source()
        sampler = getattr(rt, "sampler", None)
        try:
            for dev in getattr(sampler, "devices", ()) or ():
                total = getattr(dev, "memory_total_bytes", None)
                if total:
                    self._limit_bytes = float(total)
                    return self._limit_bytes
            import sys

            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                props = torch.cuda.get_device_properties(getattr(snap, "device", 0))
                self._limit_bytes = float(props.total_memory)
        except Exception as exc:  # noqa: BLE001 - best effort
            self._error("diagnosis.memory_limit", exc)
        return self._limit_bytes

    # ------------------------------------------------------------------ exchange
    def _gpu_state(self, start_ns: int, end_ns: int) -> tuple[str, dict[str, Any]]:
        rt = self._runtime_source()
        sampler = getattr(rt, "sampler", None)
        if sampler is None:
            return "", {}
        try:
            windows = sampler.windows(start_ns, end_ns)
        except Exception as exc:  # noqa: BLE001 - best effort
            self._error("diagnosis.gpu_window", exc)
            return "", {}
        for uuid, w in windows.items():
            if w is None:
                continue
            util = None if w.gpu_util_mean_pct is None else w.gpu_util_mean_pct / 100
            fields = (
                ("throttled_fraction", w.throttled_fraction),
                ("sm_clock_mhz", w.sm_clock_mean_mhz),
                ("temperature_max_c", w.temperature_max_c),
                ("utilization", util),
            )
            g: dict[str, Any] = {key: value for key, value in fields if value is not None}
            if w.throttle_reason_names:
                g["throttle_reasons"] = list(w.throttle_reason_names)
            if w.xids:
                g["xids"] = list(w.xids)
            return uuid, g  # the rank's own GPU: the sampler samples only it under a launcher
        return "", {}

    def _send(self, window: _Window, index: int) -> None:
        exchange = self._ensure_exchange()
        if exchange is None:
            return
        records = window.records or [(0, 0, 0, {}, [])]
        first, last = records[0], records[-1]  # (step, start_ns, end_ns, phases, slots)
        uuid, gpu = self._gpu_state(first[1], last[2])
        m = window.median_s
        slots = [m(v) for v in window.slots] if window.has_slots else []
        while slots and slots[-1] == 0.0:
            slots.pop()
        summary = RankSummary(
            rank=exchange.rank,
            steps=window.steps,
            step_s=m(window.step_ns),
            phases={p: m(v) for p, v in window.phases.items()},
            comm_slots=tuple(slots),
            host=self.host,
            gpu_uuid=uuid,
            gpu=gpu,
            first_step=first[0],
            last_step=last[0],
        )
        if exchange.submit(index, summary):
            self.windows_sent += 1

    def _ensure_exchange(self) -> Exchange | None:
        if self.exchange is not None:
            return None if self.exchange.closed else self.exchange
        if self._exchange_tried:
            return None
        try:
            if self._exchange_factory is not None:
                self.exchange = self._exchange_factory(self._on_window)
            else:
                found = torch_store()
                if found is None:
                    return None  # not distributed (yet): try again next window
                store, rank, world = found
                self.exchange = Exchange(store, rank, world, self._on_window, on_error=self._error)
        except Exception as exc:  # noqa: BLE001 - no exchange, the rest goes on
            self._exchange_tried = True
            self._error("diagnosis.exchange.setup", exc)
            return None
        if self.exchange is not None:
            self.rank = self.exchange.rank
        return self.exchange

    def _on_window(self, index: int, rows: list[RankSummary]) -> None:
        """Exchange thread: every rank's summary of one window."""
        reports = self.stragglers.feed(rows)
        emitter = self.emitter()
        latest = self.stragglers.latest
        if emitter is None or latest is None:
            return
        mine = latest.ranks.get(self.rank) if self.rank is not None else None
        if mine is not None and self.rank is not None:
            emitter.set_skew(self.rank, mine.skew)
        now = time.time_ns()
        for report in reports:
            self.summary.add_straggler(report)  # every rank's verdict names it
            if self.rank == 0:  # one log line, counter and span event per job
                emitter.straggler(report, now)

    # ------------------------------------------------------------------ verdict
    def gpu_health(self) -> dict[str, Any]:
        """GPU state over the run so far (sampler history permitting)."""
        rt = self._runtime_source()
        sampler = getattr(rt, "sampler", None)
        first, last = self.summary.first_ns, self.summary.last_ns
        out: dict[str, Any] = {}
        if sampler is None or first is None or last is None:
            return out
        try:
            windows = sampler.windows(first, last)
            seen = [w for w in windows.values() if w]
            temps = [w.temperature_max_c for w in seen if w.temperature_max_c is not None]
            fracs = [w.throttled_fraction for w in seen if w.throttled_fraction is not None]
            reasons = {r for w in seen for r in w.throttle_reason_names} - {"gpu_idle"}
            found = {  # None, or an empty list: nothing seen, no key
                "temperature_max_c": max(temps, default=None),
                "throttled_fraction": max(fracs, default=None),
                "throttle_reasons": sorted(reasons),
                "xids": sorted({x for w in seen for x in w.xids}),
            }
            out.update((k, v) for k, v in found.items() if v is not None and v != [])
            out["gpus"] = sorted(windows)
            counts = rt.health_counts() if hasattr(rt, "health_counts") else {}
            health: dict[str, int] = {}
            for (kind, _uuid), n in counts.items():
                health[kind] = health.get(kind, 0) + n
            if health:
                out["health_events"] = health
        except Exception as exc:  # noqa: BLE001 - best effort
            self._error("diagnosis.gpu_health", exc)
        return out

    def verdict(self) -> Verdict:
        """The verdict so far (on demand)."""
        self.flush()
        return self.summary.verdict(self.gpu_health())

    def close(self) -> Verdict | None:
        """Stops the exchange, writes the verdict span and logs it. Idempotent."""
        with self._lock:
            if self.closed:
                return None
            self.closed = True
        if self.exchange is not None:
            self.exchange.close()
        self.flush()
        if self.summary.steps == 0:
            return None
        verdict = self.verdict()
        emitter = self.emitter()
        if emitter is not None:
            try:
                emitter.verdict(
                    verdict,
                    self.summary.first_ns or time.time_ns(),
                    time.time_ns(),
                    log=self.settings.verdict_log,
                )
            except Exception as exc:  # noqa: BLE001 - never raise at shutdown
                self._error("diagnosis.verdict", exc)
        return verdict
