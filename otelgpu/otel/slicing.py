"""Background work in short slices: hand the GIL back to the host's threads regularly.

A Python thread keeps the GIL until it blocks or, when another thread asks for it, until
the interpreter's switch interval (5 ms) runs out -- and a C call never gives it up. So
otelgpu's background threads (export, collection, deferred work) cut long work into
slices and, after every ``SLICE_S`` of it (the thread's CPU time: a thread preempted by a
loaded machine does not pause more often for it; the wall clock is read first, the
thread's CPU clock only once a wall slice passed), :func:`pause`: a real sleep of ``YIELD_S``,
long enough for a waiting application thread to wake up and take the GIL
(``time.sleep(0)`` returns before a woken thread is scheduled, and the sleeper usually
takes the GIL straight back).

The first sleep of each hand-back is ``YIELD_S`` plus a random extra of up to ``JITTER_S``.
Without it, a host that never releases the GIL and runs in a regular rhythm (requests of
1 ms, 1 ms apart) phase-locks with a background thread: the thread gets the GIL back one
switch interval after it asked (a fixed 5 ms), a slice that straddles the end of one of the
host's requests delays the host's whole timeline to the slice's end, and five host phases
later the next slice lands at the same point before a request's end -- every slice of an
export then lengthened a request (8 GPUs at 500 requests/s: p99 +~450 µs). The random
start spreads the slices over the host's phases, where most land inside a request's work
and lengthen nothing (p99 1.55 -> 1.22-1.31 ms in the same run).

On a loaded machine ``YIELD_S`` is not always enough: the host thread, woken when the
GIL was released, may still be waiting for a CPU when the sleep ends, and the background
thread (or another of otelgpu's) takes the GIL back before the host ran at all -- then
the host waits for the next slice, or for the switch interval. So :func:`pause` watches
the host (the main thread) on Linux: it keeps sleeping, ``YIELD_S`` at a time and at most
``MAX_WAIT_S`` in all, while the main thread is runnable (state ``R`` in
``/proc/self/task/<tid>/stat``, i.e. running or woken and waiting for a CPU) and its CPU
clock (``pthread_getcpuclockid``) has not yet moved ``HOST_TURN_S`` past the latest
hand-back of *any* of otelgpu's threads. That is the host's turn: when one thread hands the
GIL back, another of otelgpu's threads waiting for the GIL (the scrape, the metric reader,
the span exporter) may get it instead of the host, and a busy host then waited for two or
three slices in a row at one switch (2-3 ms gaps in a 100 µs step while Prometheus
scraped 8 GPUs); now such a thread finds the host's turn not run and sleeps again at once.
A main thread that is blocked (sleeping, waiting on I/O or a GPU) is not waited for. Only
otelgpu's own threads sleep; nothing in the interpreter (switch interval) or the host
changes.

During :func:`draining` (otelgpu's shutdown: the host is waiting for the final flush, which
``shutdown_timeout_ms`` bounds) :func:`pause` hands nothing back: paced, a final collection
of many series spends about twice its CPU time asleep and can miss that bound. The
interpreter's switch interval still lets any other thread in.

On otelgpu's own threads, every slice also starts between the host's requests or steps
when it can (``otelgpu.otel.host_work``), and keeps clear of the next boundary of steps
that come back to back at a steady period (``otelgpu.otel.host_cadence``): after a
hand-back, and when a piece of work begins (:func:`starting`, :class:`Slicer`).

Thread safety: a :class:`Slicer` belongs to one thread (one piece of work); :func:`tick`
keeps its slice per thread; :func:`pause` may be called from any thread.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator

from otelgpu.otel import host_cadence, host_work

#: Longest stretch of background work between two GIL hand-backs (seconds).
SLICE_S = 0.0003
#: How long a background thread sleeps to hand the GIL back (seconds).
YIELD_S = 0.0001
#: Longest one :func:`pause` waits for a runnable host thread to get a CPU (seconds).
MAX_WAIT_S = 0.002
#: Largest random extra of a hand-back's first sleep (seconds; module docstring).
JITTER_S = 0.001
#: The host's CPU time between the latest hand-back of any of otelgpu's threads and the
#: next slice of any of them (seconds; module docstring).
HOST_TURN_S = 0.0005
_HOST_TURN_NS = int(HOST_TURN_S * 1e9)
#: The host's CPU clock (ns) at the latest hand-back of any of otelgpu's threads. Written
#: without a lock: a lost update only moves one turn's start.
_handed_at = 0


class _Host:
    """The main thread's CPU clock and scheduler state (Linux), for one process."""

    __slots__ = ("clock", "fd", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        main = threading.main_thread()
        self.clock = time.pthread_getcpuclockid(main.ident or 0)
        self.fd = os.open(f"/proc/self/task/{main.native_id}/stat", os.O_RDONLY)

    def cpu_ns(self) -> int:
        return time.clock_gettime_ns(self.clock)

    def runnable(self) -> bool:
        """Whether the main thread is running or waiting for a CPU (not blocked)."""
        stat = os.pread(self.fd, 512, 0)
        # "tid (comm) S ...": the state follows the last ')' (comm may contain one).
        end = stat.rfind(b")")
        return stat[end + 2 : end + 3] == b"R"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_host: _Host | None = None
_host_lock = threading.Lock()
_no_host = False


def _current_host() -> _Host | None:
    """The :class:`_Host` of this process (rebuilt after a fork), ``None`` where the
    platform cannot tell (then :func:`pause` is a plain sleep)."""
    global _host, _no_host
    host = _host
    if host is not None and host.pid == os.getpid():
        return host
    if _no_host:
        return None
    with _host_lock:
        if _host is not None and _host.pid == os.getpid():
            return _host
        if _host is not None:
            _host.close()  # inherited from the parent: another main thread
            _host = None
        try:
            _host = _Host()
        except (AttributeError, OSError):  # not Linux, or no /proc
            _no_host = True
            return None
        return _host


_sleep = time.sleep  # a module attribute: tests count the sleeps

_draining = 0  # open draining() blocks, all threads
_draining_lock = threading.Lock()


@contextlib.contextmanager
def draining() -> Iterator[None]:
    """While open (any thread), :func:`pause` returns at once: for a flush the host waits
    for. Nests; process-wide."""
    global _draining
    with _draining_lock:
        _draining += 1
    try:
        yield
    finally:
        with _draining_lock:
            _draining -= 1


_local = threading.local()
_INF = float("inf")


def pause() -> None:
    """Hand the GIL over: a waiting host thread runs before the caller goes on (bounded
    by ``MAX_WAIT_S``; see the module docstring). The calling thread's :func:`tick`
    slice starts again afterwards."""
    try:
        if not _draining:
            _hand_over()
            starting()
    finally:
        now = time.perf_counter()
        _local.cut_at = cut_at = now + host_cadence.cut_in_s()
        _local.end = min(now + SLICE_S, cut_at)
        _local.cpu = time.thread_time()


_jitter = random.Random().random  # its own generator: the application's seed stays its own


def _hand_over() -> None:
    global _handed_at
    if threading.current_thread() is threading.main_thread():
        _sleep(YIELD_S)
        return
    host = _current_host()
    first = YIELD_S + _jitter() * JITTER_S
    if host is None:
        _sleep(first)
        return
    try:
        _handed_at = host.cpu_ns()
        deadline = time.perf_counter() + first + MAX_WAIT_S
        _sleep(first)
        ran = host.cpu_ns()
        if ran - _handed_at >= _HOST_TURN_NS or not host.runnable():
            return
        # Runnable and its turn not yet run: poll its clock (cheap; /proc is ~10 µs), and
        # its state only when the clock stood still over a sleep (it may have blocked).
        while time.perf_counter() < deadline:
            _sleep(YIELD_S)
            before, ran = ran, host.cpu_ns()
            if ran - _handed_at >= _HOST_TURN_NS or (ran == before and not host.runnable()):
                return
    except OSError:  # the main thread ended (interpreter exit): nothing to wait for
        _sleep(YIELD_S)


def starting(expected_s: float = SLICE_S) -> None:
    """Before a slice of about ``expected_s`` seconds on otelgpu's own threads: wait for a
    gap between the host's requests or steps (``otelgpu.otel.host_work``, watching the main
    thread's CPU clock where known), then keep clear of the host's next step boundary
    (``otelgpu.otel.host_cadence``). No-op on other threads and while :func:`draining`."""
    if _draining or not host_work.is_background():
        return
    if host_work.open_count():
        host = _current_host()
        host_work.wait_for_gap(host.cpu_ns if host is not None else None)
    host_cadence.keep_clear(expected_s)


def tick() -> None:
    """:meth:`Slicer.tick` for the calling thread's current work (thread-local slice):
    for code that runs in many small calls, such as metric callbacks."""
    now = time.perf_counter()
    if now > getattr(_local, "end", 0.0):
        used = time.thread_time() - getattr(_local, "cpu", 0.0)
        cut_at = getattr(_local, "cut_at", _INF)
        if used >= SLICE_S or now >= cut_at:
            pause()
        else:  # preempted meanwhile (a loaded machine): the slice is not used up yet
            _local.end = min(now + SLICE_S - used, cut_at)


class Slicer:
    """Calls :func:`pause` from :meth:`tick` once the thread ran ``slice_s`` (its CPU
    time) since the last pause."""

    __slots__ = ("_clock", "_cpu", "_cut_at", "_end", "_slice_s", "pauses")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        starting(slice_s)  # a piece of work starts between the host's requests
        self._clock = time.perf_counter
        self._slice_s = slice_s
        self._begin()
        #: How many times :meth:`tick` paused.
        self.pauses = 0

    def _begin(self) -> None:
        now = self._clock()
        # a slice ends when its CPU budget is used up, or before the host's next step
        # boundary however little it used (otelgpu.otel.host_cadence)
        self._cut_at = cut_at = now + host_cadence.cut_in_s()
        self._end = min(now + self._slice_s, cut_at)
        self._cpu = time.thread_time()

    def tick(self) -> None:
        """Pause if this slice is used up, or at the host's next step boundary (cheap
        otherwise: one clock read)."""
        now = self._clock()
        if now > self._end:
            used = time.thread_time() - self._cpu
            if used < self._slice_s and now < self._cut_at:  # preempted: not used up
                self._end = min(now + self._slice_s - used, self._cut_at)
                return
            pause()
            self.pauses += 1
            self._begin()
