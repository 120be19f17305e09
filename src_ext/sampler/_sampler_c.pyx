# cython: language_level=3, embedsignature=True
"""Native sampler core: the C loop of otg_sampler.h on threads that never hold the GIL.

``NativeCore`` has exactly the interface of ``otelgpu.sampler._core_py.PyCore``
(the executable specification); ``otelgpu.sampler.GpuSampler`` drives either. The
sampling loop and the XID waiter run inside ``with nogil`` for their whole life:
they call only ``noexcept nogil`` C functions, allocate no Python objects and
never raise. Python objects are created only by the query methods, on the
caller's thread, from records copied out under a short C mutex.

Queries over a short window (up to ``SHORT_WINDOW_SAMPLES`` sampling periods: the span
of a step or of a request, seconds long at 10 Hz) keep the GIL: they touch at most a
thousand samples per device (~10 µs), and releasing the GIL there, once per device,
handed it to any waiting thread (otelgpu's export thread, say), which the caller -- the
host's training or serving loop -- then had to wait for. No holder of the data mutex ever
waits for the GIL (the sampling loop and the waiter never take it), so taking the mutex
with the GIL held cannot deadlock. Longer windows (a report over minutes of samples)
release the GIL while the C code walks them. ``latest`` and ``take_disabled`` (O(1))
keep it too: the metric reader calls them for every device on every collection, and
each release was a GIL hand-over the host paid for.
"""

import threading

from otelgpu.sampler._records import RawSample, RawSummary, RawWindow

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strncpy

#: Windows up to this many sampling periods are read with the GIL held (module docstring).
cdef uint64_t SHORT_WINDOW_SAMPLES = 1024


cdef inline bint _long_window(int64_t s_ns, int64_t e_ns, uint64_t short_ns) noexcept nogil:
    # unsigned difference: defined for any pair of int64 bounds
    return e_ns > s_ns and <uint64_t>e_ns - <uint64_t>s_ns > short_ns

cdef extern from "otg_sampler.h" nogil:
    ctypedef struct otg_nvml_t:
        char error[512]

    ctypedef struct otg_sample_t:
        int64_t t_ns
        uint32_t valid, status, nerrors
        uint32_t gpu_util, mem_util
        uint64_t mem_used, mem_total
        uint32_t power_mw, temperature_c
        uint64_t energy_mj
        uint32_t sm_clock_mhz, mem_clock_mhz
        uint64_t reasons
        uint64_t throttle_ns[8]
        uint64_t pcie_tx, pcie_rx, nvlink_tx, nvlink_rx
        uint64_t ecc_corr, ecc_uncorr
        uint32_t fan_pct, pstate
        uint64_t mem_reserved
        uint32_t mem_temp_c, pcie_replay
        uint32_t remap[4]
        uint32_t enc_util, dec_util
        uint32_t gpm_valid
        int64_t gpm_dt_ns
        double gpm[17]

    ctypedef struct otg_event_t:
        int64_t t_ns
        int32_t dev, kind
        uint64_t code, detail

    ctypedef struct otg_device_t:
        char uuid[96]
        uint32_t caps, disabled
        int lost
        int64_t lost_t_ns
        uint64_t lost_code, errors
        unsigned int last_error
        uint32_t off_code[32]

    ctypedef struct otg_window_t:
        uint64_t samples
        int lost
        uint32_t valid
        double gpu_util_mean, gpu_util_min, gpu_util_max, mem_util_mean
        uint64_t mem_used_peak, mem_total
        double power_mean_w, power_max_w, energy_j
        int energy_from_counter
        uint32_t temp_max
        double sm_clock_mean
        uint64_t reasons
        double throttled_fraction
        uint64_t ecc_corr_delta, ecc_uncorr_delta, pcie_tx, pcie_rx, nvlink_tx, nvlink_rx
        uint64_t mem_reserved
        uint32_t mem_temp_max
        uint64_t pcie_replay_delta
        double enc_util_mean, dec_util_mean
        uint32_t gpm_valid
        double gpm[17]

    ctypedef struct otg_state_t:
        otg_nvml_t nvml
        int inited, ndev
        otg_device_t *dev
        uint64_t ticks, samples, dropped, overwritten, ev_dropped, ev_cap, ev_head
        int64_t busy_ns
        void *evset

    otg_state_t *otg_create(int ndev, uint64_t cap, int64_t interval_ns, int64_t offset_ns,
                            uint64_t ev_cap)
    void otg_destroy(otg_state_t *st)
    int otg_open(otg_state_t *st, const char *path)
    void otg_probe(otg_state_t *st)
    int otg_events_open(otg_state_t *st)
    void otg_close(otg_state_t *st)
    void otg_tick(otg_state_t *st, int64_t t_ns, int from_loop)
    void otg_loop(otg_state_t *st)
    void otg_waiter(otg_state_t *st)
    void otg_request_stop(otg_state_t *st)
    void otg_clear_stop(otg_state_t *st)
    int otg_latest(otg_state_t *st, int i, otg_sample_t *out)
    int otg_window(otg_state_t *st, int i, int64_t s_ns, int64_t e_ns, otg_window_t *w)
    int otg_events_copy(otg_state_t *st, int64_t s_ns, int64_t e_ns, int dev, int kind,
                        otg_event_t *out, int maxn)
    void otg_after_fork(otg_state_t *st)
    void otg_lock_data(otg_state_t *st)
    void otg_unlock_data(otg_state_t *st)
    uint32_t otg_take_disabled(otg_state_t *st, int i)
    int OTG_NTHROTTLE, OTG_NFIELDS, OTG_NGPM
    uint32_t OTG_F_UTIL, OTG_F_MEMORY, OTG_F_POWER, OTG_F_ENERGY, OTG_F_TEMP, OTG_F_SM_CLOCK
    uint32_t OTG_F_MEM_CLOCK, OTG_F_REASONS, OTG_F_THR0, OTG_F_PCIE_TX, OTG_F_PCIE_RX
    uint32_t OTG_F_NVLINK_TX, OTG_F_NVLINK_RX, OTG_F_ECC_CORR, OTG_F_ECC_UNCORR, OTG_F_FAN
    uint32_t OTG_F_PSTATE, OTG_F_MEM_RESERVED, OTG_F_MEM_TEMP, OTG_F_PCIE_REPLAY, OTG_F_REMAP
    uint32_t OTG_F_ENC, OTG_F_DEC, OTG_F_GPM, OTG_F_ALL, OTG_GPM_ALL
    uint32_t OTG_STATUS_OK, OTG_STATUS_FIELD_ERRORS, OTG_STATUS_LOST, OTG_OFF_GPM_DEVICE
    uint32_t OTG_OFF_GPM_NO_PERMISSION
    unsigned long long OTG_THROTTLE_MASK
    long long OTG_ENERGY_MIN_SPAN_NS, OTG_GPM_MIN_INTERVAL_NS
    unsigned int OTG_WAIT_MS, OTG_SCOPE_ALL_LINKS
    int OTG_EV_XID, OTG_EV_ECC_UNCORRECTED, OTG_EV_DEVICE_LOST, OTG_EV_THROTTLE_START

    const unsigned int OTG_GPM_IDS[17]


cdef extern from *:
    """
    static unsigned int otg_field_id(int k) { return OTG_FIELD_TABLE[k].id; }
    static unsigned int otg_field_scope(int k) { return OTG_FIELD_TABLE[k].scope; }
    static uint32_t otg_field_bit(int k) { return OTG_FIELD_TABLE[k].bit; }
    """
    unsigned int otg_field_id(int k)
    unsigned int otg_field_scope(int k)
    uint32_t otg_field_bit(int k)


def constants():
    """The C header's contract, for comparison with ``otelgpu.sampler._fields``.

    Returns a dict: field bits (``F_*``), status codes, masks and limits, event kinds,
    ``FIELD_TABLE`` (id, scope, bit) in request order and ``GPM_IDS`` (NVML metric ids).
    """
    return {
        "F_UTIL": OTG_F_UTIL, "F_MEMORY": OTG_F_MEMORY, "F_POWER": OTG_F_POWER,
        "F_ENERGY": OTG_F_ENERGY, "F_TEMP": OTG_F_TEMP, "F_SM_CLOCK": OTG_F_SM_CLOCK,
        "F_MEM_CLOCK": OTG_F_MEM_CLOCK, "F_REASONS": OTG_F_REASONS, "F_THR0": OTG_F_THR0,
        "F_PCIE_TX": OTG_F_PCIE_TX, "F_PCIE_RX": OTG_F_PCIE_RX,
        "F_NVLINK_TX": OTG_F_NVLINK_TX, "F_NVLINK_RX": OTG_F_NVLINK_RX,
        "F_ECC_CORR": OTG_F_ECC_CORR, "F_ECC_UNCORR": OTG_F_ECC_UNCORR, "F_FAN": OTG_F_FAN,
        "F_PSTATE": OTG_F_PSTATE, "F_MEM_RESERVED": OTG_F_MEM_RESERVED,
        "F_MEM_TEMP": OTG_F_MEM_TEMP, "F_PCIE_REPLAY": OTG_F_PCIE_REPLAY,
        "F_REMAP": OTG_F_REMAP, "F_ENC": OTG_F_ENC, "F_DEC": OTG_F_DEC, "F_GPM": OTG_F_GPM,
        "F_ALL": OTG_F_ALL, "GPM_ALL": OTG_GPM_ALL,
        "STATUS_OK": OTG_STATUS_OK, "STATUS_FIELD_ERRORS": OTG_STATUS_FIELD_ERRORS,
        "STATUS_LOST": OTG_STATUS_LOST, "OFF_GPM_DEVICE": OTG_OFF_GPM_DEVICE,
        "OFF_GPM_NO_PERMISSION": OTG_OFF_GPM_NO_PERMISSION,
        "THROTTLE_MASK": OTG_THROTTLE_MASK, "ENERGY_MIN_SPAN_NS": OTG_ENERGY_MIN_SPAN_NS,
        "GPM_MIN_INTERVAL_NS": OTG_GPM_MIN_INTERVAL_NS, "WAIT_MS": OTG_WAIT_MS,
        "SCOPE_ALL_LINKS": OTG_SCOPE_ALL_LINKS, "NTHROTTLE": OTG_NTHROTTLE,
        "EV_XID": OTG_EV_XID, "EV_ECC_UNCORRECTED": OTG_EV_ECC_UNCORRECTED,
        "EV_DEVICE_LOST": OTG_EV_DEVICE_LOST, "EV_THROTTLE_START": OTG_EV_THROTTLE_START,
        "FIELD_TABLE": tuple(
            (otg_field_id(k), otg_field_scope(k), otg_field_bit(k)) for k in range(OTG_NFIELDS)
        ),
        "GPM_IDS": tuple(OTG_GPM_IDS[k] for k in range(OTG_NGPM)),
    }


cdef inline bint _worse(int lost, int ecc, double tfrac, double util,
                        int o_lost, int o_ecc, double o_tfrac, double o_util) noexcept:
    """(lost, ecc, tfrac, -util) > (o_lost, o_ecc, o_tfrac, -o_util), as tuples compare."""
    if lost != o_lost:
        return lost > o_lost
    if ecc != o_ecc:
        return ecc > o_ecc
    if tfrac != o_tfrac:
        return tfrac > o_tfrac
    return util < o_util


cdef class NativeCore:
    """Sampler core in C; see ``PyCore`` for the contract of every method.

    Args:
        uuids: devices by UUID (index i everywhere below).
        interval_ns: sampling period.
        capacity: ring slots per device.
        offset_ns: ``time.time_ns() - time.monotonic_ns()`` captured by the caller.
        event_capacity: retained events.
    """

    cdef otg_state_t *_st
    cdef object _threads
    cdef int _ndev
    cdef uint64_t _short_ns
    cdef public str kind

    def __cinit__(self, uuids, int64_t interval_ns, uint64_t capacity, int64_t offset_ns,
                  uint64_t event_capacity):
        cdef bytes raw
        self._ndev = len(uuids)
        self._short_ns = <uint64_t>(interval_ns if interval_ns > 0 else 1) * SHORT_WINDOW_SAMPLES
        self._st = otg_create(self._ndev, capacity, interval_ns, offset_ns, event_capacity)
        if self._st == NULL:
            raise MemoryError("otelgpu: cannot allocate the sampler's ring buffers")
        for i, uuid in enumerate(uuids):
            raw = uuid.encode()
            strncpy(self._st.dev[i].uuid, raw, 95)
        self._threads = []
        self.kind = "native"

    def __dealloc__(self):
        # Threads hold a reference to self (bound methods), so none runs here.
        if self._st != NULL:
            otg_destroy(self._st)
            self._st = NULL

    def open(self, str library):
        """nvmlInit through the dlopen/dlsym table; the error text, or None."""
        cdef bytes path = library.encode()
        cdef const char *cpath = path
        cdef int rc
        with nogil:
            rc = otg_open(self._st, cpath)
        if rc != 0:
            return self._st.nvml.error.decode(errors="replace")
        return None

    def probe(self):
        """One unstored sample per device: capability bits and lost devices."""
        with nogil:
            otg_probe(self._st)

    def events_open(self):
        """Register XID events; True when they will be delivered."""
        cdef int rc
        with nogil:
            rc = otg_events_open(self._st)
        return rc == 0

    def _run_loop(self):
        with nogil:
            otg_loop(self._st)

    def _run_waiter(self):
        with nogil:
            otg_waiter(self._st)

    def start(self):
        """Start the sampling thread (and the XID waiter when events are open)."""
        otg_clear_stop(self._st)
        threads = [threading.Thread(target=self._run_loop, name="otelgpu-sampler", daemon=True)]
        if self._st.evset != NULL:
            threads.append(
                threading.Thread(target=self._run_waiter, name="otelgpu-xid", daemon=True)
            )
        self._threads = threads
        for t in threads:
            t.start()

    def stop(self, double timeout_s):
        """Ask the threads to stop and join them; True when all exited in time."""
        import time
        with nogil:
            otg_request_stop(self._st)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in self._threads if t.is_alive()]
        self._threads = alive
        return not alive

    @property
    def running(self):
        """True while a sampling thread is alive."""
        return any(t.is_alive() for t in self._threads)

    def close(self):
        """Free the event set and balance nvmlInit (after stop())."""
        with nogil:
            otg_close(self._st)

    def after_fork_in_child(self):
        """Forget the parent's threads, samples, events and NVML state."""
        self._threads = []
        otg_after_fork(self._st)

    def sample_once(self, int64_t timestamp_ns=0):
        """Take one sample of every device now (stamped timestamp_ns unless 0)."""
        with nogil:
            otg_tick(self._st, timestamp_ns, 0)

    def latest(self, int i):
        """Device i's newest raw record (a ``RawSample``), or None."""
        cdef otg_sample_t s
        cdef int found
        if i < 0 or i >= self._ndev:
            return None
        found = otg_latest(self._st, i, &s)  # O(1) under the data mutex: GIL kept
        if not found:
            return None
        return RawSample(
            s.t_ns, s.valid, s.status, s.nerrors, s.gpu_util, s.mem_util, s.mem_used,
            s.mem_total, s.power_mw, s.temperature_c, s.energy_mj, s.sm_clock_mhz,
            s.mem_clock_mhz, s.reasons,
            (s.throttle_ns[0], s.throttle_ns[1], s.throttle_ns[2], s.throttle_ns[3],
             s.throttle_ns[4], s.throttle_ns[5], s.throttle_ns[6], s.throttle_ns[7]),
            s.pcie_tx, s.pcie_rx, s.nvlink_tx, s.nvlink_rx, s.ecc_corr, s.ecc_uncorr,
            s.fan_pct, s.pstate, s.mem_reserved, s.mem_temp_c, s.pcie_replay,
            (s.remap[0], s.remap[1], s.remap[2], s.remap[3]), s.enc_util, s.dec_util,
            s.gpm_valid, s.gpm_dt_ns, tuple(s.gpm[k] for k in range(OTG_NGPM)),
        )

    def window(self, int i, int64_t s_ns, int64_t e_ns):
        """Raw window statistics (a ``RawWindow``), or None."""
        cdef otg_window_t w
        cdef int found
        if i < 0 or i >= self._ndev:
            return None
        if _long_window(s_ns, e_ns, self._short_ns):
            with nogil:
                found = otg_window(self._st, i, s_ns, e_ns, &w)
        else:
            found = otg_window(self._st, i, s_ns, e_ns, &w)
        if not found:
            return None
        return RawWindow(
            w.samples, w.lost, w.valid, w.gpu_util_mean, w.gpu_util_min, w.gpu_util_max,
            w.mem_util_mean, w.mem_used_peak, w.mem_total, w.power_mean_w, w.power_max_w,
            w.energy_j, w.energy_from_counter, w.temp_max, w.sm_clock_mean, w.reasons,
            w.throttled_fraction, w.ecc_corr_delta, w.ecc_uncorr_delta, w.pcie_tx, w.pcie_rx,
            w.nvlink_tx, w.nvlink_rx, w.mem_reserved, w.mem_temp_max, w.pcie_replay_delta,
            w.enc_util_mean, w.dec_util_mean, w.gpm_valid,
            tuple(w.gpm[k] for k in range(OTG_NGPM)),
        )

    def summary(self, int64_t s_ns, int64_t e_ns, devs=None):
        """The windows of devices ``devs`` summed up in one ``RawSummary`` (see
        ``PyCore.summary``: same rules, same floating-point order), or None."""
        cdef otg_window_t w
        cdef int i, k, found
        cdef uint64_t count = 0, samples = 0, peak = 0, reasons = 0, eccu = 0, bad_ecc
        cdef uint32_t valid = 0, temp = 0, gpm_bits = 0
        cdef double util_sum = 0.0, mem_util_sum = 0.0, util_min = 0.0, util_max = 0.0
        cdef double energy = 0.0, tfrac, tfrac_max = 0.0, gmean
        cdef uint64_t util_n = 0
        cdef int from_counter = 1
        cdef int worst = -1, w_lost = 0, w_ecc = 0
        cdef double w_tfrac = 0.0, w_util = 0.0
        cdef int s_lost, s_ecc
        cdef double gpm_sums[17]
        cdef uint64_t gpm_counts[17]
        for k in range(OTG_NGPM):
            gpm_sums[k] = 0.0
            gpm_counts[k] = 0
        lost = []
        throttled = []
        seen = []
        cdef bint release = _long_window(s_ns, e_ns, self._short_ns)
        order = range(self._ndev) if devs is None else devs
        for i in order:
            if i < 0 or i >= self._ndev:
                continue
            if release:
                with nogil:
                    found = otg_window(self._st, i, s_ns, e_ns, &w)
            else:
                found = otg_window(self._st, i, s_ns, e_ns, &w)
            if not found:
                continue
            seen.append(i)
            count += 1
            samples += w.samples
            gmean = 0.0
            if w.valid & OTG_F_UTIL:
                gmean = w.gpu_util_mean
                if not (valid & OTG_F_UTIL) or gmean < util_min:
                    util_min = gmean
                if not (valid & OTG_F_UTIL) or w.gpu_util_max > util_max:
                    util_max = w.gpu_util_max
                util_sum += gmean
                mem_util_sum += w.mem_util_mean
                util_n += 1
                valid |= OTG_F_UTIL
            if w.valid & OTG_F_MEMORY:
                if not (valid & OTG_F_MEMORY) or w.mem_used_peak > peak:
                    peak = w.mem_used_peak
                valid |= OTG_F_MEMORY
            if w.valid & OTG_F_ENERGY:
                energy += w.energy_j
                if not w.energy_from_counter:
                    from_counter = 0
                valid |= OTG_F_ENERGY
            if w.valid & OTG_F_TEMP:
                if not (valid & OTG_F_TEMP) or w.temp_max > temp:
                    temp = w.temp_max
                valid |= OTG_F_TEMP
            tfrac = 0.0
            if w.valid & OTG_F_REASONS:
                tfrac = w.throttled_fraction
                reasons |= w.reasons
                if tfrac > 0:
                    throttled.append(i)
                    if tfrac > tfrac_max:
                        tfrac_max = tfrac
                valid |= OTG_F_REASONS
            bad_ecc = w.ecc_uncorr_delta if w.valid & OTG_F_ECC_UNCORR else 0
            eccu += bad_ecc
            if w.lost:
                lost.append(i)
            # (lost, new uncorrected ECC, throttled share, -utilization), largest wins
            s_lost = 1 if w.lost else 0
            s_ecc = 1 if bad_ecc > 0 else 0
            if worst < 0 or _worse(s_lost, s_ecc, tfrac, gmean, w_lost, w_ecc, w_tfrac, w_util):
                worst, w_lost, w_ecc, w_tfrac, w_util = i, s_lost, s_ecc, tfrac, gmean
            if w.valid & OTG_F_GPM:
                for k in range(OTG_NGPM):
                    if (w.gpm_valid >> k) & 1:
                        gpm_sums[k] += w.gpm[k]
                        gpm_counts[k] += 1
        if count == 0:
            return None
        means = []
        for k in range(OTG_NGPM):
            if gpm_counts[k]:
                means.append(gpm_sums[k] / <double>gpm_counts[k])
                gpm_bits |= 1u << k
            else:
                means.append(0.0)
        if gpm_bits:
            valid |= OTG_F_GPM
        xids = ()
        events = self.events(s_ns, e_ns, -1, OTG_EV_XID)
        if events:
            wanted = set(seen)
            xids = sorted({e[3] for e in events if e[1] in wanted})
        return RawSummary(
            count, tuple(seen), samples, valid,
            util_sum / <double>util_n if util_n else 0.0, util_min, util_max,
            mem_util_sum / <double>util_n if util_n else 0.0, peak,
            energy if valid & OTG_F_ENERGY else 0.0,
            from_counter if valid & OTG_F_ENERGY else 0,
            temp, tfrac_max, reasons, eccu, worst, tuple(lost), tuple(throttled), tuple(xids),
            gpm_bits, tuple(means),
        )

    def events(self, int64_t s_ns, int64_t e_ns, int dev=-1, int kind=-1):
        """Retained raw events (t, dev, kind, code, detail) in [s_ns, e_ns], oldest first."""
        cdef otg_event_t small[32]
        cdef otg_event_t *buf = small
        cdef int maxn = 32
        cdef int n
        if _long_window(s_ns, e_ns, self._short_ns):
            with nogil:
                n = otg_events_copy(self._st, s_ns, e_ns, dev, kind, buf, maxn)
        else:
            n = otg_events_copy(self._st, s_ns, e_ns, dev, kind, buf, maxn)
        if n == maxn:  # maybe more: copy again into a buffer for the whole ring
            maxn = <int>self._st.ev_cap
            buf = <otg_event_t *>malloc(maxn * sizeof(otg_event_t))
            if buf == NULL:
                raise MemoryError()
            with nogil:
                n = otg_events_copy(self._st, s_ns, e_ns, dev, kind, buf, maxn)
        try:
            return [(buf[k].t_ns, buf[k].dev, buf[k].kind, buf[k].code, buf[k].detail)
                    for k in range(n)]
        finally:
            if buf != small:
                free(buf)

    def device_state(self, int i):
        """(caps, disabled, lost, lost_t_ns, lost_code, errors, last_error)."""
        if i < 0 or i >= self._ndev:  # never index the C array out of bounds
            raise IndexError(f"device index {i} out of range")
        cdef otg_device_t *d = &self._st.dev[i]
        otg_lock_data(self._st)
        result = (d.caps, d.disabled, bool(d.lost), d.lost_t_ns, d.lost_code, d.errors,
                  d.last_error)
        otg_unlock_data(self._st)
        return result

    def field_off_codes(self, int i):
        """Per field bit k, the NVML return that switched it off (0: still on)."""
        if i < 0 or i >= self._ndev:
            raise IndexError(f"device index {i} out of range")
        otg_lock_data(self._st)
        result = tuple(self._st.dev[i].off_code[k] for k in range(32))
        otg_unlock_data(self._st)
        return result

    def take_disabled(self, int i):
        """Fields switched off since the previous call (for logging each once)."""
        cdef uint32_t disabled
        if i < 0 or i >= self._ndev:
            raise IndexError(f"device index {i} out of range")
        disabled = otg_take_disabled(self._st, i)  # O(1) under the data mutex: GIL kept
        return disabled

    def event_count(self):
        """Events ever pushed (retained or not): a change means new events were published.
        One short hold of the data mutex, so it is cheap enough to read once per step."""
        cdef otg_state_t *st = self._st
        cdef uint64_t n
        otg_lock_data(st)
        n = st.ev_head
        otg_unlock_data(st)
        return n

    def counters(self):
        """(ticks, samples, dropped, overwritten, events_dropped, busy_ns)."""
        cdef otg_state_t *st = self._st
        otg_lock_data(st)
        result = (st.ticks, st.samples, st.dropped, st.overwritten, st.ev_dropped, st.busy_ns)
        otg_unlock_data(st)
        return result


def summary_attributes(summary, uuids, bint listed, gpm_attributes, names):
    """Native twin of ``otelgpu.otel.gpu_summary.py_summary_attributes``: the span
    attributes of a ``RawSummary`` (same keys, order, values and types)."""
    if not isinstance(summary, tuple) or len(summary) != 21:
        raise TypeError("summary_attributes() takes a RawSummary")
    cdef tuple raw = <tuple>summary  # a NamedTuple: read by position
    n = raw[0]
    cdef uint32_t valid = raw[3]
    cdef uint32_t gpm_valid = raw[19]
    cdef int slot
    cdef dict out = {"otelgpu.gpu.count": n}
    if valid & OTG_F_UTIL:
        out["otelgpu.gpu.utilization.mean"] = <double>raw[4] * 0.01
        out["otelgpu.gpu.utilization.max"] = <double>raw[6] * 0.01
        out["otelgpu.gpu.memory.utilization.mean"] = <double>raw[7] * 0.01
        if n > 1:
            out["otelgpu.gpu.utilization.min"] = <double>raw[5] * 0.01
    if valid & OTG_F_MEMORY:
        out["otelgpu.gpu.memory.peak"] = int(raw[8])
    if valid & OTG_F_ENERGY:
        out["otelgpu.gpu.energy"] = raw[9]
        out["otelgpu.gpu.energy.source"] = "counter" if raw[10] else "power"
    if valid & OTG_F_TEMP:
        out["otelgpu.gpu.temperature.max"] = float(raw[11])
    out["otelgpu.gpu.samples"] = int(raw[2])
    if gpm_valid:
        gpm = raw[20]
        for slot, attribute in gpm_attributes:
            if gpm_valid >> slot & 1:
                out[attribute] = <double>gpm[slot] * 0.01
    worst = raw[15]
    if n == 1:
        out["hw.id"] = uuids[worst]
    else:
        out["otelgpu.gpu.worst.id"] = uuids[worst]
        if listed:
            out["otelgpu.gpu.ids"] = [uuids[i] for i in raw[1]]
    # ---- health flags: only when something happened
    if raw[12] > 0:
        out["otelgpu.gpu.throttled_fraction"] = raw[12]
        if n > 1:
            out["otelgpu.gpu.throttled.ids"] = [uuids[i] for i in raw[17]]
    if raw[13]:
        out["otelgpu.gpu.throttle_reasons"] = list(names(raw[13]))
    if raw[14]:
        out["otelgpu.gpu.ecc.uncorrected"] = int(raw[14])
    if raw[16]:
        out["otelgpu.gpu.lost"] = True
        if n > 1:
            out["otelgpu.gpu.lost.ids"] = [uuids[i] for i in raw[16]]
    if raw[18]:
        out["otelgpu.gpu.xids"] = list(raw[18])
    return out
