"""Pure-Python sampler core: pynvml calls on a Python daemon thread.

The executable specification of ``src_ext/sampler/otg_sampler.h``: the same field
rules (capability bits, lost devices, derived events) and the same window formulas
in the same order of floating-point operations, so both twins give identical
``WindowStats`` for identical samples. Unlike the native core it needs the GIL for
every sample, so a busy application thread slows it down (the benchmark measures
by how much); for the same reason its one thread drains XID events in each sampling
round instead of a second thread waiting for them (``start``).

The GIL and the host: an NVML call releases the GIL, but only for microseconds, and
the sampling thread takes it straight back before a waiting application thread has
even woken up -- so a round of 8 GPUs (~0.3 ms of Python and NVML) plus its pre-warm
would hold the GIL in one stretch, a pause of the application's loop. A round driven
by the loop therefore hands the GIL back (``otelgpu.otel.slicing``) between devices once
its slice is used, and always once right before its samples are published: publishing
and the pre-warm's first summary (``_prewarm``) then run as one short stretch of their
own, so a short request never sees new samples without their summary; the GIL is handed
back once more before the pre-warm's second summary.
The price, under an application thread that never releases the GIL: each hand-back costs
the sampler up to a switch interval to get the GIL back, 10-15 % fewer rounds there
(``benchmarks/bench_sampler.py``, 50 µs NVML calls), where it already reaches only a
fraction of its asked rate.
What a busy host costs each round beyond that: every NVML call drops the GIL, which wakes
a host waiting for it (a futex wake, paid by this thread), and now and then the host wins
the race for the GIL and this thread waits out a switch interval. Measured with a host
spinning in Python, 8 simulated GPUs: ~1.7-1.8 ms of this thread's CPU per round against
~0.26-0.45 ms uncontended, ~9 lost races and ~27-33 host wake-ups a round
(``benchmarks/diag_sampler_contention.py``). Only holding the GIL across NVML calls
(``ctypes.PyDLL``) would avoid it, and a wedged driver call would then freeze the host.

Raw records are ``RawSample`` named tuples, raw windows ``RawWindow`` (``_records``);
the native core returns the same types; the window rules live in ``_window_py``. The
module stays over 600 lines because it mirrors otg_sampler.h section by section (life
cycle, capability checks, every NVML read including GPM, events, the sampling loop):
splitting it further would separate code that must change together with its C twin.

Thread-safety: ``_data_lock`` guards rings and events and is never held across an NVML
call; ``_tick_lock`` serialises sampling rounds (the loop and ``sample_once``), so only
another round ever waits on NVML.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from otelgpu.nvml import NvmlUnavailableError, pynvml_init
from otelgpu.otel import host_work, slicing
from otelgpu.sampler import _fields as F
from otelgpu.sampler import _window_py as W
from otelgpu.sampler._nvml_requests import (
    DeviceReads,
    FieldRequest,
    GpmRequest,
    PublicReads,
    device_reads,
)
from otelgpu.sampler._records import (
    NGPM,
    RAW_SAMPLE_FIELDS,
    RAW_WINDOW_FIELDS,
    ZERO_GPM,
    ZERO_REMAP,
    RawSample,
    RawSummary,
    RawWindow,
)
from otelgpu.sampler._summary_py import summarise

_logger = logging.getLogger(__name__)


_ZERO_THROTTLE = (0,) * len(F.THROTTLE_COUNTERS)

# Where each FIELD_TABLE value goes in a sample: (kind, key or index), kinds below.
_SLOT_VALUE, _SLOT_KIB, _SLOT_THROTTLE, _SLOT_REMAP = range(4)
#: Position of each RawSample field: a sample is filled in a list in RawSample's order
#: (``_Sample.values``), each field written only when its read succeeded.
_I = {name: i for i, name in enumerate(RawSample._fields)}
_I_GPU_UTIL, _I_MEM_UTIL = _I["gpu_util"], _I["mem_util"]
_I_MEM_USED, _I_MEM_TOTAL, _I_MEM_RESERVED = _I["mem_used"], _I["mem_total"], _I["mem_reserved"]
_I_POWER, _I_TEMP = _I["power_mw"], _I["temperature_c"]
_I_SM_CLOCK, _I_MEM_CLOCK, _I_REASONS = _I["sm_clock_mhz"], _I["mem_clock_mhz"], _I["reasons"]
_I_FAN, _I_PSTATE, _I_ENC, _I_DEC = _I["fan_pct"], _I["pstate"], _I["enc_util"], _I["dec_util"]
_I_THROTTLE, _I_REMAP = _I["throttle_ns"], _I["remap"]
_I_GPM_VALID, _I_GPM_DT, _I_GPM = _I["gpm_valid"], _I["gpm_dt_ns"], _I["gpm"]
#: A sample with nothing read: zeros, and the zero tuples.
_EMPTY_VALUES: list[Any] = [0] * len(RawSample._fields)
_EMPTY_VALUES[_I_THROTTLE], _EMPTY_VALUES[_I_REMAP] = _ZERO_THROTTLE, ZERO_REMAP
_EMPTY_VALUES[_I_GPM] = ZERO_GPM

_FIELD_KEYS = {
    F.F_ENERGY: (_SLOT_VALUE, _I["energy_mj"]),
    F.F_ECC_CORR: (_SLOT_VALUE, _I["ecc_corr"]),
    F.F_ECC_UNCORR: (_SLOT_VALUE, _I["ecc_uncorr"]),
    F.F_PCIE_TX: (_SLOT_VALUE, _I["pcie_tx"]),
    F.F_PCIE_RX: (_SLOT_VALUE, _I["pcie_rx"]),
    F.F_NVLINK_TX: (_SLOT_KIB, _I["nvlink_tx"]),  # NVML counts NVLink traffic in KiB
    F.F_NVLINK_RX: (_SLOT_KIB, _I["nvlink_rx"]),
    F.F_MEM_TEMP: (_SLOT_VALUE, _I["mem_temp_c"]),
    F.F_PCIE_REPLAY: (_SLOT_VALUE, _I["pcie_replay"]),
}


def _field_slot(fid: int, bit: int) -> tuple[int, Any]:
    if bit in _FIELD_KEYS:
        return _FIELD_KEYS[bit]
    if bit == F.F_REMAP:
        return (_SLOT_REMAP, fid - F.REMAP_FIRST_FIELD)
    return (_SLOT_THROTTLE, (bit // F.F_THR0).bit_length() - 1)


#: (caps, (bit, slot kind, slot) per field read, the fields' (id, scope) pairs).
_FieldPlan = tuple[int, list[tuple[int, int, Any]], tuple[tuple[int, int], ...]]
_FIELD_SLOTS = tuple((row, _field_slot(row[0], row[2])) for row in F.FIELD_TABLE)
#: Most XID events taken from the event set per sampling round.
_XID_DRAIN_MAX = 64
#: Window parts kept per device (``_Device.memo``), and summaries kept per core; the
#: oldest goes first. A sampling round adds about three of each (``_prewarm``, spans).
_MEMO_SIZE = 32


class _Device:
    __slots__ = (
        "caps",
        "disabled",
        "errors",
        "field_plan",
        "field_request",
        "gpm_caps",
        "gpm_cur",
        "gpm_have_prev",
        "gpm_mg",
        "gpm_plan",
        "gpm_prev_t",
        "gpm_request",
        "gpm_sample",
        "handle",
        "have_prev_ecc",
        "head",
        "last_error",
        "lost",
        "lost_code",
        "lost_t_ns",
        "memo",
        "off_code",
        "prev_ecc_uncorr",
        "prev_throttle",
        "reads",
        "ring",
        "uuid",
    )

    def __init__(self, uuid: str, capacity: int) -> None:
        self.uuid = uuid
        self.ring: list[RawSample | None] = [None] * capacity
        self.reset()

    def reset(self) -> None:
        self.handle: Any = None
        self.caps = F.F_ALL
        self.disabled = 0
        self.lost = False
        self.lost_t_ns = 0
        self.lost_code = 0
        self.errors = 0
        self.last_error = 0
        self.have_prev_ecc = False
        self.prev_ecc_uncorr = 0
        self.prev_throttle = 0
        self.head = 0
        # Window parts (aggregate, GPM means, counter deltas) by the ring positions they
        # come from: back-to-back short spans between two sampler rounds share them.
        self.memo: dict[tuple[int, ...], Any] = {}
        self.off_code = [0] * 32
        # GPM: two samples used alternately, a reusable metrics request, metrics still on.
        self.gpm_sample: list[Any] = [None, None]
        self.gpm_mg: Any = None
        self.gpm_cur = 0
        self.gpm_have_prev = False
        self.gpm_prev_t = 0
        self.gpm_caps = F.GPM_ALL
        # (gpm_caps, positions of the metrics on, their GPM ids), rebuilt when those change
        self.gpm_plan: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None
        # Reusable NVML requests (_nvml_requests), built at first use; the field plan is
        # (caps, (bit, slot kind, slot) of each FIELD_TABLE row still on, their (id, scope)).
        self.field_plan: _FieldPlan | None = None
        self.field_request: FieldRequest | None = None
        self.gpm_request: GpmRequest | None = None
        self.reads: DeviceReads | PublicReads | None = None  # bound to ``handle``


class _Sample:
    """Mutable scratch record filled by one device read: ``values`` in RawSample's order,
    a field written only when its read succeeded (its ``valid`` bit set)."""

    __slots__ = ("nerrors", "status", "valid", "values")

    def __init__(self) -> None:
        self.valid = 0
        self.status = F.STATUS_OK
        self.nerrors = 0
        self.values: list[Any] = _EMPTY_VALUES.copy()


class PyCore:
    """Sampler core with the same interface as the native ``_sampler_c.NativeCore``.

    Args:
        uuids: devices, by UUID, in the order of every ``i`` argument below.
        interval_ns: sampling period.
        capacity: ring slots per device.
        offset_ns: ``time.time_ns() - time.monotonic_ns()`` captured by the caller.
        event_capacity: retained events (oldest overwritten first).
    """

    kind = "python"

    def __init__(
        self,
        uuids: Sequence[str],
        interval_ns: int,
        capacity: int,
        offset_ns: int,
        event_capacity: int,
    ) -> None:
        self._cap = max(2, capacity)
        self._ev_cap = max(16, event_capacity)
        self._interval_ns = interval_ns
        self._offset_ns = offset_ns
        self._dev = [_Device(u, self._cap) for u in uuids]
        self._nvml: Any = None
        self._inited = False
        self._evset: Any = None
        self._xid_handles: dict[int, int] = {}
        self._xids_off = False
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._loop_failed = False
        #: Summaries, and the windows with data behind them, by their devices' window keys
        #: and lost flags, or by ``_after_newest`` keys (see ``summary``).
        self._summary_memo: dict[tuple[Any, ...], tuple[RawSummary, list[_Piece]]] = {}
        self._init_locks()
        self._reset_counters()

    def _init_locks(self) -> None:
        self._data_lock = threading.Lock()
        self._tick_lock = threading.Lock()

    def _reset_counters(self) -> None:
        self._events: list[tuple[int, int, int, int, int] | None] = [None] * self._ev_cap
        self._ev_head = 0
        self._ev_newest_t = 0  # latest t_ns of any event pushed (valid when _ev_head > 0)
        self._ev_dropped = 0
        self._ticks = self._samples = self._dropped = self._overwritten = 0
        self._busy_ns = 0

    def _now(self) -> int:
        return time.monotonic_ns() + self._offset_ns

    # ---- life cycle -----------------------------------------------------------

    def open(self, library: str) -> str | None:
        """nvmlInit and resolve handles by UUID; the error text, or ``None`` on success."""
        if not self._inited:
            try:
                self._nvml = pynvml_init(library)
            except NvmlUnavailableError as exc:
                return str(exc)
            self._inited = True
        nv = self._nvml
        for i, d in enumerate(self._dev):
            try:
                d.handle = nv.nvmlDeviceGetHandleByUUID(d.uuid)
            except nv.NVMLError as exc:  # noqa: PERF203 - one device's failure must not stop the rest
                with self._data_lock:
                    self._mark_lost(i, self._now(), int(exc.value))
        return None

    def probe(self) -> None:
        """One unstored sample per device: switches unsupported fields off, finds lost GPUs."""
        with self._tick_lock:
            for i, d in enumerate(self._dev):
                if d.lost or not self._inited:
                    continue
                s = self._sample_device(d, self._now(), probing=True)
                if s.status == F.STATUS_LOST:
                    with self._data_lock:
                        self._mark_lost(i, self._now(), d.last_error)

    def events_open(self) -> bool:
        """Register XID events on every device; True when XIDs will be delivered."""
        if self._evset is not None:
            return True
        nv = self._nvml
        try:
            evset = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError):
            return False
        registered = 0
        for d in self._dev:
            if d.lost:
                continue
            try:
                if (
                    not nv.nvmlDeviceGetSupportedEventTypes(d.handle)
                    & nv.nvmlEventTypeXidCriticalError
                ):
                    continue
                nv.nvmlDeviceRegisterEvents(d.handle, nv.nvmlEventTypeXidCriticalError, evset)
                registered += 1
            except nv.NVMLError:
                continue
        if not registered:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(evset)
            return False
        self._evset = evset
        return True

    def start(self) -> None:
        """Start the sampling thread; it also drains the XID event set once per round.

        Unlike the native core, no thread waits in ``nvmlEventSetWait``: a Python thread
        whose wait times out (every ``WAIT_MS``) needs the GIL to wait again, and takes it
        from an application thread that runs Python -- ten forced hand-overs a second, the
        largest share of the host's pauses at 50 steps/s. An XID is then seen within one
        sampling interval of its arrival and stamped when seen.
        """
        self._stop.clear()
        self._xid_handles = {
            _address(d.handle): i for i, d in enumerate(self._dev) if d.handle is not None
        }
        self._threads = [
            threading.Thread(target=self._loop, name="otelgpu-sampler-py", daemon=True)
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float) -> bool:
        """Ask the threads to stop and join them; True when all exited in time."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in self._threads if t.is_alive()]
        self._threads = alive
        return not alive

    @property
    def running(self) -> bool:
        """True while a sampling thread is alive."""
        return any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Free GPM samples and the event set, balance nvmlInit (after stop())."""
        nv = self._nvml
        for d in self._dev:
            for k, sample in enumerate(d.gpm_sample):
                if sample is not None and self._inited:
                    with contextlib.suppress(nv.NVMLError):
                        nv.nvmlGpmSampleFree(sample)
                d.gpm_sample[k] = None
            d.gpm_have_prev = False
        if self._evset is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._evset)
            self._evset = None
        if self._inited:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
            self._inited = False

    def after_fork_in_child(self) -> None:
        """Forget the parent's threads, samples, events and NVML state."""
        self._init_locks()
        self._summary_memo = {}
        self._threads = []
        self._stop = threading.Event()
        self._inited = False
        self._evset = None
        self._reset_counters()
        for d in self._dev:
            d.reset()

    # ---- sampling -------------------------------------------------------------

    def _check(self, d: _Device, s: _Sample, bits: int, code: int) -> None:
        if code in F.NOT_SUPPORTED_CODES:
            for k in range(32):
                if bits & (1 << k):
                    d.off_code[k] = code
            d.caps &= ~bits
            d.disabled |= bits
        elif code in F.LOST_CODES:
            s.status = F.STATUS_LOST
            d.last_error = code
        else:
            s.nerrors += 1
            d.errors += 1
            d.last_error = code

    def _read(self, d: _Device, s: _Sample, bits: int, read: Any) -> Any:
        """One bound read (``_nvml_requests.DeviceReads``) for the fields in ``bits``; its
        value, or None when it failed or was not made."""
        if not d.caps & bits or s.status == F.STATUS_LOST:
            return None
        code, value = read()
        if code:
            self._check(d, s, bits, code)
            return None
        s.valid |= bits
        return value

    def _sample_device(self, d: _Device, t_ns: int, probing: bool = False) -> _Sample:
        s = _Sample()
        v = s.values
        r = d.reads
        if r is None or r.handle is not d.handle:
            r = d.reads = device_reads(self._nvml, d.handle)
        util = self._read(d, s, F.F_UTIL, r.utilization)
        if util is not None:
            v[_I_GPU_UTIL], v[_I_MEM_UTIL] = util
        self._read_memory(d, s, r)
        self._read_scalars(
            d,
            s,
            (
                (F.F_POWER, _I_POWER, r.power),
                (F.F_TEMP, _I_TEMP, r.temperature),
                (F.F_SM_CLOCK, _I_SM_CLOCK, r.sm_clock),
                (F.F_MEM_CLOCK, _I_MEM_CLOCK, r.mem_clock),
                (F.F_REASONS, _I_REASONS, r.reasons),
            ),
        )
        self._read_fields(d, s)
        self._read_scalars(
            d,
            s,
            (
                (F.F_FAN, _I_FAN, r.fan),
                (F.F_PSTATE, _I_PSTATE, r.pstate),
                (F.F_ENC, _I_ENC, r.encoder),
                (F.F_DEC, _I_DEC, r.decoder),
            ),
        )
        if d.caps & F.F_GPM and s.status != F.STATUS_LOST:
            self._read_gpm(d, s, t_ns, probing)
        if s.status != F.STATUS_LOST and s.nerrors > 0:
            s.status = F.STATUS_FIELD_ERRORS
        return s

    def _read_scalars(
        self, d: _Device, s: _Sample, reads: tuple[tuple[int, int, Any], ...]
    ) -> None:
        """Each ``(bit, RawSample position, bound read)`` in order (the order of the
        native core's reads, which matters once a device is lost mid-sample)."""
        v = s.values
        for bit, index, read in reads:
            value = self._read(d, s, bit, read)
            if value is not None:
                v[index] = value

    def _read_memory(self, d: _Device, s: _Sample, r: Any) -> None:
        """Memory v2 (used excludes reserved, as nvidia-smi shows) where the driver has
        it, else v1 (used includes reserved) and no reserved field."""
        both = F.F_MEMORY | F.F_MEM_RESERVED
        v = s.values
        if d.caps & both == both and s.status != F.STATUS_LOST:
            code, mem = r.memory_v2()
            if not code:
                s.valid |= both
                v[_I_MEM_USED], v[_I_MEM_TOTAL], v[_I_MEM_RESERVED] = mem
                return
            self._check(d, s, both, code)
            if not d.caps & F.F_MEM_RESERVED:  # v2 unsupported: v1 keeps memory on
                d.caps |= F.F_MEMORY
                d.disabled &= ~F.F_MEMORY
                d.off_code[1] = 0
        if d.caps & F.F_MEM_RESERVED:
            return  # v2 failed for another reason: counted once, no v1 retry
        mem = self._read(d, s, F.F_MEMORY, r.memory_v1)
        if mem is not None:
            v[_I_MEM_USED], v[_I_MEM_TOTAL] = mem

    def _read_gpm(self, d: _Device, s: _Sample, t_ns: int, probing: bool) -> None:
        """GPM as otg_sample_gpm: support check and two samples on first use (the probe
        stops there), then a sample >= 100 ms after the previous and the metrics between."""
        nv = self._nvml
        if d.gpm_sample[0] is None:
            try:
                supported = nv.nvmlGpmQueryDeviceSupport(d.handle).isSupportedDevice
                if not supported:
                    self._check(d, s, F.F_GPM, F.OFF_GPM_DEVICE)
                    return
                d.gpm_sample = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            except nv.NVMLError as exc:
                self._check(d, s, F.F_GPM, _gpm_code(int(exc.value)))
                return
            except AttributeError:
                self._check(d, s, F.F_GPM, 13)
                return
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            d.gpm_mg, d.gpm_cur, d.gpm_have_prev = mg, 0, False
            d.gpm_request = None  # new samples: a request is built for them
        if probing:
            return
        if d.gpm_have_prev and t_ns > d.gpm_prev_t and t_ns - d.gpm_prev_t < F.GPM_MIN_INTERVAL_NS:
            return  # too soon: this sample has no GPM values
        try:
            nv.nvmlGpmSampleGet(d.handle, d.gpm_sample[d.gpm_cur])
        except nv.NVMLError as exc:
            d.gpm_have_prev = False
            self._check(d, s, F.F_GPM, _gpm_code(int(exc.value)))
            return
        if d.gpm_have_prev and t_ns > d.gpm_prev_t and d.gpm_caps:
            self._gpm_metrics(d, s, t_ns)
        d.gpm_prev_t, d.gpm_have_prev, d.gpm_cur = t_ns, True, 1 - d.gpm_cur

    def _gpm_metrics(self, d: _Device, s: _Sample, t_ns: int) -> None:
        nv = self._nvml
        plan = d.gpm_plan
        if plan is None or plan[0] != d.gpm_caps:  # the metrics still on changed
            on = tuple(k for k in range(NGPM) if d.gpm_caps & (1 << k))
            plan = d.gpm_plan = (d.gpm_caps, on, tuple(F.GPM_IDS[k] for k in on))
        idx = plan[1]
        try:
            got = self._gpm_get(d, plan[2])
        except nv.NVMLError as exc:
            self._check(d, s, F.F_GPM, int(exc.value))
            return
        values = list(ZERO_GPM)
        valid = 0
        for k, (code, value) in zip(idx, got, strict=False):
            if code == 0:
                values[k] = float(value)
                valid |= 1 << k
            elif code == 3:
                d.gpm_caps &= ~(1 << k)  # e.g. NVLink rates on a PCIe card
            else:
                s.nerrors += 1
                d.errors += 1
                d.last_error = code
        if valid:
            s.valid |= F.F_GPM
            v = s.values
            v[_I_GPM], v[_I_GPM_VALID] = tuple(values), valid
            v[_I_GPM_DT] = t_ns - d.gpm_prev_t

    def _gpm_get(self, d: _Device, ids: tuple[int, ...]) -> list[tuple[int, float]]:
        """``(nvmlReturn, value)`` of the GPM metrics ``ids`` between the device's two
        samples (the newer one ``gpm_cur``): its reusable request (``_nvml_requests``),
        rebuilt when the metric set changes; else the pynvml structure filled here."""
        req = d.gpm_request
        if req is None or (req.ids is not ids and req.ids != ids):
            try:
                req = d.gpm_request = GpmRequest(self._nvml, d.gpm_sample, ids)
            except (AttributeError, ValueError, TypeError):
                return self._gpm_get_slow(d, ids)
        return req.get(d.gpm_cur)

    def _gpm_get_slow(self, d: _Device, ids: tuple[int, ...]) -> list[tuple[int, float]]:
        mg = d.gpm_mg
        mg.sample1, mg.sample2 = d.gpm_sample[1 - d.gpm_cur], d.gpm_sample[d.gpm_cur]
        for j, mid in enumerate(ids):
            mg.metrics[j].metricId = mid
        mg.numMetrics = len(ids)
        self._nvml.nvmlGpmMetricsGet(mg)
        return [(int(mg.metrics[j].nvmlReturn), mg.metrics[j].value) for j in range(len(ids))]

    def _read_fields(self, d: _Device, s: _Sample) -> None:
        plan = d.field_plan
        if plan is None or plan[0] != d.caps:  # the fields still on changed: a new plan
            rows = [(row, slot) for row, slot in _FIELD_SLOTS if d.caps & row[2]]
            plan = d.field_plan = (
                d.caps,
                [(bit, kind, arg) for (_, _, bit), (kind, arg) in rows],
                tuple((f, sc) for (f, sc, _), _ in rows),
            )
        entries = plan[1]
        if not entries or s.status == F.STATUS_LOST:
            return
        nv = self._nvml
        try:
            values = self._field_values(d, plan[2])
        except nv.NVMLError as exc:
            all_bits = 0
            for bit, _kind, _arg in entries:
                all_bits |= bit
            self._check(d, s, all_bits, int(exc.value))
            return
        throttle = list(_ZERO_THROTTLE)
        remap = list(ZERO_REMAP)
        out = s.values
        valid = 0
        for (bit, kind, arg), (code, value) in zip(entries, values, strict=False):
            if code:
                self._check(d, s, bit, code)
                continue
            valid |= bit
            if kind == _SLOT_VALUE:
                out[arg] = value
            elif kind == _SLOT_KIB:
                out[arg] = value * 1024
            elif kind == _SLOT_THROTTLE:
                throttle[arg] = value
            else:
                remap[arg] = value
        s.valid |= valid
        out[_I_THROTTLE] = tuple(throttle)
        out[_I_REMAP] = tuple(remap)

    def _field_values(
        self, d: _Device, fields: tuple[tuple[int, int], ...]
    ) -> list[tuple[int, int]]:
        """``(nvmlReturn, value)`` of each field: the device's reusable request
        (``_nvml_requests``), rebuilt when its field set changes; pynvml's public call
        where that request cannot be built (another pynvml layout)."""
        req = d.field_request
        if req is None or (req.fields is not fields and req.fields != fields):
            try:
                req = d.field_request = FieldRequest(self._nvml, fields)
            except (AttributeError, ValueError, TypeError):
                values = self._nvml.nvmlDeviceGetFieldValues(d.handle, fields)
                return [
                    (int(fv.nvmlReturn), _field_u64(fv) if fv.nvmlReturn == 0 else 0)
                    for fv in values
                ]
        return req.read(d.handle)

    def _raw(self, t_ns: int, s: _Sample) -> RawSample:
        v = s.values
        v[0], v[1], v[2], v[3] = t_ns, s.valid, s.status, s.nerrors
        return RawSample._make(v)

    # data_lock held for the three helpers below.
    def _push_event(self, t: int, dev: int, kind: int, code: int, detail: int) -> None:
        if self._ev_head >= self._ev_cap:
            self._ev_dropped += 1
        if self._ev_head == 0 or t > self._ev_newest_t:
            self._ev_newest_t = t
        self._events[self._ev_head % self._ev_cap] = (t, dev, kind, code, detail)
        self._ev_head += 1

    def _mark_lost(self, i: int, t: int, code: int) -> None:
        d = self._dev[i]
        if d.lost:
            return
        d.lost, d.lost_t_ns, d.lost_code = True, t, code
        self._push_event(t, i, F.EV_DEVICE_LOST, code, 0)

    def _push_sample(self, i: int, raw: RawSample) -> None:
        d = self._dev[i]
        if d.head > 0:
            prev = d.ring[(d.head - 1) % self._cap]
            assert prev is not None
            if raw.t_ns < prev.t_ns:
                raw = raw._replace(t_ns=prev.t_ns)  # keep each ring sorted by time
        if d.head >= self._cap:
            self._overwritten += 1
        d.ring[d.head % self._cap] = raw
        d.head += 1
        self._samples += 1
        t, valid, status = raw.t_ns, raw.valid, raw.status
        if valid & F.F_ECC_UNCORR:
            unc = raw.ecc_uncorr
            if d.have_prev_ecc and unc > d.prev_ecc_uncorr:
                self._push_event(t, i, F.EV_ECC_UNCORRECTED, unc - d.prev_ecc_uncorr, unc)
            d.prev_ecc_uncorr, d.have_prev_ecc = unc, True
        if valid & F.F_REASONS:
            cur = raw.reasons & F.THROTTLE_MASK
            started = cur & ~d.prev_throttle
            if started:
                self._push_event(t, i, F.EV_THROTTLE_START, started, cur)
            d.prev_throttle = cur
        if status == F.STATUS_LOST:
            self._mark_lost(i, t, d.last_error)

    def _tick(self, t_ns: int, from_loop: bool) -> None:
        """One sampling round. Its samples (each stamped when taken) are stored together
        at its end: every NVML call hands the GIL over, so a round of 8 GPUs can stretch
        over many milliseconds of a busy host, and windows remembered by ring positions
        (``summary``) would change with each GPU's sample instead of once a round."""
        with self._tick_lock:
            taken: list[tuple[int, RawSample]] = []
            # The loop's round hands the GIL back between devices (module docstring);
            # sample_once runs on the caller's thread and keeps it.
            slicer = slicing.Slicer() if from_loop else None
            for i, d in enumerate(self._dev):
                if from_loop and self._stop.is_set():
                    break
                with self._data_lock:
                    lost = d.lost
                if lost or not self._inited:
                    continue
                t = t_ns if t_ns else self._now()
                taken.append((i, self._raw(t, self._sample_device(d, t))))
                if slicer is not None:
                    slicer.tick()
            if slicer is not None and taken:
                slicing.pause()  # publishing and the pre-warm: one fresh, short stretch
            with self._data_lock:
                for i, raw in taken:
                    if not self._dev[i].lost:
                        self._push_sample(i, raw)
            self._ticks += 1

    def sample_once(self, timestamp_ns: int = 0) -> None:
        """Take one sample of every device now (stamped ``timestamp_ns`` unless 0)."""
        self._tick(timestamp_ns, False)

    def _loop(self) -> None:
        host_work.mark_background()
        interval = self._interval_ns
        next_t = time.monotonic_ns()
        while not self._stop.is_set():
            begin = time.monotonic_ns()
            try:
                self._tick(0, True)
                self._prewarm(sliced=True)  # before any NVML call hands the GIL over
                self._drain_xids()
            except Exception:  # the thread must survive anything pynvml throws
                if not self._loop_failed:
                    self._loop_failed = True
                    _logger.warning("otelgpu: sampling round failed", exc_info=True)
            now = time.monotonic_ns()
            self._busy_ns += now - begin
            next_t += interval
            if now - next_t >= interval:
                missed = (now - next_t) // interval
                with self._data_lock:
                    self._dropped += missed
                next_t += missed * interval
            if next_t > now:
                self._stop.wait((next_t - now) / 1e9)

    def _prewarm(self, sliced: bool = False) -> None:
        """Summarise, on the sampling thread, the windows the next spans most likely have:
        one after this round's samples (a short request between two rounds) and one that
        starts between the previous round and this one and ends after it (a step that
        spans this round). Those spans then find their summary, and their devices' window
        parts, remembered instead of computing them on the application's thread.

        ``sliced`` (the loop): the GIL is handed back between the two (each is ~0.1 ms of
        Python for 8 GPUs, twice that on a busy machine). The first, which every short
        request needs, is ready as the samples are published; a span that straddles the
        round and ends during the hand-back computes the second itself."""
        cap = self._cap
        newest = prev = 0
        first_newest = None
        with self._data_lock:
            for d in self._dev:
                if not d.head:
                    continue
                last = d.ring[(d.head - 1) % cap]
                before = d.ring[(d.head - 2) % cap] if d.head > 1 else None
                if last is None:
                    continue
                newest = max(newest, last.t_ns)
                first_newest = min(first_newest or last.t_ns, last.t_ns)
                if before is not None:
                    prev = max(prev, before.t_ns)
        if not newest:
            return
        self.summary(newest + 1, newest + 1)
        if prev and first_newest is not None and prev + 1 < first_newest:
            if sliced:
                slicing.pause()
            self.summary(prev + 1, newest + 1)

    def _drain_xids(self) -> None:
        """Take the XID events waiting in the event set, without waiting (sampling thread)."""
        nv, evset = self._nvml, self._evset
        if evset is None or self._xids_off:
            return
        for _ in range(_XID_DRAIN_MAX):
            try:
                data = nv.nvmlEventSetWait(evset, 0)
            except nv.NVMLError:
                return  # a timeout: none waits (a lost GPU or a failing wait: next round)
            except Exception:  # e.g. a freed event set: keep sampling without XIDs
                self._xids_off = True
                _logger.warning("otelgpu: XID event wait failed; XIDs off", exc_info=True)
                return
            i = self._xid_handles.get(_address(data.device), -1)
            if i < 0 or not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            t, code = self._now(), int(data.eventData)
            with self._data_lock:
                self._push_event(t, i, F.EV_XID, code, int(data.eventType))
                if code == 79:
                    self._mark_lost(i, t, 79)

    # ---- reading --------------------------------------------------------------

    def latest(self, i: int) -> RawSample | None:
        """Device ``i``'s newest raw record, or None."""
        with self._data_lock:
            d = self._dev[i]
            return d.ring[(d.head - 1) % self._cap] if d.head else None

    def window(self, i: int, s_ns: int, e_ns: int) -> RawWindow | None:
        """Raw window statistics of device ``i`` over ``[s_ns, e_ns]`` (see otg_window).

        The rules: samples used are those with ``s <= t <= e``, else the newest before
        ``s``; means over used samples that have the field; counter deltas from the
        newest sample at or before ``s`` (else the first used) to the last used; GPM
        metrics weighted by their intervals over the used samples with ``t > s``.
        """
        if e_ns < s_ns:
            return None
        piece = self._piece(i, s_ns, e_ns)
        return None if piece is None else _raw_window(piece, s_ns, e_ns)

    def _piece(self, i: int, s_ns: int, e_ns: int) -> _Piece | None:
        """Where device ``i``'s window ``[s_ns, e_ns]`` lies in its ring, with the window's
        parts (aggregate, GPM means, counter deltas): remembered by the ring positions
        they come from, computed outside the data lock otherwise. ``None``: no data."""
        cap = self._cap
        used: list[RawSample] = []
        with self._data_lock:
            d = self._dev[i]
            ring, n = d.ring, min(d.head, cap)
            first = d.head - n
            where = W.locate(ring, first, n, cap, s_ns, e_ns)
            if where is None:
                return None
            f, last, a = where
            pa, pb = ring[(first + a) % cap], ring[(first + last) % cap]
            assert pa is not None and pb is not None
            c = f  # GPM means use the used samples after s_ns (all of them when none is)
            while c <= last:
                rec = ring[(first + c) % cap]
                assert rec is not None
                if rec.t_ns > s_ns:
                    break
                c += 1
            # Ring positions never repeat (``head`` only grows until a reset, which
            # replaces the memo), so they name the samples a window's parts come from.
            key = (first + f, first + last, first + a, first + c if c <= last else first + f)
            memo = d.memo
            parts = memo.get(key)
            if parts is None:
                # The gauges' parts depend on the used samples alone, the counter deltas on
                # the two samples they run between: windows that share either (a short
                # window after a round and one straddling it) share that part.
                gauges = memo.get(key[:2] + key[3:])
                deltas = memo.get((key[2], key[1]))
                if gauges is None:
                    used = [ring[(first + k) % cap] for k in range(f, last + 1)]  # type: ignore[misc]
            lost = 1 if d.lost and d.lost_t_ns <= e_ns else 0
        # The records are immutable tuples: aggregate outside the lock.
        if parts is None:
            if gauges is None:
                gauges = (W.aggregate(used), *W.gpm_means(used, s_ns))
                _put(memo, key[:2] + key[3:], gauges)
            if deltas is None:
                deltas = W.counter_deltas(pa, pb)
                _put(memo, (key[2], key[1]), deltas)
            parts = (*gauges, deltas)
            _put(memo, key, parts)
        return _Piece(key, lost, last - f + 1, pa, pb, a < last, parts)

    def summary(self, s_ns: int, e_ns: int, devs: Sequence[int] | None = None) -> RawSummary | None:
        """The windows of devices ``devs`` (indexes, in that order; default all) over
        ``[s_ns, e_ns]`` summed up in one :class:`RawSummary` (rules: ``_summary_py``), with
        the XID codes of their events in the window; ``None`` when none has data.
        Out-of-range indexes are skipped.

        Back-to-back short windows between two sampler rounds use the same samples: the
        summary of those is remembered, and only what depends on the window's bounds
        (energy, XIDs) is computed again, by the same rules and in the same order."""
        ndev = len(self._dev)
        order = range(ndev) if devs is None else [i for i in devs if 0 <= i < ndev]
        if e_ns < s_ns:
            return None
        memo = self._summary_memo
        newest = self._after_newest(order, s_ns, e_ns)
        remembered = None if newest is None else memo.get(newest)
        if remembered is None:
            pieces = [(i, self._piece(i, s_ns, e_ns)) for i in order]
            key = tuple((i, p.key, p.lost) if p is not None else (i,) for i, p in pieces)
            remembered = memo.get(key)
            if remembered is None:
                windows = [(i, p and _raw_window(p, s_ns, e_ns)) for i, p in pieces]
                fresh = summarise(windows, ())
                if fresh is None:
                    return None
                remembered = (fresh, [p for _, p in pieces if p is not None])
                self._remember(key, remembered)
            if newest is not None:
                self._remember(newest, remembered)
        raw, with_data = remembered
        with_energy = _with_energy(raw, with_data, s_ns, e_ns)
        xid_events = self.events(s_ns, e_ns, -1, F.EV_XID)
        if not xid_events:
            return with_energy
        seen = set(raw.devices)
        xids = tuple(sorted({int(e[3]) for e in xid_events if e[1] in seen}))
        return with_energy._replace(xids=xids) if xids else with_energy

    def _remember(self, key: tuple[Any, ...], value: tuple[RawSummary, list[_Piece]]) -> None:
        _put(self._summary_memo, key, value)

    def _after_newest(self, order: Sequence[int], s_ns: int, e_ns: int) -> tuple[Any, ...] | None:
        """A summary key for a window that starts after every device's newest sample (each
        window then uses that sample alone): the devices, their ring heads and lost flags,
        read in one pass under the data lock. ``None`` for any other window."""
        cap = self._cap
        key: list[Any] = [tuple(order)]
        with self._data_lock:
            for i in order:
                d = self._dev[i]
                head = d.head
                if not head:
                    return None
                newest = d.ring[(head - 1) % cap]
                if newest is None or newest.t_ns >= s_ns:
                    return None
                key.append(head)
                key.append(d.lost and d.lost_t_ns <= e_ns)
        return tuple(key)

    def events(self, s_ns: int, e_ns: int, dev: int = -1, kind: int = -1) -> list[tuple[int, ...]]:
        """Retained raw events ``(t, dev, kind, code, detail)`` in ``[s_ns, e_ns]``, oldest first.

        ``dev``/``kind`` filter by device index and event kind; -1 keeps all.
        """
        out: list[tuple[int, ...]] = []
        with self._data_lock:
            if self._ev_head == 0 or self._ev_newest_t < s_ns:
                return out  # a window after the latest event: no walk over the ring
            n = min(self._ev_head, self._ev_cap)
            for k in range(self._ev_head - n, self._ev_head):
                e = self._events[k % self._ev_cap]
                assert e is not None
                if s_ns <= e[0] <= e_ns and dev in (-1, e[1]) and kind in (-1, e[2]):
                    out.append(e)
        return out

    def device_state(self, i: int) -> tuple[int, int, bool, int, int, int, int]:
        """``(caps, disabled, lost, lost_t_ns, lost_code, errors, last_error)``.

        ``disabled``: fields switched off since the last :meth:`take_disabled`.
        """
        with self._data_lock:
            d = self._dev[i]
            return (d.caps, d.disabled, d.lost, d.lost_t_ns, d.lost_code, d.errors, d.last_error)

    def field_off_codes(self, i: int) -> tuple[int, ...]:
        """Per field bit ``k``, the NVML return that switched it off (0: still on)."""
        with self._data_lock:
            return tuple(self._dev[i].off_code)

    def take_disabled(self, i: int) -> int:
        """Fields switched off since the previous call (for logging each once)."""
        with self._data_lock:
            d = self._dev[i]
            disabled, d.disabled = d.disabled, 0
            return disabled

    def event_count(self) -> int:
        """Events ever pushed (retained or not): a change means new events were published.
        One attribute read (the GIL makes it atomic), cheap enough once per step."""
        return self._ev_head

    def counters(self) -> tuple[int, int, int, int, int, int]:
        """``(ticks, samples, dropped, overwritten, events_dropped, busy_ns)``."""
        with self._data_lock:
            return (
                self._ticks,
                self._samples,
                self._dropped,
                self._overwritten,
                self._ev_dropped,
                self._busy_ns,
            )


class _Piece(NamedTuple):
    """One device's window: its memo key, lost flag, sample count, the samples its counter
    deltas run between (``distinct``: two ring slots) and its parts (aggregate, GPM valid
    bits, GPM means, counter deltas)."""

    key: tuple[int, int, int, int]
    lost: int
    samples: int
    pa: RawSample
    pb: RawSample
    distinct: bool
    parts: tuple[Any, int, tuple[float, ...], tuple[int, ...]]


def _raw_window(piece: _Piece, s_ns: int, e_ns: int) -> RawWindow:
    """The ``RawWindow`` of ``piece`` over ``[s_ns, e_ns]`` (its energy scaled to it)."""
    agg, gpm_valid, gpm, deltas = piece.parts
    energy, from_counter = W.energy(piece.pa, piece.pb, piece.distinct, agg, s_ns, e_ns)
    d_ecc_c, d_ecc_u, d_ptx, d_prx, d_ntx, d_nrx, d_replay, delta_bits = deltas
    valid = agg.valid | delta_bits
    if energy is not None:
        valid |= F.F_ENERGY
    if gpm_valid:
        valid |= F.F_GPM
    return RawWindow(
        piece.samples, piece.lost, valid, agg.gpu_util_mean, agg.gpu_util_min,
        agg.gpu_util_max, agg.mem_util_mean, agg.mem_used_peak, agg.mem_total,
        agg.power_mean_w, agg.power_max_w, energy or 0.0, from_counter, agg.temp_max,
        agg.sm_clock_mean, agg.reasons, agg.throttled_fraction, d_ecc_c, d_ecc_u, d_ptx,
        d_prx, d_ntx, d_nrx, agg.mem_reserved, agg.mem_temp_max, d_replay,
        agg.enc_util_mean, agg.dec_util_mean, gpm_valid, gpm,
    )  # fmt: skip


def _with_energy(raw: RawSummary, pieces: list[_Piece], s_ns: int, e_ns: int) -> RawSummary:
    """``raw`` (a remembered summary of the same samples) with the energy of ``[s_ns,
    e_ns]``: each device's as ``window`` computes it, summed in device order as
    ``summarise`` does, so the result equals a fresh summary's."""
    energy, from_counter, any_energy = 0.0, 1, False
    for p in pieces:
        joules, counter = W.energy(p.pa, p.pb, p.distinct, p.parts[0], s_ns, e_ns)
        if joules is not None:
            energy += joules or 0.0
            if not counter:
                from_counter = 0
            any_energy = True
    valid = raw.valid | F.F_ENERGY if any_energy else raw.valid & ~F.F_ENERGY
    if not any_energy:
        energy, from_counter = 0.0, 0
    return raw._replace(valid=valid, energy_j=energy, energy_from_counter=from_counter)


def _put(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """``memo[key] = value``, the oldest entry dropped first past ``_MEMO_SIZE``. Threads
    may race here (the GIL keeps each dict operation whole): a lost race empties it."""
    if len(memo) >= _MEMO_SIZE:
        try:
            del memo[next(iter(memo))]
        except (KeyError, RuntimeError, StopIteration):
            memo.clear()
    memo[key] = value


def _gpm_code(code: int) -> int:
    """A GPM call's NO_PERMISSION switches GPM off for good (as otg_sample_gpm)."""
    return F.OFF_GPM_NO_PERMISSION if code == 4 else code


def _field_u64(fv: Any) -> int:
    """An NVML field value as a non-negative int (valueType per nvml.h)."""
    vt, val = int(fv.valueType), fv.value
    if vt == 0:
        return int(val.dVal) if val.dVal > 0 else 0
    if vt == 1:
        return int(val.uiVal)
    if vt == 2:
        return int(val.ulVal)
    if vt == 4:
        return max(0, int(val.sllVal))
    if vt == 5:
        return max(0, int(val.siVal))
    if vt == 6:
        return int(val.usVal)
    return int(val.ullVal)


def _address(handle: Any) -> int:
    """Address of an NVML handle (a ctypes pointer), for matching event devices."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


__all__ = ["RAW_SAMPLE_FIELDS", "RAW_WINDOW_FIELDS", "PyCore", "RawSample", "RawWindow"]
