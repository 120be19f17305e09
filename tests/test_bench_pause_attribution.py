"""The pause benchmark's attribution of a step's lost time (``benchmarks/bench_export.py``):
time the OS gave the host's CPU to another program is not charged to the instrumentation,
time the host waited for the GIL held by one of the process's own threads always is."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_export.py"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread context switch counts are Linux's"
)


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_export_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spin_step(bench: ModuleType, seconds: float) -> float:
    """One busy step measured the way the pause worker measures it; returns the seconds
    attributed to other programs."""
    u0, th0, pr0 = bench._switches(), time.thread_time_ns(), time.process_time_ns()
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        pass
    wall = time.perf_counter() - t0
    u1, th1, pr1 = bench._switches(), time.thread_time_ns(), time.process_time_ns()
    return float(
        bench.outside_preemption(
            wall,
            host_cpu_s=(th1 - th0) / 1e9,
            others_cpu_s=((pr1 - pr0) - (th1 - th0)) / 1e9,
            preempted=u1[0] - u0[0],
            waited=u1[1] - u0[1],
        )
    )


def test_another_program_on_the_hosts_cpu_is_not_charged() -> None:
    bench = _bench()
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    # Another program busy on the same (only) CPU: the OS shares it with the host thread.
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)  # the hog is running
        outside = _spin_step(bench, 0.2)
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    # The CFS shares the CPU between two busy tasks: the host lost a large part of the
    # step, all of it to the other program.
    assert outside > 0.02


def test_waiting_for_the_gil_of_an_own_thread_is_charged() -> None:
    bench = _bench()
    stop = threading.Event()

    def python_loop() -> None:  # one of the process's own threads, running Python
        while not stop.is_set():
            pass

    thread = threading.Thread(target=python_loop)
    thread.start()
    try:
        outside = _spin_step(bench, 0.1)  # the two threads take turns with the GIL
    finally:
        stop.set()
        thread.join()
    assert outside == 0.0


def test_a_quiet_step_has_nothing_outside() -> None:
    bench = _bench()
    assert (
        bench.outside_preemption(1e-3, host_cpu_s=1e-3, others_cpu_s=0.0, preempted=0, waited=0)
        == 0.0
    )
    # Preempted without waiting, but the process's own threads used all the time off CPU.
    assert (
        bench.outside_preemption(4e-3, host_cpu_s=1e-3, others_cpu_s=3e-3, preempted=1, waited=0)
        == 0.0
    )
    assert bench.outside_preemption(
        4e-3, host_cpu_s=1e-3, others_cpu_s=1e-3, preempted=1, waited=0
    ) == pytest.approx(2e-3)


def test_a_row_leaves_out_only_the_steps_other_programs_took() -> None:
    bench = _bench()
    run = {
        "walls_us": [100.0, 4200.0, 130.0, 900.0],
        "gaps_us": [20.0, 4100.0, 25.0, 800.0],
        # step 1: 4 ms to a kernel thread; step 3: a long step of otelgpu's own (a GIL wait)
        "outside_us": [0.0, 4050.0, 60.0, 0.0],
    }
    walls, gaps = bench.own_steps(run)
    assert walls == [100.0, 130.0, 900.0]
    assert gaps == [20.0, 25.0, 800.0]
    assert bench._preemptions(run) == "1 (4050)"
    # A run measured without the attribution keeps every step.
    assert bench.own_steps({"walls_us": [1.0, 2.0], "gaps_us": [0.5, 0.5]}) == (
        [1.0, 2.0],
        [0.5, 0.5],
    )
