"""Energy is the integral of power; the library is thread-safe under 8 callers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pynvml as n
import pytest

from otelgpu import sim

Activate = Callable[..., sim.SimGpu]


def test_energy_equals_integral_of_power_virtual(sim_scenario: Activate) -> None:
    """120 s of bursty inference load: the energy counter's delta equals the integral of
    the reported power (10 ms Riemann sum) and the integral computed from the TOML."""
    gpu = sim_scenario("inference-bursty")
    dev = gpu.scenario.devices[0]
    idle, peak_w = dev["idle_power_w"], dev["max_power_w"]
    p = gpu.scenario.raw["gpus"]["utilization"]
    n.nvmlInit()
    try:
        h = n.nvmlDeviceGetHandleByIndex(0)
        e0 = n.nvmlDeviceGetTotalEnergyConsumption(h)
        dt, steps = 0.01, 12_000
        sampled_mj = 0.0
        for i in range(steps):
            gpu.set_time(i * dt + dt / 2)  # midpoint of each 10 ms slice
            sampled_mj += n.nvmlDeviceGetPowerUsage(h) * dt
        gpu.set_time(steps * dt)
        e1 = n.nvmlDeviceGetTotalEnergyConsumption(h)
    finally:
        n.nvmlShutdown()
    # independent formulation from the TOML: per period, a burst at peak, base otherwise
    period, burst = p["period_s"], p["burst_s"]
    periods = steps * dt / period
    mean_util = (p["peak"] * burst + p["base"] * (period - burst)) / period
    analytic_mj = (idle + (peak_w - idle) * mean_util / 100) * periods * period * 1000
    assert e1 - e0 == pytest.approx(sampled_mj, rel=0.01)
    assert e1 - e0 == pytest.approx(analytic_mj, rel=0.01)


def test_energy_equals_integral_of_power_wall_clock(sim_scenario: Activate) -> None:
    gpu = sim_scenario(
        {
            "version": 1,
            "gpus": {
                "count": 1,
                "model": "L4",
                "utilization": 60,
                "idle_power_w": 20,
                "max_power_w": 70,
            },
        },
        clock="wall",
    )
    n.nvmlInit()
    try:
        h = n.nvmlDeviceGetHandleByIndex(0)
        t0, e0 = gpu.now_ns(), n.nvmlDeviceGetTotalEnergyConsumption(h)
        time.sleep(1.0)
        t1, e1 = gpu.now_ns(), n.nvmlDeviceGetTotalEnergyConsumption(h)
        power_mw = n.nvmlDeviceGetPowerUsage(h)
    finally:
        n.nvmlShutdown()
    assert power_mw == (20 + 50 * 0.6) * 1000
    assert e1 - e0 == pytest.approx(power_mw * (t1 - t0) / 1e9, rel=0.01)
    assert gpu.now_s() > 1.0  # wall clock advances on its own


def test_thread_safety_eight_callers(sim_gpu: sim.SimGpu) -> None:
    """8 threads hammer the library while a 9th moves the virtual clock: no errors,
    only values the scenario allows, monotonic counters, every call accounted for."""
    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    allowed_util = {80, 20}  # fixtures.sim.SMALL_SCENARIO square wave
    dev = sim_gpu.scenario.devices[0]
    allowed_power = {
        round((dev["idle_power_w"] + (dev["max_power_w"] - dev["idle_power_w"]) * u / 100) * 1000)
        for u in allowed_util
    }
    iterations, calls_per_iteration = 300, 4
    errors: list[BaseException] = []
    stop = threading.Event()
    start_calls = sim_gpu.calls()

    def worker(k: int) -> None:
        last_energy = [0, 0]
        try:
            for i in range(iterations):
                g = (k + i) % 2
                h = handles[g]
                util = n.nvmlDeviceGetUtilizationRates(h).gpu
                power = n.nvmlDeviceGetPowerUsage(h)
                energy = n.nvmlDeviceGetTotalEnergyConsumption(h)
                (field,) = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
                assert util in allowed_util, util
                assert power in allowed_power, power
                assert energy >= last_energy[g]
                assert field.value.ullVal >= energy
                last_energy[g] = field.value.ullVal
        except BaseException as exc:
            errors.append(exc)

    def clock() -> None:
        while not stop.is_set():
            sim_gpu.advance(0.05)

    ticker = threading.Thread(target=clock)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    ticker.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    ticker.join(5)
    n.nvmlShutdown()
    assert errors == []
    assert not any(t.is_alive() for t in threads)
    # every call was served exactly once (the clock thread makes no NVML calls)
    assert sim_gpu.calls() - start_calls == 8 * iterations * calls_per_iteration


def test_fork_while_threads_call(sim_gpu: sim.SimGpu) -> None:
    """A child forked while other threads are inside the library is not deadlocked."""
    import os

    n.nvmlInit()
    stop = threading.Event()
    h = n.nvmlDeviceGetHandleByIndex(0)

    def spin() -> None:
        while not stop.is_set():
            n.nvmlDeviceGetTotalEnergyConsumption(h)

    threads = [threading.Thread(target=spin) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:  # child: NVML still answers
                try:
                    n.nvmlDeviceGetPowerUsage(n.nvmlDeviceGetHandleByIndex(1))
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        n.nvmlShutdown()
