"""Pure-Python sampler core: pynvml calls on a Python daemon thread.

The executable specification of ``src_ext/sampler/otg_sampler.h``: the same field
rules (capability bits, lost devices, derived events) and the same window formulas
in the same order of floating-point operations, so both twins give identical
``WindowStats`` for identical samples. Unlike the native core it needs the GIL for
every sample, so a busy application thread slows it down (the benchmark measures
by how much).

Raw records are tuples in the order of ``RAW_SAMPLE_FIELDS``; raw windows in the
order of ``RAW_WINDOW_FIELDS``. Thread-safety: ``_data_lock`` guards rings and
events and is never held across an NVML call; ``_tick_lock`` serialises sampling
rounds (the loop and ``sample_once``), so only another round ever waits on NVML.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from otelgpu.nvml import NvmlUnavailableError, pynvml_init
from otelgpu.sampler import _fields as F

_logger = logging.getLogger(__name__)

RAW_SAMPLE_FIELDS = [
    "t_ns",
    "valid",
    "status",
    "nerrors",
    "gpu_util",
    "mem_util",
    "mem_used",
    "mem_total",
    "power_mw",
    "temperature_c",
    "energy_mj",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "reasons",
    "throttle_ns",
    "pcie_tx",
    "pcie_rx",
    "nvlink_tx",
    "nvlink_rx",
    "ecc_corr",
    "ecc_uncorr",
    "fan_pct",
    "pstate",
]
RAW_WINDOW_FIELDS = [
    "samples",
    "lost",
    "valid",
    "gpu_util_mean",
    "gpu_util_min",
    "gpu_util_max",
    "mem_util_mean",
    "mem_used_peak",
    "mem_total",
    "power_mean_w",
    "power_max_w",
    "energy_j",
    "energy_from_counter",
    "temp_max",
    "sm_clock_mean",
    "reasons",
    "throttled_fraction",
    "ecc_corr_delta",
    "ecc_uncorr_delta",
    "pcie_tx",
    "pcie_rx",
    "nvlink_tx",
    "nvlink_rx",
]

_ZERO_THROTTLE = (0,) * len(F.THROTTLE_COUNTERS)


class _Device:
    __slots__ = (
        "caps",
        "disabled",
        "errors",
        "handle",
        "have_prev_ecc",
        "head",
        "last_error",
        "lost",
        "lost_code",
        "lost_t_ns",
        "prev_ecc_uncorr",
        "prev_throttle",
        "ring",
        "uuid",
    )

    def __init__(self, uuid: str, capacity: int) -> None:
        self.uuid = uuid
        self.ring: list[tuple[Any, ...] | None] = [None] * capacity
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


class _Sample:
    """Mutable scratch record filled by one device read."""

    __slots__ = ("nerrors", "status", "valid", "values")

    def __init__(self) -> None:
        self.valid = 0
        self.status = F.STATUS_OK
        self.nerrors = 0
        self.values: dict[str, Any] = {}


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
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._loop_failed = False
        self._init_locks()
        self._reset_counters()

    def _init_locks(self) -> None:
        self._data_lock = threading.Lock()
        self._tick_lock = threading.Lock()

    def _reset_counters(self) -> None:
        self._events: list[tuple[int, int, int, int, int] | None] = [None] * self._ev_cap
        self._ev_head = 0
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
                s = self._sample_device(d)
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
        """Start the sampling thread (and the XID waiter when events are open)."""
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._loop, name="otelgpu-sampler-py", daemon=True)
        ]
        if self._evset is not None:
            self._threads.append(
                threading.Thread(target=self._waiter, name="otelgpu-xid-py", daemon=True)
            )
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
        """Free the event set and balance nvmlInit (after stop())."""
        nv = self._nvml
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
            d.caps &= ~bits
            d.disabled |= bits
        elif code in F.LOST_CODES:
            s.status = F.STATUS_LOST
            d.last_error = code
        else:
            s.nerrors += 1
            d.errors += 1
            d.last_error = code

    def _read(self, d: _Device, s: _Sample, bits: int, fn: Any, *args: Any) -> Any:
        """Call one pynvml function for the fields in ``bits``; None when it failed."""
        if not d.caps & bits or s.status == F.STATUS_LOST:
            return None
        nv = self._nvml
        try:
            value = fn(d.handle, *args)
        except nv.NVMLError as exc:
            self._check(d, s, bits, int(exc.value))
            return None
        except AttributeError:  # pynvml without this function
            self._check(d, s, bits, 13)
            return None
        s.valid |= bits
        return value

    def _sample_device(self, d: _Device) -> _Sample:
        nv = self._nvml
        s = _Sample()
        v = s.values
        util = self._read(d, s, F.F_UTIL, nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            v["gpu_util"], v["mem_util"] = int(util.gpu), int(util.memory)
        mem = self._read(d, s, F.F_MEMORY, nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            v["mem_used"], v["mem_total"] = int(mem.used), int(mem.total)
        v["power_mw"] = self._read(d, s, F.F_POWER, nv.nvmlDeviceGetPowerUsage)
        v["temperature_c"] = self._read(d, s, F.F_TEMP, nv.nvmlDeviceGetTemperature, 0)
        v["sm_clock_mhz"] = self._read(d, s, F.F_SM_CLOCK, nv.nvmlDeviceGetClockInfo, 1)
        v["mem_clock_mhz"] = self._read(d, s, F.F_MEM_CLOCK, nv.nvmlDeviceGetClockInfo, 2)
        reasons_fn = getattr(
            nv,
            "nvmlDeviceGetCurrentClocksEventReasons",
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        )
        v["reasons"] = self._read(d, s, F.F_REASONS, reasons_fn)
        self._read_fields(d, s)
        v["fan_pct"] = self._read(d, s, F.F_FAN, nv.nvmlDeviceGetFanSpeed)
        v["pstate"] = self._read(d, s, F.F_PSTATE, nv.nvmlDeviceGetPerformanceState)
        if s.status != F.STATUS_LOST and s.nerrors > 0:
            s.status = F.STATUS_FIELD_ERRORS
        return s

    def _read_fields(self, d: _Device, s: _Sample) -> None:
        requests = [(fid, scope, bit) for fid, scope, bit in F.FIELD_TABLE if d.caps & bit]
        if not requests or s.status == F.STATUS_LOST:
            return
        nv = self._nvml
        try:
            values = nv.nvmlDeviceGetFieldValues(d.handle, [(f, sc) for f, sc, _ in requests])
        except nv.NVMLError as exc:
            all_bits = 0
            for _, _, bit in requests:
                all_bits |= bit
            self._check(d, s, all_bits, int(exc.value))
            return
        throttle = list(_ZERO_THROTTLE)
        for (_fid, _scope, bit), fv in zip(requests, values, strict=False):
            if fv.nvmlReturn != 0:
                self._check(d, s, bit, int(fv.nvmlReturn))
                continue
            s.valid |= bit
            value = _field_u64(fv)
            if bit == F.F_ENERGY:
                s.values["energy_mj"] = value
            elif bit == F.F_ECC_CORR:
                s.values["ecc_corr"] = value
            elif bit == F.F_ECC_UNCORR:
                s.values["ecc_uncorr"] = value
            elif bit == F.F_PCIE_TX:
                s.values["pcie_tx"] = value
            elif bit == F.F_PCIE_RX:
                s.values["pcie_rx"] = value
            elif bit == F.F_NVLINK_TX:
                s.values["nvlink_tx"] = value * 1024
            elif bit == F.F_NVLINK_RX:
                s.values["nvlink_rx"] = value * 1024
            else:
                throttle[(bit // F.F_THR0).bit_length() - 1] = value
        s.values["throttle_ns"] = tuple(throttle)

    def _raw(self, t_ns: int, s: _Sample) -> tuple[Any, ...]:
        v = s.values
        valid = s.valid

        def g(key: str, bit: int) -> int:
            value = v.get(key)
            return int(value) if valid & bit and value is not None else 0

        return (
            t_ns, valid, s.status, s.nerrors,
            g("gpu_util", F.F_UTIL), g("mem_util", F.F_UTIL),
            g("mem_used", F.F_MEMORY), g("mem_total", F.F_MEMORY),
            g("power_mw", F.F_POWER), g("temperature_c", F.F_TEMP), g("energy_mj", F.F_ENERGY),
            g("sm_clock_mhz", F.F_SM_CLOCK), g("mem_clock_mhz", F.F_MEM_CLOCK),
            g("reasons", F.F_REASONS), v.get("throttle_ns", _ZERO_THROTTLE),
            g("pcie_tx", F.F_PCIE_TX), g("pcie_rx", F.F_PCIE_RX),
            g("nvlink_tx", F.F_NVLINK_TX), g("nvlink_rx", F.F_NVLINK_RX),
            g("ecc_corr", F.F_ECC_CORR), g("ecc_uncorr", F.F_ECC_UNCORR),
            g("fan_pct", F.F_FAN), g("pstate", F.F_PSTATE),
        )  # fmt: skip

    # data_lock held for the three helpers below.
    def _push_event(self, t: int, dev: int, kind: int, code: int, detail: int) -> None:
        if self._ev_head >= self._ev_cap:
            self._ev_dropped += 1
        self._events[self._ev_head % self._ev_cap] = (t, dev, kind, code, detail)
        self._ev_head += 1

    def _mark_lost(self, i: int, t: int, code: int) -> None:
        d = self._dev[i]
        if d.lost:
            return
        d.lost, d.lost_t_ns, d.lost_code = True, t, code
        self._push_event(t, i, F.EV_DEVICE_LOST, code, 0)

    def _push_sample(self, i: int, raw: tuple[Any, ...]) -> None:
        d = self._dev[i]
        if d.head > 0:
            prev = d.ring[(d.head - 1) % self._cap]
            assert prev is not None
            if raw[0] < prev[0]:
                raw = (prev[0], *raw[1:])  # keep each ring sorted by time
        if d.head >= self._cap:
            self._overwritten += 1
        d.ring[d.head % self._cap] = raw
        d.head += 1
        self._samples += 1
        t, valid, status = raw[0], raw[1], raw[2]
        if valid & F.F_ECC_UNCORR:
            unc = raw[20]
            if d.have_prev_ecc and unc > d.prev_ecc_uncorr:
                self._push_event(t, i, F.EV_ECC_UNCORRECTED, unc - d.prev_ecc_uncorr, unc)
            d.prev_ecc_uncorr, d.have_prev_ecc = unc, True
        if valid & F.F_REASONS:
            cur = raw[13] & F.THROTTLE_MASK
            started = cur & ~d.prev_throttle
            if started:
                self._push_event(t, i, F.EV_THROTTLE_START, started, cur)
            d.prev_throttle = cur
        if status == F.STATUS_LOST:
            self._mark_lost(i, t, d.last_error)

    def _tick(self, t_ns: int, from_loop: bool) -> None:
        with self._tick_lock:
            for i, d in enumerate(self._dev):
                if from_loop and self._stop.is_set():
                    break
                with self._data_lock:
                    lost = d.lost
                if lost or not self._inited:
                    continue
                t = t_ns if t_ns else self._now()
                s = self._sample_device(d)
                raw = self._raw(t, s)
                with self._data_lock:
                    if not d.lost:
                        self._push_sample(i, raw)
            self._ticks += 1

    def sample_once(self, timestamp_ns: int = 0) -> None:
        """Take one sample of every device now (stamped ``timestamp_ns`` unless 0)."""
        self._tick(timestamp_ns, False)

    def _loop(self) -> None:
        interval = self._interval_ns
        next_t = time.monotonic_ns()
        while not self._stop.is_set():
            begin = time.monotonic_ns()
            try:
                self._tick(0, True)
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

    def _waiter(self) -> None:
        nv = self._nvml
        handles = {_address(d.handle): i for i, d in enumerate(self._dev) if d.handle is not None}
        while not self._stop.is_set() and self._evset is not None:
            try:
                data = nv.nvmlEventSetWait(self._evset, F.WAIT_MS)
            except nv.NVMLError as exc:
                if int(exc.value) != F.TIMEOUT_CODE:
                    self._stop.wait(F.WAIT_MS / 1000)  # never busy-spin on a failing wait
                continue
            except Exception:  # e.g. a freed event set: stop waiting, keep sampling
                _logger.warning("otelgpu: XID event wait failed; XIDs off", exc_info=True)
                return
            i = handles.get(_address(data.device), -1)
            if i < 0 or not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            t, code = self._now(), int(data.eventData)
            with self._data_lock:
                self._push_event(t, i, F.EV_XID, code, int(data.eventType))
                if code == 79:
                    self._mark_lost(i, t, 79)

    # ---- reading --------------------------------------------------------------

    def latest(self, i: int) -> tuple[Any, ...] | None:
        """Device ``i``'s newest raw record, or None."""
        with self._data_lock:
            d = self._dev[i]
            return d.ring[(d.head - 1) % self._cap] if d.head else None

    def window(self, i: int, s_ns: int, e_ns: int) -> tuple[Any, ...] | None:
        """Raw window statistics of device ``i`` over ``[s_ns, e_ns]`` (see otg_window)."""
        if e_ns < s_ns:
            return None
        with self._data_lock:
            return self._window_locked(self._dev[i], s_ns, e_ns)

    def _window_locked(self, d: _Device, s_ns: int, e_ns: int) -> tuple[Any, ...] | None:
        cap, ring = self._cap, d.ring
        n = min(d.head, cap)
        first = d.head - n

        def at(k: int) -> tuple[Any, ...]:
            rec = ring[(first + k) % cap]
            assert rec is not None
            return rec

        x, y = 0, n
        while x < y:
            m = x + (y - x) // 2
            if at(m)[0] < s_ns:
                x = m + 1
            else:
                y = m
        lo = x
        y = n
        while x < y:
            m = x + (y - x) // 2
            if at(m)[0] <= e_ns:
                x = m + 1
            else:
                y = m
        hi = x
        if hi > lo:
            f, last = lo, hi - 1
        elif lo > 0:
            f = last = lo - 1
        else:
            return None
        # a: the newest sample at or before s (else the first one used); b: the last used.
        a = lo if (lo < n and at(lo)[0] == s_ns) or lo == 0 else lo - 1
        b = last
        valid = 0
        n_util = sum_gpu = sum_mem = n_power = sum_power = max_power = 0
        n_sm = sum_sm = n_reason = n_throttled = 0
        min_gpu = max_gpu = 0
        peak = total = temp_max = reasons = 0
        for k in range(f, last + 1):
            p = at(k)
            pv = p[1]
            if pv & F.F_UTIL:
                g = p[4]
                if n_util == 0 or g < min_gpu:
                    min_gpu = g
                if n_util == 0 or g > max_gpu:
                    max_gpu = g
                sum_gpu += g
                sum_mem += p[5]
                n_util += 1
            if pv & F.F_MEMORY:
                if not valid & F.F_MEMORY or p[6] > peak:
                    peak = p[6]
                total = p[7]
                valid |= F.F_MEMORY
            if pv & F.F_POWER:
                if n_power == 0 or p[8] > max_power:
                    max_power = p[8]
                sum_power += p[8]
                n_power += 1
            if pv & F.F_TEMP:
                if not valid & F.F_TEMP or p[9] > temp_max:
                    temp_max = p[9]
                valid |= F.F_TEMP
            if pv & F.F_SM_CLOCK:
                sum_sm += p[11]
                n_sm += 1
            if pv & F.F_REASONS:
                reasons |= p[13]
                if p[13] & F.THROTTLE_MASK:
                    n_throttled += 1
                n_reason += 1
        gmean = gmin = gmax = mmean = pmean = pmax = smmean = tfrac = energy = 0.0
        if n_util:
            valid |= F.F_UTIL
            gmean = float(sum_gpu) / float(n_util)
            gmin, gmax = float(min_gpu), float(max_gpu)
            mmean = float(sum_mem) / float(n_util)
        if n_power:
            valid |= F.F_POWER
            pmean = float(sum_power) / float(n_power) / 1000.0
            pmax = float(max_power) / 1000.0
        if n_sm:
            valid |= F.F_SM_CLOCK
            smmean = float(sum_sm) / float(n_sm)
        if n_reason:
            valid |= F.F_REASONS
            tfrac = float(n_throttled) / float(n_reason)
        pa, pb = at(a), at(b)
        both = pa[1] & pb[1]
        from_counter = 0
        if (
            a < b
            and both & F.F_ENERGY
            and pb[10] >= pa[10]
            and e_ns - s_ns >= F.ENERGY_MIN_SPAN_NS
            and pb[0] - pa[0] >= F.ENERGY_MIN_SPAN_NS
        ):
            energy = float(pb[10] - pa[10]) * float(e_ns - s_ns) / float(pb[0] - pa[0]) / 1000.0
            from_counter = 1
            valid |= F.F_ENERGY
        elif n_power:
            energy = pmean * float(e_ns - s_ns) / 1e9
            valid |= F.F_ENERGY
        deltas = []
        for bit, idx in (
            (F.F_ECC_CORR, 19),
            (F.F_ECC_UNCORR, 20),
            (F.F_PCIE_TX, 15),
            (F.F_PCIE_RX, 16),
            (F.F_NVLINK_TX, 17),
            (F.F_NVLINK_RX, 18),
        ):
            if both & bit and pb[idx] >= pa[idx]:
                deltas.append(pb[idx] - pa[idx])
                valid |= bit
            else:
                deltas.append(0)
        lost = 1 if d.lost and d.lost_t_ns <= e_ns else 0
        return (
            last - f + 1, lost, valid, gmean, gmin, gmax, mmean, peak, total, pmean, pmax,
            energy, from_counter, temp_max, smmean, reasons, tfrac, *deltas,
        )  # fmt: skip

    def events(self, s_ns: int, e_ns: int, dev: int = -1, kind: int = -1) -> list[tuple[int, ...]]:
        """Retained raw events ``(t, dev, kind, code, detail)`` in ``[s_ns, e_ns]``, oldest first.

        ``dev``/``kind`` filter by device index and event kind; -1 keeps all.
        """
        out: list[tuple[int, ...]] = []
        with self._data_lock:
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

    def take_disabled(self, i: int) -> int:
        """Fields switched off since the previous call (for logging each once)."""
        with self._data_lock:
            d = self._dev[i]
            disabled, d.disabled = d.disabled, 0
            return disabled

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


__all__ = ["RAW_SAMPLE_FIELDS", "RAW_WINDOW_FIELDS", "PyCore"]
