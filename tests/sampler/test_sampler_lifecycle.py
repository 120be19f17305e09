"""start/stop cycles, bounded stop, the achieved rate, the clock, configuration errors
and fork safety (a real fork() with a sampler running in the parent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from otelgpu import sim
from otelgpu.errors import ConfigurationError
from otelgpu.sampler import BaseGpuSampler


def _samples(sampler: BaseGpuSampler) -> int:
    return sampler.stats().samples


def _otelgpu_threads_since(before: set[threading.Thread]) -> list[str]:
    """otelgpu threads started after ``before`` was taken and still running: this test's
    sampler's (an earlier test's export or shutdown thread, left to finish on its own,
    is not this sampler's)."""
    return [
        t.name for t in threading.enumerate() if t not in before and t.name.startswith("otelgpu-")
    ]


def test_start_stop_cycles(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    before = set(threading.enumerate())
    sampler = make_sampler(interval_s=0.01)
    assert sampler.stop() is True  # never started: a no-op
    seen = 0
    for _ in range(3):
        sampler.start()
        sampler.start()  # idempotent
        assert sampler.running
        time.sleep(0.1)
        began = time.monotonic()
        assert sampler.stop(timeout_s=2.0)
        assert time.monotonic() - began < 0.5
        assert not sampler.running
        assert sampler.stop() is True
        now = _samples(sampler)
        assert now > seen
        seen = now
        time.sleep(0.03)
        assert _samples(sampler) == seen  # nothing sampled while stopped
    assert _otelgpu_threads_since(before) == []


def test_close_and_reopen(sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]) -> None:
    refs = sim_gpu.nvml_refcount()
    with make_sampler(interval_s=0.02) as sampler:
        assert sampler.running
        assert sim_gpu.nvml_refcount() > refs
    assert not sampler.running
    assert sim_gpu.nvml_refcount() == refs  # every nvmlInit was balanced
    sampler.start()
    time.sleep(0.05)
    assert sampler.running and sampler.latest(sampler.devices[0].uuid) is not None


def test_keeps_its_rate(sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]) -> None:
    interval_s = 0.02
    sampler = make_sampler(interval_s=interval_s)
    began = time.monotonic()
    sampler.start()
    time.sleep(1.0)
    sampler.stop()
    # The rounds due while it ran, from the time it really ran: a loaded machine may wake
    # this thread from its sleep well after the second.
    asked = (time.monotonic() - began) / interval_s
    stats = sampler.stats()
    # Never ahead of its schedule (the first round is taken at once)...
    assert stats.ticks <= asked + 1
    # ...and most rounds taken; allow for a loaded 2-core machine.
    assert stats.ticks >= 0.7 * asked
    # stop() may cut the last round anywhere, even before its first device: that round is
    # counted as a tick with 0 or 1 of its 2 samples.
    assert 2 * (stats.ticks - 1) <= stats.samples <= 2 * stats.ticks
    assert 0 < stats.busy_s < 1.0


def test_timestamps_follow_the_monotonic_clock(
    sim_gpu: sim.SimGpu,
    make_sampler: Callable[..., BaseGpuSampler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = time.time_ns()
    sampler = make_sampler()
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + 3600 * 10**9)  # a jump
    sampler.sample_once()
    monkeypatch.undo()
    after = time.time_ns()
    s = sampler.latest(sampler.devices[0].uuid)
    assert s is not None and before <= s.time_ns <= after
    assert before <= sampler.now_ns() <= time.time_ns() + 1


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": -1}, "interval_s"),
        ({"interval_s": float("nan")}, "interval_s"),
        ({"interval_s": "fast"}, "interval_s"),
        ({"interval_s": 0.1, "history_s": 0.01}, "history_s"),
        ({"interval_s": 0.001, "history_s": 1e9}, "history_s"),
        ({"event_capacity": 3}, "event_capacity"),
        ({"nvml_library": "/nonexistent/libnvidia-ml.so.1"}, "nvml_library"),
    ],
)
def test_bad_configuration_fails_fast(
    sampler_cls: type[BaseGpuSampler], kwargs: dict[str, object], setting: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        sampler_cls(**kwargs)  # type: ignore[arg-type]
    assert info.value.setting == setting
    assert setting in str(info.value)


def test_bad_library_env_var_fails_fast(
    sampler_cls: type[BaseGpuSampler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTELGPU_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    with pytest.raises(ConfigurationError) as info:
        sampler_cls()
    assert info.value.setting == "OTELGPU_NVML_LIBRARY"


def test_pid_change_resets_the_sampler(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """A fork that bypassed os.register_at_fork is caught by the PID check."""
    sampler = make_sampler()
    sampler.sample_once()
    uuid = sampler.devices[0].uuid
    assert sampler.latest(uuid) is not None
    sampler._pid = -1  # as if this process were a forked child
    assert sampler.latest(uuid) is None
    assert sampler.stats().samples == 0
    sampler.sample_once()  # starts afresh, re-initialising NVML
    assert sampler.latest(uuid) is not None


FORK_SCRIPT = r"""
import json, os, sys, threading, time
from otelgpu import sim
from otelgpu.sampler import NativeGpuSampler, PyGpuSampler

sim.activate(json.loads(sys.argv[2]), clock="wall")
cls = PyGpuSampler if sys.argv[1] == "py" else NativeGpuSampler
sampler = cls(interval_s=0.01)
sampler.start()
uuid = sampler.devices[0].uuid
while sampler.stats().samples < 4:
    time.sleep(0.01)
parent_samples = sampler.stats().samples
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = {
        "running": sampler.running,
        "samples": sampler.stats().samples,
        "latest": sampler.latest(uuid) is not None,
        "events": len(sampler.events(0, 2**62)),
        "threads": [t.name for t in threading.enumerate()],
    }
    sampler.sample_once()
    out["child_sampled"] = sampler.stats().samples
    sampler.start()
    time.sleep(0.1)
    out["child_running"] = sampler.running
    sampler.close()
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 65536))
time.sleep(0.1)
child["parent_running"] = sampler.running
child["parent_grew"] = sampler.stats().samples > parent_samples
child["status"] = status
sampler.close()
print(json.dumps(child))
"""


def test_forked_child_inherits_no_running_sampler(sampler_cls: type[BaseGpuSampler]) -> None:
    from fixtures.sim import SMALL_SCENARIO

    twin = "py" if sampler_cls.implementation == "python" else "native"
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, twin, json.dumps(SMALL_SCENARIO)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == 0
    # The child starts with a stopped, empty sampler and no sampler threads...
    assert out["running"] is False
    assert out["samples"] == 0 and out["latest"] is False and out["events"] == 0
    assert not any(name.startswith("otelgpu-") for name in out["threads"])
    # ...that it may use afresh (NVML re-initialised in the child).
    assert out["child_sampled"] == 2
    assert out["child_running"] is True
    # The parent kept sampling.
    assert out["parent_running"] is True and out["parent_grew"] is True


def test_a_dropped_sampler_stops_its_threads(
    sim_gpu: sim.SimGpu, sampler_cls: type[BaseGpuSampler]
) -> None:
    import gc

    refs = sim_gpu.nvml_refcount()
    before = set(threading.enumerate())
    sampler = sampler_cls(interval_s=0.01)
    sampler.start()
    assert _otelgpu_threads_since(before)
    del sampler
    gc.collect()
    deadline = time.monotonic() + 3
    while left := _otelgpu_threads_since(before):
        assert time.monotonic() < deadline, f"sampler threads outlived their sampler: {left}"
        time.sleep(0.01)
    assert sim_gpu.nvml_refcount() == refs
